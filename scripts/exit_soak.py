"""Run a script that leaves an oac epoch early and exits, many times in a row: every run must exit 0.

A background thread still inside a torch or DGL call while the interpreter finalizes aborts the process
(``terminate called without an active exception``, exit 134). Each run trains a few steps, leaves the epoch in
one of several ways and falls off the end of the script, leaving the rest to the interpreter's exit:

* ``break``     : ``break`` out of the loop, the loader still referenced at module level;
* ``close``     : ``break``, then ``loader.close()``;
* ``next``      : a bare ``next(iter(loader))`` after the loop (a new epoch's threads running at exit);
* ``exception`` : an exception escapes the loop (exit 1 expected, from the traceback; never 134).

    python scripts/exit_soak.py --runs 50            # 50 runs of each variant
"""
from __future__ import annotations

import argparse
import subprocess
import sys
from collections import Counter

VARIANTS = ("break", "close", "next", "exception")
EXPECTED = {"break": 0, "close": 0, "next": 0, "exception": 1}


def child(variant: str) -> None:
    import dgl
    import torch

    import dgl_oac

    g = dgl.rand_graph(3000, 30000)
    emb = dgl_oac.NodeEmbedding(g.num_nodes(), 32, "emb")
    opt = dgl_oac.SparseAdam([emb], lr=0.01)
    loader = dgl_oac.DataLoader(g, torch.arange(g.num_nodes()), dgl.dataloading.NeighborSampler([5, 5]),
                                embeddings=[emb], mode="oac", batch_size=64, prefetch=4, seed=0)
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


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs", type=int, default=50, help="runs of each variant")
    p.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated subset of {VARIANTS}")
    p.add_argument("--child", choices=VARIANTS, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child(args.child)
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
            proc = subprocess.run([sys.executable, __file__, "--child", v], capture_output=True, text=True,
                                  timeout=120)
            codes[v][proc.returncode] += 1
            if proc.returncode != EXPECTED[v]:
                failures.append((v, r, proc.returncode, proc.stderr[-2000:]))
    for v in variants:
        print(f"{v:10s} exit codes {dict(codes[v])} (expected {EXPECTED[v]} every time)")
    for v, r, code, err in failures[:3]:
        print(f"--- {v}, run {r}: exit {code}\n{err}", file=sys.stderr)
    print(f"{sum(sum(c.values()) for c in codes.values()) - len(failures)} passed, {len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
