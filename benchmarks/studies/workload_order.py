"""Does a workload run slower after the others in the same process? (issue 22's kg-adagrad-256 lead)

    python benchmarks/studies/workload_order.py                       # kg-adagrad-256 first, then last
    python benchmarks/studies/workload_order.py --quick

In one process, as ``bench_modes.py --workload all`` runs them (each workload's dataset made, warmed up, run,
then dropped): ``--probe`` (default kg-adagrad-256) is measured first, then every other workload runs its
modes once, then ``--probe`` is measured again on a fresh dataset. Each measurement is ``--rounds`` rounds of
sync, plain DGL, async@4, oac@4 and oac@auto (``bench_modes.run_one``). Prints batches/s first -> last per mode
and the process's threads, memory maps and RSS after each stage.
"""
from __future__ import annotations

import gc
import os
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the shared helpers

import _common as C  # noqa: E402
import _workloads as W  # noqa: E402
import bench_modes as B  # noqa: E402
from tqdm.auto import tqdm  # noqa: E402

NAME = "workload_order"
MODES = [("sync", 1), ("dgl", 1), ("async", 4), ("oac", 4), ("oac", "auto")]


def parse(argv: Optional[List[str]] = None):
    p = C.base_parser(__doc__.split("\n\n")[0], NAME)
    p.add_argument("--probe", default="kg-adagrad-256", help=f"one of {', '.join(W.WORKLOADS)}")
    p.add_argument("--rounds", type=int, default=2, help="rounds of every mode per measurement of --probe")
    p.add_argument("--steps", type=int, default=40)
    args = p.parse_args(argv)
    if args.probe not in W.WORKLOADS:
        p.error(f"--probe {args.probe!r}: expected one of {list(W.WORKLOADS)}")
    return args


def process_state() -> Dict[str, int]:
    """Threads, memory maps and RSS (MiB) of this process."""
    return {"threads": len(os.listdir("/proc/self/task")), "maps": sum(1 for _ in open("/proc/self/maps")),
            "rss_mib": int(C.rss_mib())}


def run_modes(w: Any, warmup: int, steps: int, rounds: int, bar: Any) -> Dict[str, List[float]]:
    """batches/s of every mode of workload ``w`` over ``rounds`` rounds, on a fresh dataset (dropped after)."""
    ds = W.dataset(w)
    B.warm_up(ds, w, 2)
    out: Dict[str, List[float]] = {f"{m}@{p}": [] for m, p in MODES}
    for _ in range(rounds):
        for m, p in MODES:
            cfg = {"mode": m, "prefetch": p, "threads": 2, "priority": "idle"}
            out[f"{m}@{p}"].append(B.run_one(ds, w, cfg, warmup, steps)["batches_per_s"])
            bar.update()
    del ds
    gc.collect()
    return out


def main(argv: Optional[List[str]] = None) -> Dict[str, Any]:
    args = parse(argv)
    bm_args = B.parse(["--workload", "all", "--steps", str(args.steps)] + (["--quick"] if args.quick else []))
    ws = {n: W.settings(bm_args, n) for n in bm_args.workloads}
    others = [n for n in ws if n != args.probe]
    rounds = 1 if args.quick else args.rounds
    bar = tqdm(total=len(MODES) * (2 * rounds + len(others)), desc=NAME, disable=not args.progress)
    first = run_modes(ws[args.probe], bm_args.warmup, bm_args.steps, rounds, bar)
    states = {"after first": process_state()}
    for n in others:
        run_modes(ws[n], bm_args.warmup, bm_args.steps, 1, bar)
        states[f"after {n}"] = process_state()
    last = run_modes(ws[args.probe], bm_args.warmup, bm_args.steps, rounds, bar)
    states["after last"] = process_state()
    bar.close()
    result = {"args": vars(args), "env": C.environment(), "probe": args.probe, "first": first, "last": last,
              "process": states}

    def report() -> None:
        C.print_table(f"{args.probe}: batches/s first -> last in one process (median of {rounds} rounds)",
                      ["mode", "first", "last", "last / first"],
                      [[k, C.median(first[k]), C.median(last[k]), C.median(last[k]) / C.median(first[k])]
                       for k in first])
        C.print_table("the process", ["after", "threads", "maps", "rss MiB"],
                      [[k, v["threads"], v["maps"], v["rss_mib"]] for k, v in states.items()])

    def plot(png: Path) -> None:
        plt = C.pyplot()
        fig, ax = plt.subplots(figsize=(7, 3.6))
        xs = range(len(first))
        ax.bar([x - 0.2 for x in xs], [C.median(v) for v in first.values()], 0.4, label="first")
        ax.bar([x + 0.2 for x in xs], [C.median(v) for v in last.values()], 0.4, label="last")
        ax.set_xticks(list(xs), list(first))
        ax.set_ylabel("batches/s")
        ax.set_title(f"{args.probe}: first vs after the other workloads, one process")
        ax.legend()
        C.save_figure(fig, png)
    return C.publish(args, NAME, result, plot, report)


if __name__ == "__main__":
    main()
