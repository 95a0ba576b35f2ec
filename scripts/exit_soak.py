"""Run a script that leaves an oac epoch early and exits, many times in a row: every run must exit 0.

A background thread still inside a torch or DGL call while the interpreter finalizes aborts the process
(``terminate called without an active exception``, exit 134). Each run trains a few steps, leaves the epoch in
one of several ways and falls off the end of the script, leaving the rest to the interpreter's exit:

* ``break``     : ``break`` out of the loop, the loader still referenced at module level;
* ``close``     : ``break``, then ``loader.close()``;
* ``next``      : a bare ``next(iter(loader))`` after the loop (a new epoch's threads running at exit);
* ``exception`` : an exception escapes the loop (exit 1 expected, from the traceback; never 134).

With ``--num-workers n`` the loader samples in ``n`` worker processes; after each run the soak also checks that
no worker outlived it (a process still running this script's ``--child`` command line is an orphan).

    python scripts/exit_soak.py --runs 50                    # 50 runs of each variant
    python scripts/exit_soak.py --runs 50 --num-workers 2    # the same with sampling worker processes
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections import Counter

VARIANTS = ("break", "close", "next", "exception")
EXPECTED = {"break": 0, "close": 0, "next": 0, "exception": 1}


def child(variant: str, num_workers: int) -> None:
    import dgl
    import torch

    import dgl_oac

    g = dgl.rand_graph(3000, 30000)
    emb = dgl_oac.NodeEmbedding(g.num_nodes(), 32, "emb")
    opt = dgl_oac.SparseAdam([emb], lr=0.01)
    loader = dgl_oac.DataLoader(g, torch.arange(g.num_nodes()), dgl.dataloading.NeighborSampler([5, 5]),
                                embeddings=[emb], mode="oac", batch_size=64, prefetch=4, seed=0,
                                num_workers=num_workers)
    for i, batch in enumerate(loader):
        blocks = batch[-1]
        blocks[0].srcdata["emb"].sum().backward()
        opt.step()
        if i == 5:
            if variant == "exception":
                raise RuntimeError("the model failed (on purpose)")
            break
    if variant == "close":
        loader.close()
    elif variant == "next":
        next(iter(loader))
    # as in a script whose loop ran at module level: everything (the last batch too) lives until the
    # interpreter tears the module down
    globals()["keep"] = (loader, emb, opt, batch)


def orphans(cmd: list) -> list:
    """Pids of live processes running ``cmd`` (a finished child's forked workers, had they outlived it)."""
    want = "\0".join(cmd[1:]).encode()
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if want in f.read():
                    found.append(int(pid))
        except OSError:
            continue
    return found


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs", type=int, default=50, help="runs of each variant")
    p.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated subset of {VARIANTS}")
    p.add_argument("--num-workers", type=int, default=0, help="the loader's sampling worker processes")
    p.add_argument("--child", choices=VARIANTS, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child(args.child, args.num_workers)
        return 0
    from tqdm import tqdm

    variants = [v for v in args.variants.split(",") if v]
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown:
        p.error(f"unknown variant(s) {unknown}; choose from {VARIANTS}")
    codes = {v: Counter() for v in variants}
    failures = []
    for r in tqdm(range(args.runs), desc="exit soak", unit="round"):
        for v in variants:
            cmd = [sys.executable, __file__, "--child", v, "--num-workers", str(args.num_workers)]
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
            codes[v][proc.returncode] += 1
            left = orphans(cmd)
            if proc.returncode != EXPECTED[v] or left:
                failures.append((v, r, proc.returncode, f"orphan processes {left}\n" * bool(left) +
                                 proc.stderr[-2000:]))
    for v in variants:
        print(f"{v:10s} exit codes {dict(codes[v])} (expected {EXPECTED[v]} every time)")
    for v, r, code, err in failures[:3]:
        print(f"--- {v}, run {r}: exit {code}\n{err}", file=sys.stderr)
    print(f"{sum(sum(c.values()) for c in codes.values()) - len(failures)} passed, {len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
