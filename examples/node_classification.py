"""Node classification with learnable embeddings: train, evaluate, checkpoint, resume.

A DGL script with the imports changed: ``dgl_oac.NodeEmbedding``, ``dgl_oac.SparseAdam`` and
``dgl_oac.DataLoader`` in place of ``dgl.nn.NodeEmbedding``, ``dgl.optim.SparseAdam`` and
``dgl.dataloading.DataLoader``; the loop is DGL's. The graph is dgl-oac's synthetic power-law graph with
planted classes (nothing is downloaded).

    python examples/node_classification.py --epochs 3 --ckpt run.ckpt          # train, checkpoint each epoch
    python examples/node_classification.py --epochs 5 --ckpt run.ckpt --resume # go on from the checkpoint

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


@torch.no_grad()
def accuracy(model, emb, graph, ids, labels) -> float:
    """Accuracy on ``ids`` over full neighbourhoods; rows read under no_grad are plain tensors (nothing is
    recorded for a step)."""
    full = dgl.dataloading.MultiLayerFullNeighborSampler(len(model.layers))
    model.eval()
    correct = 0
    for input_nodes, output_nodes, blocks in dgl.dataloading.DataLoader(graph, ids, full, batch_size=4096):
        correct += int((model(blocks, emb(input_nodes)).argmax(1) == labels[output_nodes]).sum())
    model.train()
    return correct / len(ids)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--num-nodes", type=int, default=20_000)
    p.add_argument("--dim", type=int, default=32)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--mode", default="oac", choices=["sync", "async", "oac"])
    p.add_argument("--ckpt", type=Path, help="checkpoint file, written after every epoch")
    p.add_argument("--resume", action="store_true", help="continue from --ckpt")
    args = p.parse_args()

    data = generate_synthetic(num_nodes=args.num_nodes, seed=0)
    graph, labels = data.graph, data.labels
    torch.manual_seed(0)
    emb = dgl_oac.NodeEmbedding(graph.num_nodes(), args.dim, "emb", init_func=lambda t: t.normal_(std=0.1))
    model = SAGE(args.dim, 32, data.num_classes)
    sparse_opt = dgl_oac.SparseAdam([emb], lr=0.05)
    dense_opt = torch.optim.Adam(model.parameters(), lr=0.01)
    sampler = dgl.dataloading.NeighborSampler([10, 5])
    loader = dgl_oac.DataLoader(graph, data.train_idx, sampler, embeddings=[emb], mode=args.mode,
                                batch_size=512, shuffle=True, seed=0)
    parts = dict(embeddings=[emb], sparse_opt=sparse_opt, dense_modules={"model": model},
                 dense_optimizers={"dense": dense_opt}, loader=loader)
    start = 0
    if args.resume:
        start = load_checkpoint(args.ckpt, **parts)["epoch"] + 1

    for epoch in range(start, args.epochs):
        for input_nodes, output_nodes, blocks in loader:
            x = emb(input_nodes)  # the batch's rows (also on blocks[0].srcdata["emb"])
            loss = F.cross_entropy(model(blocks, x), labels[output_nodes])
            dense_opt.zero_grad()
            loss.backward()
            dense_opt.step()
            sparse_opt.step()  # commits this batch's rows
        val = accuracy(model, emb, graph, data.valid_idx, labels)
        print(f"epoch {epoch}: loss {loss.item():.4f}, valid accuracy {val:.4f}")
        if args.ckpt:
            save_checkpoint(args.ckpt, extra={"epoch": epoch}, **parts)

    test = accuracy(model, emb, graph, data.test_idx, labels)
    digest = hashlib.sha256(emb.weight.numpy().tobytes()).hexdigest()[:16]
    print(json.dumps({"test_accuracy": round(test, 4), "table_sha256": digest, "stats": loader.stats.as_dict()}))


if __name__ == "__main__":
    main()
