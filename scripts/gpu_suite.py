"""The GPU suite, one command: set up from a folder of wheels (no network), then run the CUDA tests, oac == sync
bit for bit on the device (node, link, KG), the sync audit, and ``bench_modes`` on the device (sync, async@k,
oac@k, oac@auto) with ``pipeline_model``'s GPU prediction for the same settings. Everything lands in one folder,
``benchmarks/results/gpu/<UTC timestamp>/``: ``summary.json`` (each step's command, exit code, seconds and
verdict), ``env.json`` (GPU, torch, DGL, git commit, load), and each step's output files and logs. The budget
(``--budget``, 570 s by default) is split over the steps; a step that overruns is killed and marked so.

    python scripts/gpu_suite.py --wheels /path/to/wheels        # on the GPU machine (about 10 minutes)
    python scripts/gpu_suite.py --dry-run                       # print the plan, run nothing
    python scripts/gpu_suite.py --tiny --device cpu             # every step at toy sizes (CI, any machine)

The wheel folder (made once on a machine with network; the GPU machine has none). Its image has Python 3.12,
torch (CUDA) and DGL's dependencies (numpy, scipy, networkx, requests, tqdm, psutil: the device tool's list of
machine kinds), but not DGL, whose 1.1.3 wheels stop at Python 3.11, nor ogb::

    mkdir wheels
    pip download dgl==1.1.3 --no-deps --only-binary=:all: --python-version 3.11 \\
        --platform manylinux1_x86_64 -d wheels       # dgl-1.1.3-cp311-cp311-manylinux1_x86_64.whl (a CPU build)
    pip download ogb==1.3.6 outdated littleutils --no-deps -d wheels   # pure Python: dgl_oac.app.data imports ogb

Set-up: a DGL wheel whose tag does not match this interpreter is unzipped into ``--site`` and imported with
``DGL_FFI=ctypes`` (DGL's ctypes FFI: its Cython module is built for 3.11, its C library ``libdgl.so`` is not
tied to a Python version); every other wheel goes in with ``pip install --no-index --no-deps --target``. Nothing
is set up when ``import dgl`` already works. The steps run with ``PYTHONPATH=<site>:<repo>``.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Any, Dict, List

REPO = Path(__file__).resolve().parents[1]
CUDA_TESTS = ["tests/test_transfer.py", "tests/test_structure.py", "tests/test_models_blocks.py",
              "tests/test_oac.py", "tests/test_loader.py", "tests/test_config.py"]


def plan(args: argparse.Namespace, out: Path) -> List[Dict[str, Any]]:
    """The steps: ``name``, ``argv`` (run from the repository root), ``share`` of the budget."""
    py = sys.executable
    dev = args.device
    tiny = args.tiny
    eq = ["--nodes", "300", "--steps", "6", "--dim", "16"] if tiny else []
    bench = (["--quick", "--workload", "node-adam-128"] if tiny else
             ["--workload", args.workloads, "--prefetch", "4", "--target-prefetch", "4", "--threads",
              str(args.threads), "--priorities", "idle", "--rounds", "2", "--steps", "24", "--warmup", "48"])
    if dev != "cpu" and not args.dgl_baseline:
        bench.append("--no-dgl")  # PyPI's DGL cannot put a batch's graphs on a GPU: no plain-DGL baseline there
    return [
        {"name": "cuda_tests", "share": 0.20,
         "argv": [py, "-m", "pytest", "-q", "-x", *CUDA_TESTS, f"--junitxml={out / 'cuda_tests.xml'}"]},
        {"name": "equality", "share": 0.20,
         "argv": [py, "scripts/device_equality.py", "--device", dev, "--out", str(out / "equality.json"), *eq]},
        {"name": "sync_audit", "share": 0.05,
         "argv": [py, "-m", "pytest", "-q", "tests/test_sync_audit.py", f"--junitxml={out / 'sync_audit.xml'}"]},
        {"name": "bench_modes", "share": 0.50,
         "argv": [py, "benchmarks/bench_modes.py", "--device", dev, "--no-progress",
                  "--out", str(out / "bench_modes.json"), *bench]},
        {"name": "pipeline_model", "share": 0.05,
         "argv": [py, "benchmarks/pipeline_model.py", "--input", str(out / "bench_modes.json"),
                  "--out", str(out / "pipeline_model.json"), "--cores", str(os.cpu_count() or 1),
                  "--h2d-gbps", "{h2d_gbps}"]},
    ]


def dgl_importable(env: Dict[str, str]) -> bool:
    return subprocess.run([sys.executable, "-c", "import dgl"], env=env, capture_output=True).returncode == 0


def set_up(wheels: Path, site: Path, env: Dict[str, str]) -> Dict[str, Any]:
    """Install ``wheels`` into ``site`` (see the module docstring); returns what was done."""
    site.mkdir(parents=True, exist_ok=True)
    tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    done: Dict[str, Any] = {"site": str(site), "wheels": []}
    for whl in sorted(wheels.glob("*.whl")):
        if whl.name.startswith("dgl-") and f"-{tag}-" not in whl.name:
            with zipfile.ZipFile(whl) as z:
                z.extractall(site)
            env["DGL_FFI"] = "ctypes"  # the Cython FFI is built for another Python
            done["wheels"].append({"wheel": whl.name, "how": "unzipped, DGL_FFI=ctypes"})
        else:
            r = subprocess.run([sys.executable, "-m", "pip", "install", "--no-index", "--no-deps", "--target",
                                str(site), str(whl)], capture_output=True, text=True)
            done["wheels"].append({"wheel": whl.name, "how": "pip --no-index --target", "rc": r.returncode,
                                   "err": r.stderr[-2000:]})
    return done


def h2d_gbps() -> float:
    """Pinned host -> device copy bandwidth (GB/s), for the cost model; 0 without CUDA."""
    import torch

    if not torch.cuda.is_available():
        return 0.0
    src = torch.empty(256 << 20, dtype=torch.uint8, pin_memory=True)
    dst = torch.empty_like(src, device="cuda")
    dst.copy_(src, non_blocking=True)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(5):
        dst.copy_(src, non_blocking=True)
    torch.cuda.synchronize()
    return 5 * src.numel() / (time.perf_counter() - t0) / 1e9


def environment(env: Dict[str, str]) -> Dict[str, Any]:
    probe = ("import json, torch, dgl; print(json.dumps({'torch': torch.__version__, 'dgl': dgl.__version__, "
             "'cuda': torch.cuda.is_available(), 'gpu': torch.cuda.get_device_name() if torch.cuda.is_available() "
             "else None, 'python': __import__('sys').version}))")
    r = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True)
    git = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    info = json.loads(r.stdout) if r.returncode == 0 else {"probe_error": r.stderr[-2000:]}
    info.update(commit=git, loadavg=os.getloadavg(), cpus=os.cpu_count(), env_DGL_FFI=env.get("DGL_FFI"))
    return info


def run_step(step: Dict[str, Any], out: Path, env: Dict[str, str], limit: float) -> Dict[str, Any]:
    t0 = time.monotonic()
    with open(out / f"{step['name']}.log", "w") as log:
        try:
            rc = subprocess.run(step["argv"], cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
                                timeout=limit).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
    return {"name": step["name"], "argv": step["argv"], "rc": rc, "seconds": round(time.monotonic() - t0, 1),
            "limit_s": round(limit, 1), "ok": rc == 0}


def main(argv: List[str] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--wheels", type=Path, default=None, help="folder of wheels to set up from (no network)")
    p.add_argument("--site", type=Path, default=Path(tempfile.gettempdir()) / "dgl-oac-gpu-site",
                   help="where --wheels are installed (outside the results folder, which is committed)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--out", type=Path, default=None, help="default benchmarks/results/gpu/<UTC timestamp>")
    p.add_argument("--budget", type=float, default=570.0, help="seconds for all steps together")
    p.add_argument("--workloads", default="node-adam-128,kg-adagrad-256", help="bench_modes --workload")
    p.add_argument("--threads", type=int, default=8, help="torch threads of the benchmark's caller")
    p.add_argument("--dgl-baseline", action="store_true",
                   help="keep bench_modes' plain-DGL baseline on the device (needs DGL's CUDA build)")
    p.add_argument("--tiny", action="store_true", help="toy sizes: every step in about a minute on a CPU")
    p.add_argument("--dry-run", action="store_true", help="print the plan as JSON and run nothing")
    p.add_argument("--only", default="", help="comma-separated step names to run (default: all)")
    args = p.parse_args(argv)
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    out = (args.out or REPO / "benchmarks" / "results" / "gpu" / stamp).resolve()
    steps = plan(args, out)
    if args.only:
        keep = set(args.only.split(","))
        unknown = keep - {s["name"] for s in steps}
        if unknown:
            p.error(f"--only: unknown step(s) {sorted(unknown)}; steps: {[s['name'] for s in steps]}")
        steps = [s for s in steps if s["name"] in keep]
    if args.dry_run:
        print(json.dumps({"out": str(out), "steps": steps}, indent=2))
        return 0
    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    site = args.site.resolve()
    env["PYTHONPATH"] = os.pathsep.join([str(site), str(REPO), env.get("PYTHONPATH", "")])
    summary: Dict[str, Any] = {"started": stamp, "args": {k: str(v) for k, v in vars(args).items()}}
    if args.wheels is not None and not dgl_importable(env):
        summary["setup"] = set_up(args.wheels, site, env)
    summary["env"] = environment(env)
    (out / "env.json").write_text(json.dumps(summary["env"], indent=2) + "\n")
    gbps = h2d_gbps() if args.device.startswith("cuda") else 0.0
    summary["h2d_gbps"] = gbps
    summary["steps"] = []
    for step in steps:
        step["argv"] = [a.replace("{h2d_gbps}", f"{gbps or 12.0:.1f}") for a in step["argv"]]
        summary["steps"].append(run_step(step, out, env, step["share"] * args.budget))
        (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    ok = all(s["ok"] for s in summary["steps"])
    print(json.dumps({"out": str(out), "ok": ok, "steps": [(s["name"], s["rc"], s["seconds"])
                                                           for s in summary["steps"]]}))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
