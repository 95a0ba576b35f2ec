"""Host memory of a training epoch with sampling workers (``num_workers``): does a worker copy the table?

    python scripts/worker_memory.py                       # 400k x 128 float32 = 195 MiB table, 0 and 2 workers
    python scripts/worker_memory.py --rows 20000 --steps 10 --num-workers 0,1   # the quick version

For each ``num_workers``, in a fresh process: a ``dgl_oac.NodeEmbedding`` (rows initialised, so every page of
the table is resident), a power-law graph, a 1-hop ``NeighborSampler`` oac loader (prefetch 4), SparseSGD (no
state columns: the table is exactly rows x dim x 4 bytes). After ``--steps`` steps of the first epoch (workers
alive, the write-back having written rows all over the table) it reads ``/proc/<pid>/smaps_rollup`` of this
process and of each worker: PSS (a shared page counts 1/n in each of the n processes mapping it) and
Private_Dirty (pages only that process holds, written: a copy-on-write copy of the table lands there). Prints
one JSON line per setting.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import subprocess
import sys
from typing import Dict, List

MIB = 1 << 20


def rollup(pid: int) -> Dict[str, float]:
    """``{"pss": MiB, "private_dirty": MiB}`` of process ``pid``."""
    out = {}
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in ("Pss", "Private_Dirty"):
                out[key.lower()] = int(rest.split()[0]) * 1024 / MIB
    return out


def measure(rows: int, dim: int, steps: int, num_workers: int) -> Dict[str, object]:
    import dgl
    import torch

    import dgl_oac

    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    weights = 1.0 / torch.arange(1, rows + 1, dtype=torch.float64) ** 1.2
    src = torch.arange(rows).repeat_interleave(3)
    dst = torch.multinomial(weights, rows * 3, replacement=True, generator=gen)
    graph = dgl.graph((torch.cat([src, dst]), torch.cat([dst, src])), num_nodes=rows)
    emb = dgl_oac.NodeEmbedding(rows, dim, "table", lambda t: t.uniform_(-0.1, 0.1))
    opt = dgl_oac.SparseSGD([emb], lr=0.01)
    loader = dgl_oac.DataLoader(graph, torch.arange(rows), dgl.dataloading.NeighborSampler([5]), embeddings=[emb],
                                mode="oac", batch_size=1024, shuffle=True, seed=0, prefetch=4,
                                num_workers=num_workers)
    before = rollup(os.getpid())
    for i, (_, _, blocks) in enumerate(loader):
        blocks[0].srcdata["table"].square().sum().backward()
        opt.step()
        if i + 1 == steps:
            emb.flush()
            workers = [p.pid for p in multiprocessing.active_children() if p.name.startswith("dgl-oac-sampler")]
            main = rollup(os.getpid())
            each = [rollup(pid) for pid in workers]
            break
    loader.close()
    emb.close()
    return {"num_workers": num_workers, "table_mib": rows * dim * 4 / MIB, "steps": steps,
            "main_pss_before_mib": round(before["pss"], 1), "main_pss_mib": round(main["pss"], 1),
            "main_private_dirty_mib": round(main["private_dirty"], 1),
            "workers_pss_mib": [round(w["pss"], 1) for w in each],
            "workers_private_dirty_mib": [round(w["private_dirty"], 1) for w in each],
            "total_pss_mib": round(main["pss"] + sum(w["pss"] for w in each), 1)}


def main(argv: List[str]) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=400_000)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--steps", type=int, default=80, help="steps before measuring (workers alive)")
    ap.add_argument("--num-workers", default="0,2", help="comma-separated settings, each in a fresh process")
    ap.add_argument("--one", type=int, default=None, help=argparse.SUPPRESS)  # the child process's setting
    args = ap.parse_args(argv)
    if args.one is not None:
        print(json.dumps(measure(args.rows, args.dim, args.steps, args.one)), flush=True)
        return
    for n in (int(x) for x in args.num_workers.split(",")):
        subprocess.run([sys.executable, __file__, "--rows", str(args.rows), "--dim", str(args.dim), "--steps",
                        str(args.steps), "--one", str(n)], check=True)


if __name__ == "__main__":
    main(sys.argv[1:])
