"""Link prediction with learnable embeddings: train, evaluate (MRR), checkpoint, resume.

DGL's edge-prediction loop with the imports changed (``dgl_oac.NodeEmbedding``, ``dgl_oac.SparseAdam``,
``dgl_oac.DataLoader``) over ``dgl.dataloading.as_edge_prediction_sampler``. The graph is dgl-oac's synthetic
power-law graph with held-out edges and 100 negative tails per held-out edge (nothing is downloaded).

    python examples/link_prediction.py --epochs 3 --ckpt run.ckpt
    python examples/link_prediction.py --epochs 5 --ckpt run.ckpt --resume

A resumed run ends with the same table, bit for bit, as an uninterrupted one (``table sha256`` below).
"""
import argparse
import hashlib
import json
from pathlib import Path

import dgl
import torch
import torch.nn.functional as F

import dgl_oac
from dgl_oac.checkpoint import load_checkpoint, save_checkpoint
from dgl_oac.app.data import generate_synthetic
from dgl_oac.app.models import SAGE  # 2 SAGEConv layers, ReLU between: any DGL block model works


def score(pair_graph, h):
    """Dot product of the two end nodes of every edge of ``pair_graph``: float32[E].

    ``index_select`` rather than ``h[src]``: the backward of advanced indexing accumulates rows on several
    threads in a varying order on CPU, so two runs (and sync vs oac) would differ in the last bits."""
    src, dst = pair_graph.edges()
    return (h.index_select(0, src) * h.index_select(0, dst)).sum(1)


@torch.no_grad()
def mrr(model, emb, graph, pos, neg_tails) -> float:
    """Mean reciprocal rank of each positive ``(u, v)`` among its negatives ``(u, t)``, full neighbourhoods."""
    model.eval()
    full = dgl.dataloading.MultiLayerFullNeighborSampler(len(model.layers))
    h = torch.empty(graph.num_nodes(), emb.embedding_dim)
    for input_nodes, output_nodes, blocks in dgl.dataloading.DataLoader(graph, torch.arange(graph.num_nodes()),
                                                                        full, batch_size=4096):
        h[output_nodes] = model(blocks, emb(input_nodes))  # no_grad reads: plain tensors, nothing recorded
    model.train()
    pos_score = (h[pos[:, 0]] * h[pos[:, 1]]).sum(1, keepdim=True)
    neg_score = (h[pos[:, 0]].unsqueeze(1) * h[neg_tails]).sum(2)
    rank = 1 + (neg_score >= pos_score).sum(1)
    return float((1.0 / rank).mean())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--num-nodes", type=int, default=20_000)
    p.add_argument("--dim", type=int, default=32)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--mode", default="oac", choices=["sync", "async", "oac"])
    p.add_argument("--ckpt", type=Path, help="checkpoint file, written after every epoch")
    p.add_argument("--resume", action="store_true", help="continue from --ckpt")
    args = p.parse_args()

    data = generate_synthetic(num_nodes=args.num_nodes, task="link", seed=0)
    graph = data.graph  # the training edges, both directions
    torch.manual_seed(0)
    emb = dgl_oac.NodeEmbedding(graph.num_nodes(), args.dim, "emb", init_func=lambda t: t.normal_(std=0.1))
    model = SAGE(args.dim, args.dim, args.dim)
    sparse_opt = dgl_oac.SparseAdam([emb], lr=0.02)
    dense_opt = torch.optim.Adam(model.parameters(), lr=0.005)
    sampler = dgl.dataloading.as_edge_prediction_sampler(
        dgl.dataloading.NeighborSampler([10, 5]), negative_sampler=dgl.dataloading.negative_sampler.Uniform(4))
    loader = dgl_oac.DataLoader(graph, torch.arange(graph.num_edges()), sampler, embeddings=[emb],
                                mode=args.mode, batch_size=1024, shuffle=True, seed=0)
    parts = dict(embeddings=[emb], sparse_opt=sparse_opt, dense_modules={"model": model},
                 dense_optimizers={"dense": dense_opt}, loader=loader)
    start = 0
    if args.resume:
        start = load_checkpoint(args.ckpt, **parts)["epoch"] + 1

    for epoch in range(start, args.epochs):
        for input_nodes, pair_graph, neg_pair_graph, blocks in loader:
            h = model(blocks, emb(input_nodes))
            pos, neg = score(pair_graph, h), score(neg_pair_graph, h)
            loss = F.binary_cross_entropy_with_logits(torch.cat([pos, neg]),
                                                      torch.cat([torch.ones_like(pos), torch.zeros_like(neg)]))
            dense_opt.zero_grad()
            loss.backward()
            dense_opt.step()
            sparse_opt.step()  # commits this batch's rows
        val = mrr(model, emb, graph, data.valid_edges, data.valid_neg)
        print(f"epoch {epoch}: loss {loss.item():.4f}, valid MRR {val:.4f}")
        if args.ckpt:
            save_checkpoint(args.ckpt, extra={"epoch": epoch}, **parts)

    test = mrr(model, emb, graph, data.test_edges, data.test_neg)
    digest = hashlib.sha256(emb.weight.numpy().tobytes()).hexdigest()[:16]
    print(json.dumps({"test_mrr": round(test, 4), "table_sha256": digest, "stats": loader.stats.as_dict()}))


if __name__ == "__main__":
    main()
