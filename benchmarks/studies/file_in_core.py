"""A file-backed table that fits in memory: does the out-of-core machinery (a read-ahead syscall per page in the
gather and the write-back, a write-out of the dirty pages after every step) cost the pipelined modes?

Each run is a fresh process: a 500k x 128 table (256 MB) in memory, in a file, or in a file with the table
forced out of core (``dgl_oac.engine.table.memory_limit`` patched to 1 KiB: what every file table did before
``RowStore.out_of_core``), trained by sync and oac@4 through a ``BatchLoader`` for ``--steps`` steps of
``--batch`` ids drawn with popularity ``r^-1`` (power law), SparseSGD. Rounds interleave every configuration;
each run's table checksum must be the same in every configuration.

    python benchmarks/studies/file_in_core.py --rounds 2 --out benchmarks/results/file_in_core.json
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import _common as C  # noqa: E402

NAME = "file_in_core"
WHERE = ("memory", "file", "file-forced")
MODES = ("sync", "oac")


def run_one(mode: str, where: str, rows: int, dim: int, batch: int, steps: int, warmup: int) -> Dict[str, Any]:
    """One configuration, in this process: steps/s after ``warmup`` steps and the table's checksum."""
    import torch

    import dgl_oac
    from dgl_oac.engine import table as table_module

    if where == "file-forced":
        table_module.memory_limit = lambda: 1024  # every file table counts as out of core
    folder = tempfile.mkdtemp(prefix="dgl-oac-file-in-core-", dir="/var/tmp" if os.path.isdir("/var/tmp") else None)
    storage = "memory" if where == "memory" else os.path.join(folder, "table.f32")
    emb = dgl_oac.NodeEmbedding(rows, dim, "t", storage=storage,
                                init_func=lambda t: t.normal_(generator=torch.Generator().manual_seed(0)))
    opt = dgl_oac.SparseSGD([emb], lr=0.1)
    gen = torch.Generator().manual_seed(1)
    cdf = torch.cumsum(1.0 / torch.arange(1, rows + 1, dtype=torch.float64), 0)
    cdf = cdf / cdf[-1].clone()
    perm = torch.randperm(rows, generator=gen)
    batches = [perm[torch.searchsorted(cdf, torch.rand(batch, generator=gen, dtype=torch.float64)).clamp(max=rows - 1)]
               for _ in range(steps + warmup)]
    loader = dgl_oac.BatchLoader(batches, ids={emb: lambda b: b}, mode=mode, prefetch=4 if mode == "oac" else "auto",
                                 seed=0)
    t0 = None
    for i, b in enumerate(loader):
        if i == warmup:
            t0 = time.perf_counter()
        emb(b).square().sum().backward()
        opt.step()
    loader.close()
    emb.flush()
    seconds = time.perf_counter() - t0
    checksum = float(emb.weight.double().sum())
    out_of_core = emb.store.out_of_core
    emb.close()
    if storage != "memory":
        os.unlink(storage)
    os.rmdir(folder)
    return {"steps_per_s": steps / seconds, "checksum": checksum, "out_of_core": out_of_core}


def main(argv: Any = None) -> Dict[str, Any]:
    p = C.base_parser(__doc__.split("\n\n")[0], NAME)
    p.add_argument("--rows", type=int, default=500_000)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--batch", type=int, default=16384)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--one", nargs=2, metavar=("MODE", "WHERE"), help=argparse_hidden())
    args = p.parse_args(argv)
    if args.quick:
        args.rows, args.steps, args.warmup, args.rounds, args.batch = 20_000, 6, 2, 1, 1024
    if args.one:
        print(json.dumps(run_one(*args.one, args.rows, args.dim, args.batch, args.steps, args.warmup)))
        return {}
    configs = [(m, w) for w in WHERE for m in MODES]
    runs: Dict[str, List[Dict[str, Any]]] = {f"{m}/{w}": [] for m, w in configs}
    for r in range(args.rounds):
        for m, w in C.rotated(configs, r):
            cmd = [sys.executable, __file__, "--one", m, w, "--rows", str(args.rows), "--dim", str(args.dim),
                   "--batch", str(args.batch), "--steps", str(args.steps), "--warmup", str(args.warmup)]
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=900, check=True)
            runs[f"{m}/{w}"].append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(f"round {r} {m}/{w}: {runs[f'{m}/{w}'][-1]['steps_per_s']:.1f} steps/s", flush=True)
    checksums = {x["checksum"] for rs in runs.values() for x in rs}
    summary = {k: C.spread([x["steps_per_s"] for x in rs]) for k, rs in runs.items()}
    ratios = {f"oac/sync {w}": C.spread([o["steps_per_s"] / s["steps_per_s"]
                                         for o, s in zip(runs[f"oac/{w}"], runs[f"sync/{w}"])]) for w in WHERE}
    ratios.update({f"{m} file/memory": C.spread([f["steps_per_s"] / mm["steps_per_s"]
                                                  for f, mm in zip(runs[f"{m}/file"], runs[f"{m}/memory"])])
                   for m in MODES})
    result = {"args": vars(args), "env": C.environment(), "runs": runs, "summary": summary, "ratios": ratios,
              "same_table_everywhere": len(checksums) == 1,
              "out_of_core": {k: rs[0]["out_of_core"] for k, rs in runs.items()}}

    def report() -> None:
        C.print_table("steps/s (median, min, max over rounds)", ["config", "median", "min", "max"],
                      [[k, v["median"], v["min"], v["max"]] for k, v in summary.items()])
        C.print_table("ratios within a round", ["ratio", "median", "min", "max"],
                      [[k, v["median"], v["min"], v["max"]] for k, v in ratios.items()])
        print(f"the same table in every configuration: {result['same_table_everywhere']}")

    def plot(png: Path) -> None:
        plt = C.pyplot()
        fig, ax = plt.subplots(figsize=(7, 3.8))
        labels = list(summary)
        ax.bar(labels, [summary[k]["median"] for k in labels],
               color=["#888" if k.startswith("sync") else "#27a" for k in labels])
        ax.tick_params(axis="x", labelrotation=20)
        ax.set_ylabel("steps/s (median of rounds)")
        ax.set_title(f"{args.rows:,} x {args.dim} table: memory, file, file forced out of core")
        C.save_figure(fig, png)

    return C.publish(args, NAME, result, plot, report)


def argparse_hidden() -> str:
    import argparse

    return argparse.SUPPRESS


if __name__ == "__main__":
    main()
