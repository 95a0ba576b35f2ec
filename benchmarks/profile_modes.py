"""Where each mode's time goes, by thread: a sampling profile of bench_modes' workload, one mode at a time.

Each configuration runs in its own child process (the same workload and code path as ``bench_modes.py``:
same graph, task, warm-up and timed steps) under a sampling profiler: ``py-spy`` when it is installed
(``--native`` adds C++ frames, e.g. which torch op inside the commit), otherwise a built-in sampler thread
reading ``sys._current_frames()`` (Python frames only). Samples are attributed to pipeline parts by the
functions on the stack (main thread: only while the timed window runs; background threads: their whole life)
and reported as milliseconds per step, per thread, side by side for every configuration.

    python benchmarks/profile_modes.py                      # async@4, oac@4, sync, dgl
    python benchmarks/profile_modes.py --native             # with py-spy: torch ops by name
    python benchmarks/profile_modes.py --quick
"""
from __future__ import annotations

import collections
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _omp  # noqa: E402,F401  (OMP_WAIT_POLICY must be set before torch loads)
import torch  # noqa: E402
from tqdm.auto import tqdm  # noqa: E402

import _common as C  # noqa: E402

NAME = "profile_modes"
# (part, substrings that must all occur on the stack), first match wins; main-thread parts
MAIN_PARTS: List[Tuple[str, Tuple[str, ...]]] = [
    ("sample", ("_Epoch._sample",)),
    ("sample", ("_PrefetchingIter",)),                       # plain DGL's DataLoader
    ("wait for gather thread", ("Worker.result",)),
    ("gather (caller thread)", ("gather_rows",)),
    ("emb(ids): gather (dgl) / batch lookup (dgl-oac)", ("_TimedEmbedding.__call__",)),
    ("validate: patch", ("HandOut.__call__", "WriteLog.patch")),
    ("hand-out: leaf copy, bookkeeping", ("HandOut.__call__",)),
    ("commit: re-validate patch", ("commit", "WriteLog.patch")),
    ("commit: finite check", ("commit", "isfinite")),
    ("commit: finite check", ("commit", "THPVariable_all")),
    ("commit: row kernel", ("update_rows",)),
    ("commit: log append", ("WriteLog.append",)),
    ("commit: write-through (sync)", ("_apply", "RowStore.write")),
    ("commit: other (finite check w/o --native, delta, queue)", ("commit_step",)),
    ("sparse step: rest (dgl: all of it)", ("step_sparse",)),
    ("backward", ("backward",)),
    ("forward + loss", ("NodeTask.step",)),
]
BG_PARTS: List[Tuple[str, Tuple[str, ...]]] = [
    ("gather: index_select", ("RowStore.gather",)),
    ("gather: other", ("gather_rows",)),
    ("write-back: table update", ("WriteBack._apply",)),
    ("queue wait", ("stage.py",)),
]


def parse(argv: Optional[List[str]] = None):
    p = C.base_parser(__doc__.split("\n\n")[0], NAME)
    p.add_argument("--modes", default="async@4,oac@4,sync,dgl", help="configurations (mode@prefetch)")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--warmup", type=int, default=12)
    p.add_argument("--rate", type=int, default=100, help="samples per second")
    p.add_argument("--native", action="store_true", help="py-spy --native (C++ frames; slower sampling)")
    p.add_argument("--sampler", choices=("auto", "py-spy", "builtin"), default="auto")
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's choice)")
    p.add_argument("--bench-args", default="", help="extra bench_modes.py options for the workload, quoted")
    p.add_argument("--child", default=None, help=argparse_suppress())
    args = p.parse_args(argv)
    if args.quick:
        args.steps, args.warmup, args.rate = 8, 2, 200
        if args.modes == "async@4,oac@4,sync,dgl":
            args.modes = "oac@4,dgl"
        args.bench_args = (args.bench_args + " --quick").strip()
    return args


def argparse_suppress() -> str:
    import argparse
    return argparse.SUPPRESS


# ------------------------------------------------------------------------------------------------- sampling
class BuiltinSampler:
    """py-spy's raw format from inside the process: ``thread (id): name;frame;frame count`` lines."""

    def __init__(self, rate: int) -> None:
        self.period = 1.0 / rate
        self.counts: collections.Counter = collections.Counter()
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, name="bench-sampler", daemon=True)

    def start(self) -> "BuiltinSampler":
        self._t.start()
        return self

    def _run(self) -> None:
        me = threading.get_ident()
        names = {}
        while not self._stop.wait(self.period):
            for t in threading.enumerate():
                names[t.ident] = t.name
            for tid, frame in sys._current_frames().items():
                if tid == me:
                    continue
                stack = []
                while frame is not None:
                    code = frame.f_code
                    stack.append(f"{getattr(code, 'co_qualname', code.co_name)} "
                                 f"({short(code.co_filename)}:{frame.f_lineno})")
                    frame = frame.f_back
                self.counts[";".join([f"thread ({tid}): {names.get(tid, '?')}"] + stack[::-1])] += 1

    def stop(self, path: Path) -> None:
        self._stop.set()
        self._t.join()
        path.write_text("".join(f"{k} {v}\n" for k, v in self.counts.items()))


def short(filename: str) -> str:
    for marker in ("/dgl_oac/", "/dgl/", "/torch/"):
        if marker in filename:
            return marker[1:] + filename.split(marker, 1)[1]
    return os.path.basename(filename)


def child(args) -> None:
    import bench_modes

    spec = json.loads(args.child)
    bargs = bench_modes.parse(spec["bench_args"].split())
    from dgl_oac.data import load

    ds = load("synthetic", num_nodes=bargs.num_nodes, avg_degree=bargs.avg_degree, power=bargs.power, task="node",
              seed=bargs.seed)
    mode, _, depth = spec["config"].partition("@")
    threads = spec["threads"] or torch.get_num_threads()
    cfg = {"mode": mode, "prefetch": int(depth or 1), "threads": threads}
    # warm the process up with modes that start no background threads: every gather / write-back thread
    # sampled below belongs to the profiled run
    bench_modes.run_one(ds, bargs, {**cfg, "mode": "sync" if mode != "dgl" else "dgl"}, 1, 2)
    sampler = BuiltinSampler(spec["rate"]).start() if spec["builtin"] else None
    res = bench_modes.run_one(ds, bargs, cfg, spec["warmup"], spec["steps"])
    if sampler is not None:
        sampler.stop(Path(spec["raw"]))
    print(json.dumps({"batches_per_s": res["batches_per_s"], "wall_s": res["wall_s"], "steps": res["batches"],
                      "warmup": spec["warmup"],
                      "stages": res.get("stages"), "torch_threads": threads}))


# -------------------------------------------------------------------------------------------------- parent
def classify(raw: Path, rate: int, steps: int, warmup: int) -> Dict[str, Any]:
    """ms per step by (thread role, part). The caller thread is counted inside the timed window only; the
    background threads live through warm-up and timed steps, so their samples are spread over both."""
    parts: Dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for line in raw.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if not stack:
            continue
        frames = stack.split(";")
        thread = frames[0]
        if "MainThread" in thread:
            if not any("_timed_window" in f for f in frames):
                continue
            role, table = "main", MAIN_PARTS
        elif "gather" in thread:
            role, table = "gather thread", BG_PARTS
        elif "writeback" in thread:
            role, table = "write-back thread", BG_PARTS
        else:
            continue
        part = "other"
        for name, needles in table:
            if all(any(nd in f for f in frames) for nd in needles):
                part = name
                break
        parts[role][part] += int(n)
    scale = {role: 1e3 / rate / (steps if role == "main" else steps + warmup) for role in parts}
    return {role: {k: v * scale[role] for k, v in sorted(c.items(), key=lambda kv: -kv[1])}
            for role, c in parts.items()}


def main(argv: Optional[List[str]] = None) -> Dict[str, Any]:
    args = parse(argv)
    if args.child:
        child(args)
        return {}
    env = C.environment()
    pyspy = shutil.which("py-spy")
    use_pyspy = args.sampler == "py-spy" or (args.sampler == "auto" and pyspy is not None)
    if use_pyspy and pyspy is None:
        raise SystemExit("--sampler py-spy: py-spy is not installed (pip install py-spy)")
    configs = [m.strip() for m in args.modes.split(",") if m.strip()]
    result: Dict[str, Any] = {"benchmark": NAME, "env": env, "args": vars(args),
                              "sampler": ("py-spy" + (" --native" if args.native else "")) if use_pyspy
                              else "builtin", "configs": {}}
    bar = tqdm(configs, desc=NAME, disable=not args.progress, dynamic_ncols=True)
    with tempfile.TemporaryDirectory(prefix="dgl-oac-profile-") as tmp:
        for cfg in bar:
            bar.set_postfix_str(cfg)
            raw = Path(tmp) / f"{cfg.replace('@', '_')}.txt"
            spec = {"config": cfg, "bench_args": args.bench_args, "warmup": args.warmup, "steps": args.steps,
                    "rate": args.rate, "threads": args.threads, "builtin": not use_pyspy, "raw": str(raw)}
            cmd = [sys.executable, str(Path(__file__).resolve()), "--child", json.dumps(spec)]
            if args.omp_wait_policy:
                cmd += ["--omp-wait-policy", args.omp_wait_policy]
            if use_pyspy:
                cmd = [pyspy, "record", "-r", str(args.rate), "-f", "raw", "-o", str(raw), "--threads"] + \
                      (["--native"] if args.native else []) + ["--"] + cmd
            t = time.perf_counter()
            proc = subprocess.run(cmd, capture_output=True, text=True)
            line = next((ln for ln in reversed(proc.stdout.splitlines()) if ln.startswith("{")), None)
            if proc.returncode != 0 or line is None or not raw.exists():
                result["configs"][cfg] = {"error": f"exit {proc.returncode}: {(proc.stderr or '')[-1500:]}"}
                continue
            info = json.loads(line)
            result["configs"][cfg] = {**info, "profile_wall_s": time.perf_counter() - t,
                                      "ms_per_step": classify(raw, args.rate, info["steps"], info["warmup"])}
    return C.publish(args, NAME, result, lambda png: plot(result, png), lambda: report(result))


def report(result: Dict[str, Any]) -> None:
    for cfg, r in result["configs"].items():
        if "error" in r:
            print(f"\n{cfg}: ERROR {r['error'][-500:]}")
            continue
        rows = []
        for role, parts in r["ms_per_step"].items():
            for part, ms in parts.items():
                rows.append([role, part, ms])
        C.print_table(f"{cfg}: {r['batches_per_s']:.2f} batches/s = {1e3 / r['batches_per_s']:.1f} ms per step "
                      f"(profiled run; sampler {result['sampler']})", ["thread", "part", "ms/step"], rows)


def plot(result: Dict[str, Any], png: Path) -> None:
    plt = C.pyplot()
    cfgs = [c for c, r in result["configs"].items() if "ms_per_step" in r]
    if not cfgs:
        return
    roles = ["main", "gather thread", "write-back thread"]
    fig, axes = plt.subplots(1, len(roles), figsize=(6 * len(roles), 4.8), sharey=True)
    for ax, role in zip(axes, roles):
        names: List[str] = []
        for c in cfgs:
            for k in result["configs"][c]["ms_per_step"].get(role, {}):
                if k not in names:
                    names.append(k)
        bottom = [0.0] * len(cfgs)
        cmap = plt.get_cmap("tab20")
        for i, part in enumerate(names):
            vals = [result["configs"][c]["ms_per_step"].get(role, {}).get(part, 0.0) for c in cfgs]
            ax.bar(range(len(cfgs)), vals, bottom=bottom, label=part, color=cmap(i % 20))
            bottom = [b + v for b, v in zip(bottom, vals)]
        if role == "main":
            ax.plot(range(len(cfgs)), [1e3 / result["configs"][c]["batches_per_s"] for c in cfgs], "k_", ms=30,
                    mew=2, label="wall ms / step")
        ax.set_xticks(range(len(cfgs)), cfgs)
        ax.set_title(role)
        ax.set_ylabel("ms per step (sampled)")
        ax.legend(fontsize=6, loc="upper left")
    fig.suptitle(f"sampling profile per thread ({result['sampler']})", fontsize=10)
    C.save_figure(fig, png)


if __name__ == "__main__":
    main()
