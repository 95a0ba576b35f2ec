"""Node classification on DGL's distributed graph (``dgl.distributed.DistGraph``) with dgl-oac embeddings.

One command partitions a synthetic graph, serves it with a ``DistGraphServer`` on this machine and trains
with N trainer processes (:func:`dgl_oac.dgl_frontend.distgraph.launch_local`). What changes from a DGL
DistGraph script: ``dgl_oac.NodeEmbedding`` + ``dgl_oac.SparseAdam`` for ``dgl.distributed.DistEmbedding`` +
``dgl.distributed.optim.SparseAdam``, and ``dgl_oac.DataLoader(g, ...)`` for
``dgl.dataloading.DistNodeDataLoader(g, ...)``. The servers sample; dgl-oac gathers, validates and commits the
rows, with ``mode="oac"`` reading them ahead.

    python examples/distgraph.py --epochs 3                # 1 server + 2 trainers, mode oac
    python examples/distgraph.py --epochs 3 --mode sync
    python examples/distgraph.py --parts 2 --partition-to parts   # the multi-machine recipe (README): partition,
    torchrun --nproc_per_node=2 examples/distgraph.py --ip-config ip_config.txt --part-config parts/synthetic.json
                                                           # start the servers, then the trainers

Rank 0 prints the result as JSON (the servers sample with their own RNG: two runs, even in one mode, differ).
The multi-machine recipe is in README ("Graphs larger than one machine"); ``train`` is what each trainer runs.
"""
import argparse
import hashlib
import json
import math
import os
import tempfile

import dgl
import torch
import torch.distributed as dist
import torch.nn.functional as F

import dgl_oac
from dgl_oac.app.data import generate_synthetic
from dgl_oac.dgl_frontend.distgraph import connect, launch_local, row_partition
from dgl_oac.app.models import SAGE


def partition(num_nodes: int, num_parts: int, out_dir: str) -> str:
    """Partition the synthetic graph (node data: labels and split masks); returns the part config. Random
    assignment, not METIS (DGL's default): METIS crashed here ("double free or corruption") on a small graph."""
    data = generate_synthetic(num_nodes=num_nodes, seed=0)
    g = data.graph
    g.ndata["labels"] = data.labels
    for name, ids in (("train_mask", data.train_idx), ("val_mask", data.valid_idx)):
        g.ndata[name] = torch.zeros(g.num_nodes(), dtype=torch.bool).index_fill_(0, ids, True)
    dgl.distributed.partition_graph(g, "synthetic", num_parts, out_dir, part_method="random")
    return os.path.join(out_dir, "synthetic.json")


@torch.no_grad()
def accuracy(model, emb, g, mask_name: str) -> float:
    """Accuracy on the masked nodes over full neighbourhoods, each rank its share (``node_split``) through DGL's
    own ``DistNodeDataLoader``; the counts are summed over the ranks."""
    ids = dgl.distributed.node_split(g.ndata[mask_name], g.get_partition_book(), force_even=True)
    full = dgl.dataloading.MultiLayerFullNeighborSampler(len(model.layers))
    counts = torch.zeros(2, dtype=torch.float64)
    model.eval()
    for input_nodes, output_nodes, blocks in dgl.dataloading.DistNodeDataLoader(g, ids, full, batch_size=1024):
        counts[0] += int((model(blocks, emb(input_nodes)).argmax(1) == g.ndata["labels"][output_nodes]).sum())
        counts[1] += output_nodes.numel()
    model.train()
    dist.all_reduce(counts)
    return float(counts[0] / counts[1])


# --8<-- [start:train] (shown in docs/guides/distgraph.md)
def train(rank: int, world: int, g, opts: dict) -> dict:
    """One trainer: ``g`` is the DistGraph, ``torch.distributed`` is initialised (gloo)."""
    torch.manual_seed(0)  # the same dense initialisation on every rank (DDP also broadcasts rank 0's)
    # sharded as DGL's DistEmbedding is: each trainer holds the rows of its machine's partition, values and
    # optimizer state, and reads the other rows from their owners (each owner draws its own rows' initial values)
    emb = dgl_oac.NodeEmbedding(g.num_nodes(), opts["dim"], "emb", init_func=lambda t: t.normal_(std=0.1),
                                sharding=opts["sharding"], partition=row_partition(g))
    num_classes = int(g.ndata["labels"][0:g.num_nodes()].max()) + 1
    model = torch.nn.parallel.DistributedDataParallel(SAGE(opts["dim"], 32, num_classes))
    sparse_opt = dgl_oac.SparseAdam([emb], lr=0.05)
    dense_opt = torch.optim.Adam(model.parameters(), lr=0.01)
    # every rank passes all training nodes; use_ddp gives each its block, padded to the same number of steps
    train_ids = torch.nonzero(g.ndata["train_mask"][0:g.num_nodes()]).flatten()
    loader = dgl_oac.DataLoader(g, train_ids, dgl.dataloading.NeighborSampler([10, 5]), embeddings=[emb],
                                mode=opts["mode"], batch_size=256, shuffle=True, seed=0, use_ddp=True)
    epochs = []
    for epoch in range(opts["epochs"]):
        losses = []
        for input_nodes, output_nodes, blocks in loader:
            labels = g.ndata["labels"][output_nodes]  # DGL's RPC, on this (the only RPC) thread
            loss = F.cross_entropy(model(blocks, emb(input_nodes)), labels)
            dense_opt.zero_grad()
            loss.backward()
            dense_opt.step()
            sparse_opt.step()
            losses.append(loss.item())
        epochs.append({"epoch": epoch, "mean_loss": sum(losses) / len(losses),
                       "valid_accuracy": round(accuracy(model.module, emb, g, "val_mask"), 4)})
        if rank == 0:
            print(json.dumps(epochs[-1]), flush=True)
    if not all(math.isfinite(e["mean_loss"]) for e in epochs):
        raise RuntimeError(f"rank {rank}: a non-finite loss: {epochs}")
    lo, rows = emb.local_rows()  # this trainer's own rows (a sharded table has no emb.weight)
    digest = hashlib.sha256(rows.numpy().tobytes()).hexdigest()[:16]
    return {"rank": rank, "epochs": epochs, "own_rows": [lo, lo + rows.shape[0]], "own_rows_sha256": digest,
            "stats": loader.stats.as_dict()}
# --8<-- [end:train]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--num-nodes", type=int, default=20_000)
    p.add_argument("--dim", type=int, default=32)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--mode", default="oac", choices=["sync", "oac"])
    p.add_argument("--sharding", default="rows", choices=["rows", "replicated"],
                   help="'rows': each trainer holds its rows (DistEmbedding's layout); 'replicated': every machine "
                        "holds the whole table")
    p.add_argument("--trainers", type=int, default=2)
    p.add_argument("--parts", type=int, default=1, help="with --partition-to: partitions, one per machine")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds before every process is killed")
    p.add_argument("--ip-config", help="under torchrun, a trainer of running servers (README's recipe): their "
                                       "ip_config file; with --part-config, the partitions' JSON")
    p.add_argument("--part-config")
    p.add_argument("--partition-to", help="only partition the graph (--parts of it) into this directory")
    args = p.parse_args()
    if args.partition_to:
        print(partition(args.num_nodes, args.parts, args.partition_to))
        return
    opts = {"dim": args.dim, "epochs": args.epochs, "mode": args.mode, "sharding": args.sharding}
    if args.ip_config:
        g = connect(args.ip_config, args.part_config)
        result = train(dist.get_rank(), dist.get_world_size(), g, opts)
        if dist.get_rank() == 0:
            print(json.dumps({"mode": args.mode, "trainers": dist.get_world_size(), **result}))
        dist.barrier()
        dist.destroy_process_group()
        return
    with tempfile.TemporaryDirectory(prefix="dgl-oac-parts-") as tmp:
        part_config = partition(args.num_nodes, 1, tmp)  # several on one host: see launch_local
        results = launch_local(train, part_config, opts, num_trainers=args.trainers, timeout=args.timeout)
    print(json.dumps({"mode": args.mode, "trainers": args.trainers, **results[0]}))


if __name__ == "__main__":
    main()
