"""Why the write-back reads a file-backed step's pages ahead before storing its rows: the mechanisms side by side
in one training run (the measurement behind :meth:`dgl_oac.engine.table.WriteBack._apply`).

    sudo python benchmarks/studies/writeback_choice.py          # oac, 8M x 128 (3.8 GiB) table in a 1.6 GB cgroup

Runs ``scripts/big_table.py`` (oac) in a memory cgroup the table does not fit in, with the write-back's mechanism
alternating step by step (step s uses ``--methods[s % k]``, so every mechanism sees the same machine load and
the same state of the page cache):

- ``store``: the rows stored into the memory map as they come (what the write-back did before): a row whose
  page the cgroup evicted since the gather faults the page in first, synchronously, one at a time;
- ``read_ahead``: ``posix_fadvise(WILLNEED)`` for the step's pages first, then the store (what it does now);
- ``threadsK``: the store split over a pool of K threads (K faults in flight).

Prints, per mechanism, the write-back's rows/s (time from taking a step to having stored it) and the major
faults its thread took (for ``threadsK`` they fall in the pool's threads and are not counted).
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Dict, List

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))
from memory_cgroup import MemoryCgroup, parse_size  # noqa: E402


def measure(methods: List[str], argv: List[str]) -> Dict[str, Dict[str, float]]:
    """Run big_table with ``argv``, the write-back mechanism alternating over ``methods``."""
    import big_table
    import torch

    from dgl_oac.engine.table import RowStore, WriteBack

    now = {"method": methods[0]}
    pools: Dict[int, ThreadPoolExecutor] = {}
    totals = {m: {"rows": 0, "seconds": 0.0, "major_faults": 0} for m in methods}
    real_apply, real_ahead, real_write = WriteBack._apply, RowStore.read_ahead, RowStore.write

    def apply(self, item) -> None:
        now["method"] = method = methods[item[0] % len(methods)]
        f0, t0 = resource.getrusage(resource.RUSAGE_THREAD).ru_majflt, time.perf_counter()
        real_apply(self, item)
        if item[0] >= 2 * len(methods):  # the pipeline's start-up is nobody's
            totals[method]["rows"] += item[1].numel()
            totals[method]["seconds"] += time.perf_counter() - t0
            totals[method]["major_faults"] += resource.getrusage(resource.RUSAGE_THREAD).ru_majflt - f0

    def read_ahead(self, ids: torch.Tensor, for_write: bool = False) -> int:
        on_writer = threading.current_thread().name.startswith("dgl-oac-writeback-")
        return 0 if on_writer and now["method"] != "read_ahead" else real_ahead(self, ids, for_write)

    def write(self, ids: torch.Tensor, rows: torch.Tensor) -> None:
        k = int(now["method"][7:]) if now["method"].startswith("threads") else 1
        if k == 1 or not threading.current_thread().name.startswith("dgl-oac-writeback-"):
            return real_write(self, ids, rows)
        pool = pools.setdefault(k, ThreadPoolExecutor(k, thread_name_prefix="choice-store"))
        parts = torch.arange(ids.numel()).chunk(k)
        list(pool.map(lambda c: real_write(self, ids[c], rows[c]), parts))

    WriteBack._apply, RowStore.read_ahead, RowStore.write = apply, read_ahead, write
    report = big_table.main(argv)
    for pool in pools.values():
        pool.shutdown()
    return {"big_table": report, "methods": totals}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--methods", default="store,read_ahead,threads8")
    p.add_argument("--rows", type=int, default=8_000_000)
    p.add_argument("--steps", type=int, default=90)
    p.add_argument("--memory-limit", default="1.6G")
    p.add_argument("--dir", default="/tmp/dgl-oac-writeback-choice")
    p.add_argument("--in-cgroup", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    methods = args.methods.split(",")
    if args.in_cgroup:
        out = measure(methods, ["--rows", str(args.rows), "--dim", "128", "--steps", str(args.steps), "--prefetch",
                                "4", "--mode", "oac", "--dir", args.dir])
        print("RESULT " + json.dumps(out["methods"]))
        return
    load = os.getloadavg()
    with MemoryCgroup(f"dgl-oac-wbchoice-{os.getpid()}", parse_size(args.memory_limit)) as group:
        out = subprocess.run([sys.executable, __file__, *sys.argv[1:], "--in-cgroup"], check=True, text=True,
                             stdout=subprocess.PIPE, preexec_fn=group.join_preexec).stdout
    totals = json.loads([line for line in out.splitlines() if line.startswith("RESULT ")][-1][7:])
    print(f"oac, {args.rows:,} x 128 in a {args.memory_limit} cgroup, {args.steps} steps, mechanisms alternating "
          f"by step; load {load[0]:.1f} -> {os.getloadavg()[0]:.1f}")
    for m, t in totals.items():
        faults = "n/a" if m.startswith("threads") else f"{t['major_faults']:,}"
        print(f"  {m:11s} {t['rows'] / max(t['seconds'], 1e-9) / 1e3:6.1f}k rows/s  {t['seconds']:6.1f} s  "
              f"major faults on the write-back thread {faults}")


if __name__ == "__main__":
    main()
