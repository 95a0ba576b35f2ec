"""Knowledge-graph embedding (DistMult): train, evaluate (filtered-free MRR against sampled tails), checkpoint,
resume.

A shallow model: the entity table is a ``dgl_oac.NodeEmbedding`` (the part too big for a GPU), relations are a
small dense ``nn.Embedding``. Batches come from ``dgl_oac.dgl_frontend.sampling.edge.EdgeBatchSampler``, a zero-layer
edge sampler with DGL's ``Sampler`` interface: ``(input_nodes, pair_graph, neg_pair_graph, [])``, the entity
rows on ``pair_graph.ndata["ent"]``. The data is dgl-oac's synthetic KG (nothing is downloaded); pass
``--dataset FB15k-237`` to read ../shared/data.

    python examples/kg_embedding.py --epochs 3 --ckpt run.ckpt
    python examples/kg_embedding.py --epochs 5 --ckpt run.ckpt --resume
"""
import argparse
import hashlib
import json
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

import dgl_oac
from dgl_oac.checkpoint import load_checkpoint, save_checkpoint
from dgl_oac.app.data import generate_synthetic, load
from dgl_oac.dgl_frontend.sampling.edge import EdgeBatchSampler


def distmult(head: torch.Tensor, rel: torch.Tensor, tail: torch.Tensor) -> torch.Tensor:
    return (head * rel * tail).sum(-1)


@torch.no_grad()
def mrr(emb, rel_emb, triples: torch.Tensor, candidates: int = 200, seed: int = 1) -> float:
    """MRR of each true tail among ``candidates`` random entities (the same for every run)."""
    gen = torch.Generator().manual_seed(seed)
    neg = torch.randint(0, emb.num_embeddings, (len(triples), candidates), generator=gen)
    h, r = emb(triples[:, 0]), rel_emb(triples[:, 1])  # no_grad reads: plain tensors, nothing recorded
    pos = distmult(h, r, emb(triples[:, 2]))
    negs = distmult(h.unsqueeze(1), r.unsqueeze(1), emb(neg.reshape(-1)).view(len(triples), candidates, -1))
    return float((1.0 / (1 + (negs >= pos.unsqueeze(1)).sum(1))).mean())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dataset", default="synthetic")
    p.add_argument("--num-nodes", type=int, default=20_000, help="entities of the synthetic KG")
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--mode", default="oac", choices=["sync", "async", "oac"])
    p.add_argument("--ckpt", type=Path, help="checkpoint file, written after every epoch")
    p.add_argument("--resume", action="store_true", help="continue from --ckpt")
    args = p.parse_args()

    data = generate_synthetic(num_nodes=args.num_nodes, num_relations=8, task="kg", seed=0) \
        if args.dataset == "synthetic" else load(args.dataset)
    torch.manual_seed(0)
    emb = dgl_oac.NodeEmbedding(data.num_entities, args.dim, "ent", init_func=lambda t: t.uniform_(-0.1, 0.1))
    rel_emb = nn.Embedding(data.num_relations, args.dim)
    sparse_opt = dgl_oac.SparseAdagrad([emb], lr=0.1)
    dense_opt = torch.optim.Adagrad(rel_emb.parameters(), lr=0.1)
    sampler = EdgeBatchSampler(num_negatives=64)  # negatives shared by the batch
    loader = dgl_oac.DataLoader(data.graph, torch.arange(data.graph.num_edges()), sampler, embeddings=[emb],
                                mode=args.mode, batch_size=1024, shuffle=True, seed=0)
    parts = dict(embeddings=[emb], sparse_opt=sparse_opt, dense_modules={"rel": rel_emb},
                 dense_optimizers={"dense": dense_opt}, loader=loader)
    start = 0
    if args.resume:
        start = load_checkpoint(args.ckpt, **parts)["epoch"] + 1

    for epoch in range(start, args.epochs):
        for input_nodes, pair_graph, neg_pair_graph, _ in loader:
            x = pair_graph.ndata["ent"]  # the batch's entity rows (compacted ids)
            src, dst = pair_graph.edges()
            rel = rel_emb(pair_graph.edata["etype"])
            nsrc, ndst = neg_pair_graph.edges()
            pos = distmult(x.index_select(0, src), rel, x.index_select(0, dst))
            neg = distmult(x.index_select(0, nsrc), rel_emb(neg_pair_graph.edata["etype"]), x.index_select(0, ndst))
            loss = -F.logsigmoid(pos).mean() - F.logsigmoid(-neg).mean()
            dense_opt.zero_grad()
            loss.backward()
            dense_opt.step()
            sparse_opt.step()  # commits this batch's rows
        val = mrr(emb, rel_emb, data.valid)
        print(f"epoch {epoch}: loss {loss.item():.4f}, valid MRR (sampled tails) {val:.4f}")
        if args.ckpt:
            save_checkpoint(args.ckpt, extra={"epoch": epoch}, **parts)

    test = mrr(emb, rel_emb, data.test, seed=2)
    digest = hashlib.sha256(emb.weight.numpy().tobytes()).hexdigest()[:16]
    print(json.dumps({"test_mrr": round(test, 4), "table_sha256": digest, "stats": loader.stats.as_dict()}))


if __name__ == "__main__":
    main()
