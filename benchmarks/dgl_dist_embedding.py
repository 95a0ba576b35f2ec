"""DGL's own distributed embeddings on emulated machines, for ``scale_out.py --network``: the workload of ``dgl-oac
train --task node`` (the same synthetic graph, labels and training nodes, GraphSAGE ``NodeClassifier``, fanouts
10,5, SparseAdam rows at lr 0.05, dense Adam at 0.01, one trainer a machine) with the table a
``dgl.distributed.DistEmbedding`` held by DGL's servers (split by DGL's node partition policy: each machine's
server holds its partition's rows and their Adam state), trained by ``dgl.distributed.optim.SparseAdam``, batches
from ``dgl.dataloading.DistNodeDataLoader`` (sampled by the servers), dense gradients averaged by DDP.

Per machine: a ``DistGraphServer`` for its partition (2 partitions, random assignment: METIS crashed on these
graphs, ``tests/dgl_frontend/test_distgraph.py``) and a trainer under ``torchrun --nnodes=2``. Node data is not read
through ``g.ndata`` (several partitions on one host return another partition's rows,
``dgl_oac/distributed/distgraph.py``):
each trainer holds the labels, in the partitions' node ids.

    python benchmarks/dgl_dist_embedding.py serve|train ...     # by scale_out_net.py, in a namespace
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Dict

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import netrun  # noqa: E402


def prepare(args: Any, out: Path) -> Dict[str, str]:
    """Partition ``dgl-oac train``'s synthetic node graph (``--net-num-nodes``, ``--seed``) in 2 under ``out``;
    labels and training ids in the partitions' node ids beside it."""
    import dgl
    import torch

    from dgl_oac.app.data import load

    ds = load("synthetic", task="node", seed=args.seed, num_nodes=args.net_num_nodes)
    orig, _ = dgl.distributed.partition_graph(ds.graph, "synthetic", 2, str(out), part_method="random",
                                              return_mapping=True)
    new = torch.empty_like(orig)
    new[orig] = torch.arange(orig.numel())
    torch.save({"labels": ds.labels[orig], "train": new[ds.train_idx], "classes": ds.num_classes}, out / "meta.pt")
    return {"part_config": str(out / "synthetic.json"), "meta": str(out / "meta.pt")}


def run(args: Any, net: Any, parts: Dict[str, str], port: int, tmp: Path) -> Dict[str, Any]:
    """One run: a server and a trainer per machine; steps/s of the last epoch, bytes, peak PSS."""
    ip_config, out = tmp / "ip_config.txt", tmp / "dgl.json"
    ip_config.write_text("".join(f"{net.addr(i)} {port + 1000}\n" for i in range(net.machines)))
    me = [sys.executable, str(Path(__file__).resolve())]
    common = ["--ip-config", str(ip_config), "--part-config", parts["part_config"]]
    servers = [net.cmd(i, [*me, "serve", *common, "--server-id", str(i), "--clients", str(net.machines)])
               for i in range(net.machines)]
    trainer = [str(Path(__file__).resolve()), "train", *common, "--meta", parts["meta"], "--epochs",
               str(args.net_epochs), "--dim", str(args.net_dim), "--batch-size", str(args.net_batch_size),
               "--seed", str(args.seed), "--out", str(out)]
    trainers = [netrun.torchrun(net, i, port, trainer) for i in range(net.machines)]
    got = netrun.launch(net, servers + trainers, args.timeout, "DGL DistEmbedding", servers=len(servers))
    r = json.loads(out.read_text())
    return {"steps": r["steps"], "steps_per_s": r["steps_per_epoch"] / r["epoch_seconds"][-1],
            "epoch_s": r["epoch_seconds"][-1], "train_s": sum(r["epoch_seconds"]), "losses": r["losses"],
            "wire_tx_bytes_per_step": [w["tx_bytes"] / r["steps"] for w in got["wire"]],
            "pss_peak_bytes": got["pss_peak_bytes"], "wall_s": got["wall_s"]}


def _env(servers: int) -> None:
    os.environ["DGL_DIST_MODE"] = "distributed"
    os.environ["DGL_NUM_SERVER"] = str(servers)


def serve(a: argparse.Namespace) -> None:
    import dgl

    _env(1)
    os.environ["DGL_ROLE"] = "server"
    dgl.distributed.DistGraphServer(a.server_id, a.ip_config, 1, a.clients, a.part_config,
                                    disable_shared_mem=True).start()


def _init(shape: Any, dtype: Any) -> Any:
    """``dgl-oac train``'s initialisation, N(0, 0.1) (module level: DGL pickles it to the servers)."""
    import torch

    return torch.randn(shape, dtype=dtype) * 0.1


def train(a: argparse.Namespace) -> None:
    import dgl
    import torch
    import torch.nn.functional as F

    from dgl_oac.app.models.sage import NodeClassifier

    torch.set_num_threads(1)
    _env(1)
    dgl.distributed.initialize(a.ip_config)
    torch.distributed.init_process_group("gloo")
    # this machine's partition book (torchrun's node rank = the machine = its partition): a DistTensor's rows are
    # initialised on the servers of the book's partition, so partition 0's book on every machine (as
    # dgl_oac.dgl_frontend.distgraph.connect loads it) leaves machine 1's server without them
    gpb, name, _, _ = dgl.distributed.load_partition_book(a.part_config, int(os.environ["GROUP_RANK"]))
    g = dgl.distributed.DistGraph(name, gpb=gpb)
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    meta = torch.load(a.meta)
    torch.manual_seed(a.seed)
    emb = dgl.distributed.DistEmbedding(g.num_nodes(), a.dim, "emb", init_func=_init)
    sparse = dgl.distributed.optim.SparseAdam([emb], lr=0.05)
    model = torch.nn.parallel.DistributedDataParallel(NodeClassifier(a.dim, 0, 64, meta["classes"], 2))
    dense = torch.optim.Adam(model.parameters(), lr=0.01)
    train_ids = meta["train"]
    per = train_ids.numel() // world  # every rank the same number of steps (the collectives pair up)
    mine = train_ids[rank * per:(rank + 1) * per]
    loader = dgl.dataloading.DistNodeDataLoader(g, mine, dgl.dataloading.NeighborSampler([10, 5]),
                                                batch_size=a.batch_size, shuffle=True)
    labels, epochs, losses, steps = meta["labels"], [], [], 0
    for _ in range(a.epochs):
        t0, total, n = time.perf_counter(), 0.0, 0
        for input_nodes, seeds, blocks in loader:
            loss = F.cross_entropy(model(blocks, emb(input_nodes)), labels[seeds])
            dense.zero_grad()
            loss.backward()
            dense.step()
            sparse.step()
            total, n, steps = total + float(loss), n + 1, steps + 1
        epochs.append(time.perf_counter() - t0)
        losses.append(total / max(n, 1))
    torch.distributed.barrier()  # no trainer leaves the servers while another still samples
    if rank == 0:
        Path(a.out).write_text(json.dumps({"steps": steps, "steps_per_epoch": steps // a.epochs,
                                           "epoch_seconds": epochs, "losses": losses}))
    dgl.distributed.exit_client()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="what", required=True)
    for name in ("serve", "train"):
        s = sub.add_parser(name)
        s.add_argument("--ip-config", required=True)
        s.add_argument("--part-config", required=True)
    s = sub.choices["serve"]
    s.add_argument("--server-id", type=int, required=True)
    s.add_argument("--clients", type=int, required=True)
    t = sub.choices["train"]
    for flag, kind in (("--meta", str), ("--epochs", int), ("--dim", int), ("--batch-size", int),
                       ("--seed", int), ("--out", str)):
        t.add_argument(flag, type=kind, required=True)
    a = p.parse_args()
    serve(a) if a.what == "serve" else train(a)


if __name__ == "__main__":
    main()
