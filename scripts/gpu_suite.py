"""The GPU suite, one command that reports whatever happens: set up from a folder of wheels (no network), probe
the environment, then, most valuable first, oac == sync bit for bit on the device (``device_equality``), the
node and KG races (``bench_modes``: sync, async@4, oac@4, oac@auto, resident), the sync audit, the CUDA tests
(no ``-x``) and ``pipeline_model``'s GPU prediction.

    DGLBACKEND=pytorch python3 scripts/gpu_suite.py --wheels wheels --out "$OUT/gpu"   # the GPU machine
    python scripts/gpu_suite.py --dry-run                 # print the plan, run nothing
    python scripts/gpu_suite.py --tiny --device cpu --out /tmp/gpu-tiny   # every step at toy sizes (CI)
    bash scripts/gpu_rehearsal.sh                         # the GPU machine's software, here, on the CPU

Everything lands in ``--out`` (default ``$OUT/gpu`` where ``$OUT`` is set, as on the device machine, else
``benchmarks/results/gpu/<UTC timestamp>``), at most 8 files (``gpu.plan.OUT_FILES``), each written as it goes:
``summary.json``, rewritten at the start and whenever a step starts or ends (each step's status: ``ok``,
``failed``, ``timeout``, ``skipped`` with its reason, a missing input, or ``out_of_time``; its exit code,
seconds, limit, byte range in the log and the log's tail); ``env.json``; ``log.txt`` (every step's output,
streamed); ``tests.jsonl`` (one flushed line per test report); ``bench_modes.jsonl`` (one flushed line per
finished configuration); then the result JSONs. A step that fails or is killed never stops the next one. The
budget (``--budget``, 340 s: one device command of 6 minutes with set-up) counts from the start; each step gets
its share of what is left, so unused time passes on.

The wheel folder is made once on a machine with network (docs/guides/gpu.md); set-up: ``gpu.wheels``.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import signal
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Dict, List, Optional

from gpu import plan as P
from gpu.probe import machine, probe
from gpu.runner import STOP, Budget, Stopped, run_step, write_json
from gpu.wheels import REPO, set_up, step_env


def parse(argv: Optional[List[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--wheels", type=Path, default=None, help="folder of wheels to set up from (no network)")
    p.add_argument("--site", type=Path, default=Path(tempfile.gettempdir()) / "dgl-oac-gpu-site",
                   help="where --wheels are installed")
    p.add_argument("--device", default="cuda", help="cuda, cuda:N, or cpu (the rehearsal: smaller sizes)")
    p.add_argument("--out", type=Path, default=None, help="$OUT/gpu where $OUT is set, else "
                   "benchmarks/results/gpu/<UTC timestamp>; must be new or empty")
    p.add_argument("--budget", type=float, default=340.0, help="seconds for set-up and all steps together")
    p.add_argument("--threads", type=int, default=None, help="bench_modes' torch threads on a GPU (default: 8; "
                   "with --device cpu its --quick sizes use 2)")
    p.add_argument("--dgl-baseline", action="store_true",
                   help="keep bench_modes' plain-DGL baseline (on a GPU it needs DGL's CUDA build)")
    p.add_argument("--tiny", action="store_true", help="toy sizes: every step in about a minute on a CPU")
    p.add_argument("--dry-run", action="store_true", help="print the plan as JSON and run nothing")
    p.add_argument("--only", default="", help=f"comma-separated steps to run (default: all): {P.STEP_NAMES}")
    args = p.parse_args(argv)
    unknown = set(filter(None, args.only.split(","))) - set(P.STEP_NAMES)
    if unknown:
        p.error(f"--only: unknown step(s) {sorted(unknown)}; steps: {list(P.STEP_NAMES)}")
    if args.budget <= 0:
        p.error(f"--budget must be positive, got {args.budget}")
    return args


def out_dir(args: argparse.Namespace, stamp: str) -> Path:
    if args.out is not None:
        return args.out.resolve()
    if os.environ.get("OUT"):
        return Path(os.environ["OUT"], "gpu").resolve()
    return REPO / "benchmarks" / "results" / "gpu" / stamp


def env_step(args: argparse.Namespace, env: Dict[str, str], out: Path) -> Dict[str, Any]:
    """Set-up and the probe, as the summary's first step; the probe's facts go to ``env.json`` too."""
    t0 = time.monotonic()
    rec: Dict[str, Any] = {"name": "env", "status": "ok"}
    if args.wheels is not None:
        try:
            rec["setup"] = set_up(args.wheels.resolve(), args.site.resolve(), env)
        except (OSError, ValueError) as exc:
            rec.update(status="failed", setup_error=repr(exc))
    info = {**probe(env, args.device), **machine(), "DGL_FFI": env.get("DGL_FFI"), "DGLBACKEND": env["DGLBACKEND"]}
    write_json(out / "env.json", info)
    if "probe_error" in info:
        rec["status"] = "failed"
    rec.update(env=info, seconds=round(time.monotonic() - t0, 1))
    return rec


def run_all(args: argparse.Namespace, out: Path, scratch: Path, steps: List[Dict[str, Any]],
            summary: Dict[str, Any], budget: Budget) -> None:
    """The env step, then every step in order, the summary rewritten around each."""
    path = out / "summary.json"
    env = step_env(args.site.resolve())
    summary["steps"][0] = env_step(args, env, out)
    write_json(path, summary)
    info = summary["steps"][0]["env"]
    h2d = f"{info.get('h2d_gbps') or 12.0:.1f}"  # the cost model's GPU link; a guess without a GPU
    cuda = bool(info.get("cuda"))
    # the shares of the steps after this one that can run (no CUDA: the CUDA tests' share goes to the rest)
    later = [sum(s["share"] for s in steps[i + 1:] if not P.unmet(s, args.device, cuda, None))
             for i in range(len(steps))]
    for i, step in enumerate(steps):
        rec = summary["steps"][i + 1]
        reason = P.unmet(step, args.device, cuda, out)
        limit = budget.limit(step["share"], later[i])
        status = "skipped"
        if not reason and limit < 1.0:
            status, reason = "out_of_time", f"the budget ({args.budget:.0f} s) was spent before it"
        if reason:
            rec.update(status=status, reason=reason)
            print(f"[gpu_suite] {step['name']}: {status}: {reason}", flush=True)
            write_json(path, summary)
            continue
        given = {"{h2d_gbps}": h2d, "{input}": str(P.first_input(step, out))}
        argv = [given.get(a, a) for a in step["argv"]]
        rec.update(status="running", argv=argv, limit_s=round(limit, 1))
        write_json(path, summary)
        print(f"[gpu_suite] {step['name']}: running, limit {limit:.0f} s", flush=True)
        try:
            rec.update(run_step(step["name"], argv, out / "log.txt", env, limit))
        finally:
            for name in step["keep"]:
                if (scratch / name).is_file():
                    shutil.copyfile(scratch / name, out / name)
        print(f"[gpu_suite] {step['name']}: {rec['status']} (rc {rec['rc']}) in {rec['seconds']} s", flush=True)
        write_json(path, summary)


def main(argv: Optional[List[str]] = None) -> int:
    args = parse(argv)
    started = time.monotonic()
    budget = Budget(args.budget)
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    out = out_dir(args, stamp)
    scratch = Path(tempfile.mkdtemp(prefix="dgl-oac-gpu-scratch-"))
    steps = P.plan(args, out, scratch)
    if args.only:
        steps = [s for s in steps if s["name"] in args.only.split(",")]
    if args.dry_run:
        shutil.rmtree(scratch)
        print(json.dumps({"out": str(out), "size": P.size_of(args), "budget_s": args.budget, "steps": steps},
                         indent=2))
        return 0
    if out.exists() and any(out.iterdir()):
        sys.exit(f"gpu_suite: --out {out} already holds files; pass a new or empty folder")
    out.mkdir(parents=True, exist_ok=True)
    summary: Dict[str, Any] = {
        "suite": "gpu_suite", "started": stamp, "status": "running", "out": str(out), "size": P.size_of(args),
        "budget_s": args.budget, "args": {k: str(v) for k, v in vars(args).items()},
        "steps": [{"name": "env", "status": "pending"}] + [{"name": s["name"], "status": "pending",
                                                             "share": s["share"]} for s in steps]}
    write_json(out / "summary.json", summary)
    STOP.pending = ""
    before = {sig: signal.signal(sig, STOP.handler) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        run_all(args, out, scratch, steps, summary, budget)
        summary["status"] = "done"
    except Stopped as exc:
        summary["status"] = f"stopped by {exc}"
        for rec in summary["steps"]:
            if rec["status"] in ("running", "pending"):
                rec["status"] = "interrupted" if rec["status"] == "running" else "not run"
    except Exception:  # a bug of the suite's own: on record with what ran before it, then raised
        summary["status"] = "crashed"
        summary["traceback"] = traceback.format_exc()
        raise
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
        shutil.rmtree(scratch, ignore_errors=True)
        summary["seconds"] = round(time.monotonic() - started, 1)
        summary["files"] = sorted(p.name for p in out.iterdir())
        write_json(out / "summary.json", summary)
    bad = [s["name"] for s in summary["steps"] if s["status"] not in ("ok", "skipped")]
    print(json.dumps({"out": str(out), "status": summary["status"], "seconds": summary["seconds"],
                      "steps": [(s["name"], s["status"], s.get("seconds")) for s in summary["steps"]]}))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
