"""Repeat ``tests/loading/test_oac.py``'s CUDA equality run (its ``train``: IndexSAGEConv over a power-law graph,
batch 96, 2 epochs) in several variants, and report for each repeat where it first leaves the reference sync run: a
flaky
difference (a race) shows as some repeats differing, a deterministic one as all; sync against sync tells whether
the run itself is deterministic. One flushed JSON line per run.

    python scripts/gpu/equality_repeat.py --out "$OUT/repeat.jsonl"                  # on the GPU machine
    CUDA_LAUNCH_BLOCKING=1 python scripts/gpu/equality_repeat.py --label blocking ... # every launch synchronous
    python scripts/gpu/equality_repeat.py --device cpu --repeats 1 --variants sync    # the plumbing, on a CPU
"""
from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

import torch

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / "tests" / "loading"), str(REPO / "tests")]  # test_oac, and its conftest

#: name -> (optimizer, mode, prefetch, num_workers or None for the loader's default)
VARIANTS = {
    "sync": ("adam", "sync", 1, None),
    "oac4": ("adam", "oac", 4, None),
    "oac4_w0": ("adam", "oac", 4, 0),
    "oac1": ("adam", "oac", 1, None),
    "sync_w0": ("adam", "sync", 1, 0),
    "oac4_w2": ("adam", "oac", 4, 2),
    "sync_w2": ("adam", "sync", 1, 2),
    "adagrad_oac4": ("adagrad", "oac", 4, None),
    "sgd_oac4": ("sgd", "oac", 4, None),
}


def run(device: str, opt: str, mode: str, prefetch: int, workers: Optional[int]) -> Dict[str, Any]:
    import dgl_oac
    import test_oac

    real = dgl_oac.DataLoader
    if workers is not None:
        dgl_oac.DataLoader = functools.partial(real, num_workers=workers)
    try:
        losses, values, state, loader = test_oac.train("node", mode, opt, prefetch=prefetch, device=device)
    finally:
        dgl_oac.DataLoader = real
    st = loader.stats.as_dict()
    return {"losses": losses, "values": values, "state": state, "rows_patched": st.get("rows_patched"),
            "conflict_rate": loader.stats.conflict_rate, "num_workers": getattr(loader, "num_workers", None)}


def compare(ref: Dict[str, Any], got: Dict[str, Any]) -> Dict[str, Any]:
    first = next((i for i, (a, b) in enumerate(zip(ref["losses"], got["losses"])) if a != b), None)
    return {"first_loss_diff": first, "steps": len(got["losses"]),
            "table_equal": bool(torch.equal(ref["values"], got["values"])),
            "state_equal": bool(torch.equal(ref["state"], got["state"])),
            "table_max_abs_diff": float((ref["values"] - got["values"]).abs().max())}


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated, of {', '.join(VARIANTS)}")
    p.add_argument("--label", default="", help="written on every line (e.g. the environment's variant)")
    p.add_argument("--out", type=Path, default=None, help="JSON lines (appended, flushed); stdout too")
    args = p.parse_args(argv)
    names = [v for v in args.variants.split(",") if v]
    unknown = [v for v in names if v not in VARIANTS]
    if unknown:
        p.error(f"unknown variant(s) {unknown}: expected some of {', '.join(VARIANTS)}")
    out = open(args.out, "a") if args.out else None
    refs: Dict[str, Dict[str, Any]] = {}
    try:
        for r in range(args.repeats):
            for name in names:
                opt, mode, prefetch, workers = VARIANTS[name]
                if opt not in refs:  # each optimizer's reference: its first sync run
                    refs[opt] = run(args.device, opt, "sync", 1, None)
                t = time.perf_counter()
                line = {"label": args.label, "variant": name, "repeat": r, "optimizer": opt, "mode": mode,
                        "prefetch": prefetch}
                try:
                    got = run(args.device, opt, mode, prefetch, workers)
                except Exception as exc:  # noqa: BLE001 - recorded, and the next run goes on
                    line.update(error=repr(exc), seconds=round(time.perf_counter() - t, 2))
                else:
                    line.update(num_workers=got["num_workers"], **compare(refs[opt], got),
                                rows_patched=got["rows_patched"], conflict_rate=got["conflict_rate"],
                                seconds=round(time.perf_counter() - t, 2))
                text = json.dumps(line)
                print(text, flush=True)
                if out:
                    out.write(text + "\n")
                    out.flush()
    finally:
        if out:
            out.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
