"""Node classification with N trainers: the node_classification example under ``torchrun``.

What changes from one trainer is what changes in a DGL multi-process script: ``init_process_group`` first
(then every ``dgl_oac.NodeEmbedding`` is one table shared by the ranks, each row updated by its owner),
``use_ddp=True`` on the loader (each rank takes its block of the training nodes), ``DistributedDataParallel``
for the dense model. ``mode="oac"`` reads rows ahead and ends bitwise equal to ``mode="sync"``.

    torchrun --standalone --nproc_per_node=2 examples/multi_trainer.py --epochs 3
    torchrun --standalone --nproc_per_node=2 examples/multi_trainer.py --epochs 3 --mode sync  # same table

Rank 0 prints the result (``table_sha256``: a digest of the trained table).
"""
import argparse
import hashlib
import json

import dgl
import torch
import torch.distributed as dist
import torch.nn.functional as F

import dgl_oac
from dgl_oac.app.data import generate_synthetic
from dgl_oac.app.models import SAGE
# evaluation as in the one-trainer example; rank 0 evaluates alone (a no_grad read of the shared table needs no
# other rank)
from node_classification import accuracy


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--num-nodes", type=int, default=20_000)
    p.add_argument("--dim", type=int, default=32)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--mode", default="oac", choices=["sync", "oac"])
    args = p.parse_args()

    dist.init_process_group("gloo")  # torchrun's environment: rank, world size, rendezvous
    rank = dist.get_rank()
    data = generate_synthetic(num_nodes=args.num_nodes, seed=0)
    graph, labels = data.graph, data.labels
    torch.manual_seed(0)  # the same dense initialisation on every rank (DDP also broadcasts rank 0's)
    emb = dgl_oac.NodeEmbedding(graph.num_nodes(), args.dim, "emb", init_func=lambda t: t.normal_(std=0.1))
    model = torch.nn.parallel.DistributedDataParallel(SAGE(args.dim, 32, data.num_classes))
    sparse_opt = dgl_oac.SparseAdam([emb], lr=0.05)
    dense_opt = torch.optim.Adam(model.parameters(), lr=0.01)
    loader = dgl_oac.DataLoader(graph, data.train_idx, dgl.dataloading.NeighborSampler([10, 5]), embeddings=[emb],
                                mode=args.mode, batch_size=256, shuffle=True, seed=0, use_ddp=True)
    for epoch in range(args.epochs):
        for input_nodes, output_nodes, blocks in loader:
            loss = F.cross_entropy(model(blocks, emb(input_nodes)), labels[output_nodes])
            dense_opt.zero_grad()
            loss.backward()  # DDP averages the dense gradients
            dense_opt.step()
            sparse_opt.step()  # every rank, every batch: the rows' owners update them
        if rank == 0:
            val = accuracy(model.module, emb, graph, data.valid_idx, labels)
            print(f"epoch {epoch}: loss {loss.item():.4f}, valid accuracy {val:.4f}", flush=True)
        dist.barrier()  # the others wait while rank 0 evaluates (the table does not change meanwhile)
    if rank == 0:
        test = accuracy(model.module, emb, graph, data.test_idx, labels)
        digest = hashlib.sha256(emb.weight.numpy().tobytes()).hexdigest()[:16]
        print(json.dumps({"test_accuracy": round(test, 4), "table_sha256": digest, "stats": loader.stats.as_dict()}))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
