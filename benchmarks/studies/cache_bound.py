"""What bounds a row cache on bench_disk's power-law workload: the hit rate any policy can reach at the size the
memory allows, and the speed that hit rate allows on the disk measured (issue 46's goals: 0.5x the in-memory run,
3x sync without the cache, half the disk I/Os per trained row).

    python benchmarks/studies/cache_bound.py --bench benchmarks/results/bench_disk_final.json \\
        --out benchmarks/results/cache_bound.json

The trace is ``scripts/big_table.py --power 1.0``'s: batches of 4096 edges whose endpoints are drawn with
popularity ``(rank + 1)^-1`` over the rows in a random order, plus 256 uniform negatives; a batch's rows are
looked up once each (unique), as the cache counts them. On it, for each cache size, the hit rate over steps
``--warmup``..``--steps`` (the trace runs as many steps on, so that OPT's foresight does not end with the
window) of:

* **LRU** (batch-grained: a row hits if it was looked up within the last C distinct rows);
* **static**: the C most popular rows, known in advance (the best fixed set);
* **OPT**: Belady's choice with bypass (after each batch, keep the C rows looked up so far that come back
  soonest), the most a cache of C rows can hit on this trace;
* **ours**: dgl-oac's :class:`~dgl_oac.engine.table.RowCache` itself (CLOCK, TinyLFU's admission), fed the
  trace in the pipeline's order (a step's rows written back 4 steps after their gather) with one-float rows;
* and a cache of unbounded size, whatever its policy: only a row's first lookup misses.

A miss costs a page read (the gather) and a page write (the write-back stores the row into its page), less what
the page cache absorbs: the disk I/Os per miss are measured on ``--bench``'s cached runs. The disk's mixed random
read/write rate at queue depth 32 (``--bench``'s ``disk.randrw_qd32``: fio's or the python reader's) then allows
at most ``ceiling / (I/Os per miss x misses per row)`` rows/s; with the in-memory run's steps/s from the same
JSON, the best steps/s of a cache of each size is the smaller of the two. The memory allows at most
``--memory-rows`` rows (default: the bench run's cgroup less its anonymous memory at the first batch and the
pages of ``IN_FLIGHT_BATCHES`` batches in flight, in rows as ``cache_rows`` counts them).
"""
from __future__ import annotations

import argparse
import json
import mmap
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import torch
from tqdm import tqdm

from dgl_oac.engine.table import IN_FLIGHT_BATCHES, RowCache, cache_rows

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
from _common import environment, finish, median, png_path, pyplot, save_figure  # noqa: E402
from memory_cgroup import parse_size  # noqa: E402 - the bench's --memory-limit, as big_table parses it


def trace(rows: int, steps: int, batch: int, negatives: int, power: float,
          seed: int) -> Tuple[List[np.ndarray], np.ndarray]:
    """Each step's unique row ids (``int64[~5.4k]``), drawn as big_table draws them (its sources and destinations
    each with its own popularity order over the rows), and each row's probability of being an endpoint
    (``float64[rows]``)."""
    rng = np.random.default_rng(seed)
    weights = np.arange(1, rows + 1, dtype=np.float64) ** -power
    weights /= weights.sum()
    cdf = np.cumsum(weights)
    orders = [rng.permutation(rows), rng.permutation(rows)]  # rank -> row, for sources and for destinations
    popularity = np.zeros(rows)
    for order in orders:
        popularity[order] += weights / 2
    out = []
    for _ in range(steps):
        ends = [order[np.searchsorted(cdf, rng.random(batch), side="right").clip(max=rows - 1)] for order in orders]
        out.append(np.unique(np.concatenate(ends + [rng.integers(0, rows, negatives)])))
    return out, popularity


def static_hits(steps: List[np.ndarray], rank_of: np.ndarray, size: int, lo: int, hi: Optional[int] = None) -> float:
    """Hit rate over steps ``lo``..``hi`` of the ``size`` most popular rows (``rank_of``: each row's popularity
    rank)."""
    looked = np.concatenate(steps[lo:hi])
    return float((rank_of[looked] < size).mean())


def lru_hits(steps: List[np.ndarray], rows: int, size: int, lo: int, hi: Optional[int] = None) -> float:
    """Batch-grained LRU, counted over steps ``lo``..``hi``: a row hits if fewer than ``size`` distinct rows were
    looked up since it last was (rows last looked up in the same step as the boundary count as held in part, by the
    share that fits)."""
    last = np.full(rows, -1, dtype=np.int64)
    per_step = np.zeros(len(steps), dtype=np.int64)  # rows whose last lookup is at that step
    hits = looked = 0.0
    for t, ids in enumerate(steps[:hi]):
        if t >= lo:
            seen = last[ids]
            newest_first = np.cumsum(per_step[:t][::-1])  # rows held if the cache reaches back k+1 steps
            full = int(np.searchsorted(newest_first, size, side="right"))  # whole steps held
            boundary = t - 1 - full
            held = (seen > boundary) & (seen >= 0)
            h = float(held.sum())
            if boundary >= 0 and per_step[boundary]:
                room = size - (newest_first[full - 1] if full else 0)
                h += float((seen == boundary).sum()) * min(1.0, room / per_step[boundary])
            hits += h
            looked += ids.size
        old = last[ids]
        np.subtract.at(per_step, old[old >= 0], 1)
        last[ids] = t
        per_step[t] += ids.size
    return hits / looked


def opt_hits(steps: List[np.ndarray], rows: int, size: int, lo: int, hi: Optional[int] = None) -> float:
    """Belady with bypass, batch-grained, counted over steps ``lo``..``hi``: after each step the cache keeps the
    ``size`` rows (of those it held and those just looked up) whose next lookup comes first (the steps after
    ``hi`` count as future, so that the window's end is not the trace's)."""
    never = len(steps)
    nxt = np.full(rows, never, dtype=np.int64)
    next_of: List[np.ndarray] = [None] * len(steps)  # type: ignore[list-item]
    for t in range(len(steps) - 1, -1, -1):
        next_of[t] = nxt[steps[t]]
        nxt[steps[t]] = t
    held = np.empty(0, dtype=np.int64)
    held_next = np.empty(0, dtype=np.int64)
    in_cache = np.zeros(rows, dtype=bool)
    in_step = np.zeros(rows, dtype=bool)
    hits = looked = 0
    for t, ids in enumerate(steps[:hi]):
        if t >= lo:
            hits += int(in_cache[ids].sum())
            looked += ids.size
        in_step[ids] = True
        keep = ~in_step[held]
        in_step[ids] = False
        cand = np.concatenate([held[keep], ids])
        cand_next = np.concatenate([held_next[keep], next_of[t]])
        useful = cand_next < never
        cand, cand_next = cand[useful], cand_next[useful]
        if cand.size > size:
            pick = np.argpartition(cand_next, size - 1)[:size]
            cand, cand_next = cand[pick], cand_next[pick]
        in_cache[held] = False
        in_cache[cand] = True
        held, held_next = cand, cand_next
    return hits / looked


def ours_hits(steps: List[np.ndarray], rows: int, size: int, lo: int, hi: Optional[int] = None,
              depth: int = 4) -> float:
    """dgl-oac's own policy: a :class:`~dgl_oac.engine.table.RowCache` of ``size`` one-float rows in front of an
    in-memory "file", each step's rows gathered ``depth`` steps before they are written back (the pipeline's
    order at prefetch 4), cleaned ahead after each write; its hit rate over steps ``lo``..``hi``."""
    cache = RowCache(torch.zeros(rows, 1), size)
    pending: List[torch.Tensor] = []
    hits0 = misses0 = 0
    for t, step in enumerate(steps[:hi]):
        if t == lo:
            hits0, misses0 = cache.hits, cache.misses
        ids = torch.from_numpy(step)
        cache.gather(ids, torch.empty(ids.numel(), 1))
        pending.append(ids)
        if len(pending) > depth:
            done = pending.pop(0)
            cache.write(done, torch.zeros(done.numel(), 1))
            cache.clean_ahead()
    hits, misses = cache.hits - hits0, cache.misses - misses0
    return hits / max(1, hits + misses)


def memory_rows(bench: Dict[str, Any], rows: int, width: int, batch_rows: float) -> int:
    """The most rows a cache could hold in the bench run's cgroup beside the process and the pages in flight."""
    run = next(r for m, rs in bench["runs"].items() if ":memory" not in m for r in rs)
    limit = parse_size(bench["args"]["memory_limit"])
    left = limit - run["anonymous_gib_at_first_batch"] * 2**30 - IN_FLIGHT_BATCHES * batch_rows * mmap.PAGESIZE
    return cache_rows(int(left), rows, width, True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bench", required=True, help="a bench_disk --power JSON: its disk ceiling and in-memory run")
    p.add_argument("--steps", type=int, default=1000, help="steps of the trace")
    p.add_argument("--warmup", type=int, default=400, help="steps before the hits are counted")
    p.add_argument("--sizes", default="100000,180000,272000,440000,700000,1000000,1333000,2000000")
    p.add_argument("--memory-rows", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="60 steps, 3 sizes (a smoke test)")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    if args.quick:
        args.steps, args.warmup, args.sizes = 60, 20, "1000,10000,100000"
    bench = json.loads(Path(args.bench).read_text())
    b = bench["args"]
    rows, width, power = b["rows"], b["dim"], b["power"]
    # the trace runs on for as many steps as are counted, so that OPT's foresight does not end with the window
    steps, popularity = trace(rows, 2 * args.steps - args.warmup, 4096, 256, power, args.seed)
    rank_of = np.empty(rows, dtype=np.int64)
    rank_of[np.argsort(-popularity, kind="stable")] = np.arange(rows)
    batch_rows = float(np.mean([s.size for s in steps]))
    mem_rows = args.memory_rows if args.memory_rows is not None else memory_rows(bench, rows, width, batch_rows)
    rw = bench["disk"]["randrw_qd32"]
    ceiling = rw["reads_per_s"] + rw["writes_per_s"]  # disk I/Os/s, half reads and half writes
    memory_sps = median(r["steps_per_s"] for m, rs in bench["runs"].items() if m.endswith(":memory") for r in rs)
    measured = {m: median(r["steps_per_s"] for r in rs) for m, rs in bench["runs"].items()}
    cached = [dict(r, label=m) for m, rs in bench["runs"].items() for r in rs
              if "cache_hit_rate" in r and not r.get("cache_off")]
    same_steps = (b.get("warmup", 0), b.get("warmup", 0) + b["steps"]) == (args.warmup, args.steps)
    # a miss costs a page read and a page write, less what the page cache absorbs: measured on the cached runs
    io_per_miss = median((r["device_reads_per_s"] + r["device_writes_per_s"]) / r["rows_per_s"]
                         / (1 - r["cache_hit_rate"]) for r in cached) if cached else 2.0
    sizes = sorted({int(s) for s in args.sizes.split(",")} | {mem_rows} | {r["cache_rows"] for r in cached})
    window = (args.warmup, args.steps)

    def speed(hit: float) -> Dict[str, float]:  # what a hit rate allows on this disk, and no more than in memory
        io_per_row = io_per_miss * (1 - hit)
        return {"io_per_row": io_per_row,
                "max_steps_per_s": min(memory_sps, ceiling / max(io_per_row, 1e-9) / batch_rows)}

    # a cache that kept every row ever looked up: only a row's first lookup misses (no size nor policy does better)
    unbounded = {"hit": lru_hits(steps, rows, rows, *window)}
    unbounded.update(speed(unbounded["hit"]))
    results = []
    for size in tqdm(sizes, desc="cache sizes"):
        row = {"size": size, "static": static_hits(steps, rank_of, size, *window),
               "lru": lru_hits(steps, rows, size, *window), "opt": opt_hits(steps, rows, size, *window),
               "ours": ours_hits(steps, rows, size, *window)}
        for policy in ("lru", "static", "opt", "ours"):
            row.update({f"{policy}_{k}": v for k, v in speed(row[policy]).items()})
        results.append(row)
    print(f"{rows:,} x {width}, power {power}; {batch_rows:.0f} rows a step; disk {ceiling / 1e3:.1f}k mixed I/Os/s "
          f"at QD32; a miss costs {io_per_miss:.2f} disk I/Os (measured) -> {ceiling / io_per_miss / batch_rows:.2f} "
          f"steps/s if every row misses; in memory {memory_sps:.2f} "
          f"steps/s; the memory holds at most {mem_rows:,} cached rows")
    print(f"{'rows':>9} {'LRU':>6} {'static':>6} {'OPT':>6} {'ours':>6} {'ours: I/O/row':>13} {'max steps/s':>11} "
          f"{'/ memory':>8} {'OPT: I/O/row':>12} {'max steps/s':>11} {'/ memory':>8}")
    for r in results:
        mark = "  <- the memory's most" if r["size"] == mem_rows else ""
        print(f"{r['size']:>9,} {r['lru']:6.3f} {r['static']:6.3f} {r['opt']:6.3f} {r['ours']:6.3f} "
              f"{r['ours_io_per_row']:13.3f} {r['ours_max_steps_per_s']:11.2f} "
              f"{r['ours_max_steps_per_s'] / memory_sps:8.2f} {r['opt_io_per_row']:12.3f} "
              f"{r['opt_max_steps_per_s']:11.2f} {r['opt_max_steps_per_s'] / memory_sps:8.2f}{mark}")
    print(f"any cache of any size (every row ever looked up kept): hit {unbounded['hit']:.3f}, "
          f"{unbounded['io_per_row']:.3f} I/Os per row, at most {unbounded['max_steps_per_s']:.2f} steps/s "
          f"({unbounded['max_steps_per_s'] / memory_sps:.2f}x in memory)")
    for r in cached:
        print(f"measured by bench_disk over steps {b.get('warmup', 0)}-{b.get('warmup', 0) + b['steps']}: "
              f"{r['label']} cache of {r['cache_rows']:,} rows hit {r['cache_hit_rate']:.3f}, "
              f"{r['steps_per_s']:.2f} steps/s")
    out = Path(args.out) if args.out else None
    report = {"args": vars(args), "env": environment(), "rows": rows, "width": width, "power": power,
              "batch_rows": batch_rows, "memory_rows": mem_rows, "io_per_miss": io_per_miss,
              "ceiling_ios_per_s": ceiling,
              "memory_steps_per_s": memory_sps, "measured_steps_per_s": measured, "unbounded": unbounded,
              "measured_caches": [{k: r[k] for k in ("label", "cache_rows", "cache_hit_rate", "steps_per_s")}
                                  for r in cached] if same_steps else [], "results": results}
    if out is not None:
        finish(report, out)
        plot(report, png_path(out))


def plot(report: Dict[str, Any], png: Path) -> None:
    """Hit rate against cache rows for each policy, the measured cache's hits, and the memory's most rows."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7.0, 4.0))
    sizes = [r["size"] for r in report["results"]]
    for policy, name in (("opt", "OPT (Belady, bypass)"), ("static", "static top rows"),
                         ("ours", "dgl-oac's RowCache, simulated"), ("lru", "LRU")):
        ax.plot(sizes, [r[policy] for r in report["results"]], marker="o", label=name)
    if report["measured_caches"]:  # (only where the bench timed the same steps)
        ax.scatter([r["cache_rows"] for r in report["measured_caches"]],
                   [r["cache_hit_rate"] for r in report["measured_caches"]], color="black", zorder=3,
                   label="dgl-oac's cache, measured (bench_disk)")
    ax.axhline(report["unbounded"]["hit"], color="black", linestyle=":", label="any cache of any size")
    ax.axvline(report["memory_rows"], color="gray", linestyle="--", label="the most rows the memory holds")
    ax.set_xscale("log")
    ax.set_xlabel("cache rows")
    ax.set_ylabel("hit rate (rows looked up per step, once each)")
    ax.legend(fontsize=7, loc="lower right")
    ax.set_title(f"{report['rows']:,} x {report['width']}, popularity power {report['power']}, steps "
                 f"{report['args']['warmup']}-{report['args']['steps']}", fontsize=9)
    save_figure(fig, png)


if __name__ == "__main__":
    main()
