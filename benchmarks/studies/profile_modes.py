"""Where each mode's time goes, by pipeline stage: bench_modes' workload under torch.profiler, one mode at a time.

dgl-oac marks its stages with ``torch.profiler.record_function`` under the names in ``STAGES`` (the write-back
thread's ``dgl_oac.engine.table``; ``dgl_oac.wait`` is the caller waiting for the gather thread). Each configuration
runs bench_modes' workload (same graph, task, warm-up and timed steps) with the profiler recording every thread
during the timed steps only; the stages' ranges are summed by name (``key_averages``) and reported as
milliseconds per step, next to the wall time per step. Stages on different threads overlap, so they do not add
up to the step, and the staleness rules' ranges (``RULES``) run inside the commit's and the hand-out's. An
expected stage the profile does not contain is reported as not recorded.

    python benchmarks/studies/profile_modes.py            # async@4, oac@4, sync, dgl
    python benchmarks/studies/profile_modes.py --quick
    python benchmarks/studies/profile_modes.py --modes async@4,async-gap@4,async-lookahead@4 --threads 1   # the rules
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the shared helpers

import _omp  # noqa: E402,F401  (OMP_WAIT_POLICY must be set before torch loads)
import torch  # noqa: E402
from tqdm.auto import tqdm  # noqa: E402

import _common as C  # noqa: E402
import bench_modes  # noqa: E402

NAME = "profile_modes"
PIPELINE = ("dgl_oac.sample", "dgl_oac.gather", "dgl_oac.copy", "dgl_oac.validate", "dgl_oac.commit",
            "dgl_oac.writeback", "dgl_oac.wait")
# async's staleness rules (dgl_oac.baselines.staleness): the catch-up to the current rows (commit), Gap-Aware's gap and
# step size (commit), look-ahead's drift (hand-out; Adam rows only)
RULES = ("dgl_oac.catch_up", "dgl_oac.gap", "dgl_oac.step_size", "dgl_oac.lookahead")
STAGES = PIPELINE + RULES
# sync has no background threads (nothing to wait for, no write-back thread); plain DGL has no dgl-oac stages
EXPECTED = {"sync": PIPELINE[:5], "async": PIPELINE, "oac": PIPELINE, "dgl": (),
            "async-gap": PIPELINE + RULES[:3], "async-lookahead": PIPELINE + (RULES[0], RULES[3])}


def parse(argv: Optional[List[str]] = None):
    p = C.base_parser(__doc__.split("\n\n")[0], NAME)
    p.add_argument("--modes", default="async@4,oac@4,sync,dgl",
                   help="configurations (mode@prefetch; async-gap@4, async-lookahead@4: async with a staleness rule)")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--warmup", type=int, default=12)
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's choice)")
    p.add_argument("--bench-args", default="",
                   help="extra bench_modes.py options for the workload (the first of its --workload), quoted")
    args = p.parse_args(argv)
    if args.quick:
        args.steps, args.warmup = 8, 2
        if args.modes == "async@4,oac@4,sync,dgl":
            args.modes = "oac@4,dgl"
        args.bench_args = (args.bench_args + " --quick").strip()
    return args


def profiler() -> torch.profiler.profile:
    # profile_all_threads: without it the profiler records none of the gather and write-back threads, which
    # start with the epoch, before the profiler (during the warm-up)
    return torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                  experimental_config=torch.profiler._ExperimentalConfig(profile_all_threads=True))


def stage_ms(events: Iterable[Any], expected: Sequence[str], steps: int) -> Dict[str, Any]:
    """ms per step inside each stage's ranges (all threads) from ``events`` (a profiler's ``key_averages()``),
    and which ``expected`` stages they do not contain."""
    us = {e.key: e.cpu_time_total for e in events if e.key in STAGES}
    return {"ms_per_step": {s: us[s] / 1e3 / steps for s in STAGES if s in us},
            "not_recorded": [s for s in expected if s not in us]}


def main(argv: Optional[List[str]] = None) -> Dict[str, Any]:
    args = parse(argv)
    env = C.environment()
    bargs = bench_modes.parse(args.bench_args.split())
    bargs = bench_modes.W.settings(bargs, bargs.workloads[0])
    ds = bench_modes.workload(bargs)
    threads = args.threads or torch.get_num_threads()
    configs = C.str_list(args.modes)
    result: Dict[str, Any] = {"benchmark": NAME, "env": env, "args": vars(args), "workload_args": vars(bargs),
                              "torch_threads": threads, "stages": list(STAGES), "configs": {}}
    bench_modes.warm_up(ds, bargs, threads)
    for cfg in tqdm(configs, desc=NAME, disable=not args.progress, dynamic_ncols=True):
        mode, _, depth = cfg.partition("@")
        prof = profiler()
        res = bench_modes.run_one(ds, bargs, {"mode": mode, "prefetch": int(depth or 1), "threads": threads},
                                  args.warmup, args.steps, window=prof)
        result["configs"][cfg] = {"batches_per_s": res["batches_per_s"], "steps": res["batches"],
                                  "loader_stages_s": res.get("stages"), "expected": list(EXPECTED[mode]),
                                  **stage_ms(prof.key_averages(), EXPECTED[mode], res["batches"])}
    torch.set_num_threads(env["torch_threads_default"])
    return C.publish(args, NAME, result, lambda png: plot(result, png), lambda: report(result))


def report(result: Dict[str, Any]) -> None:
    for cfg, r in result["configs"].items():
        C.print_table(f"{cfg}: {r['batches_per_s']:.2f} batches/s = {1e3 / r['batches_per_s']:.1f} ms per step "
                      f"(profiled run)", ["stage", "ms/step"], list(r["ms_per_step"].items()))
        if r["not_recorded"]:
            print(f"{cfg}: expected stages not recorded: {', '.join(r['not_recorded'])} "
                  f"(no record_function range of that name ran during the timed steps)")


def plot(result: Dict[str, Any], png: Path) -> None:
    plt = C.pyplot()
    cfgs = list(result["configs"])
    names = [*STAGES, "wall (step)"]
    fig, ax = plt.subplots(figsize=(9, 1.5 + 0.25 * len(names) * max(1, len(cfgs))))
    h = 0.8 / max(1, len(cfgs))
    for i, c in enumerate(cfgs):
        r = result["configs"][c]
        vals = [r["ms_per_step"].get(s, 0.0) for s in STAGES] + [1e3 / r["batches_per_s"]]
        ax.barh([j + i * h for j in range(len(names))], vals, height=h, label=c)
    ax.set_yticks([j + h * (len(cfgs) - 1) / 2 for j in range(len(names))], names, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("ms per step (time inside the stage's ranges, all threads)")
    missing = sorted({s for r in result["configs"].values() for s in r["not_recorded"]}, key=STAGES.index)
    ax.set_title("torch.profiler, by dgl-oac stage" + (f"\nnot recorded: {', '.join(missing)}" if missing else ""),
                 fontsize=9)
    ax.legend(fontsize=8)
    ax.grid(axis="x", alpha=0.3)
    C.save_figure(fig, png)


if __name__ == "__main__":
    main()
