"""The suite's steps, most valuable first, at one of three sizes.

A step is a dict: ``name``; ``argv`` (run from the repository root; ``{h2d_gbps}`` is filled in from the
environment probe, ``{input}`` with the first of ``inputs`` there); ``share`` (its part of the budget left when
it starts, against the steps after it); ``needs`` (``"device"``: the ``--device`` works; ``"cuda"``: CUDA is
there); ``inputs`` (files an earlier step leaves in the output folder, any one will do: bench_modes' JSON, or its
stream when it was cut short); ``keep`` (files a step writes into the scratch folder that are copied into the
output folder when it ends: the PNGs beside them stay out, so the output folder keeps to ``OUT_FILES``).

Sizes (``SIZES``): ``gpu`` (``--device cuda``: the race at full size), ``cpu`` (``--device cpu``, the
rehearsal: the same steps, modes and workloads at small sizes, so a busy 2-core machine finishes each within
the default budget) and ``tiny`` (``--tiny``: toy sizes, one workload, the CI rehearsal).
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional

STEP_NAMES = ("equality", "bench_modes", "sync_audit", "cuda_tests", "pipeline_model")
# The only files the suite writes into its output folder: the device tool returns at most 8 files.
OUT_FILES = ("summary.json", "env.json", "log.txt", "tests.jsonl", "equality.json", "bench_modes.jsonl",
             "bench_modes.json", "pipeline_model.json")
CUDA_TESTS = ("tests/engine/test_transfer.py", "tests/dgl_frontend/test_structure.py",
              "tests/dgl_frontend/test_models_blocks.py",
              "tests/loading/test_oac.py", "tests/dgl_frontend/test_loader.py", "tests/test_config.py")
# "resident" (the table and its state on the device: the ceiling) beside the three pipelines
MODES = "sync,async,oac,resident"
# the node race at the default size; the KG race at a GPU's size: ComplEx, dim 256, 10M entities
WORKLOADS = "node-adam-128,kg-complex-256-10m"

# device_equality's and bench_modes' sizes. device_equality runs tasks x optimizers x dims (3 x 4 x 2 cases by
# default, each rewriting its JSON as it ends): on a GPU every case at depth 4 over 20 steps; on the CPU two
# optimizers at dim 257, in CI one. On a GPU bench_modes' warm-up is 72 steps (its AUTO_WARMUP: every
# configuration warms up past oac@auto's probe); the node race runs 2 rounds, the KG race 1 (each of its runs
# builds a 20.5 GB table); every configuration samples on the caller's thread, the DataLoader's default (sampling
# workers beside CUDA are unsafe: dgl_oac.dgl_frontend.loader.resolve_num_workers). With --device cpu it runs at
# --quick sizes (its own depth 4,
# 2 threads, 1 warm-up and 3 timed steps, one round, a 5k-node graph), every mode and both workloads: a 2-core
# machine shared with other work cannot run the race at a size worth timing within the budget, and the
# rehearsal checks the software and the plumbing, not the speed.
SIZES: Dict[str, Dict[str, List[str]]] = {
    "gpu": {"equality": ["--prefetch", "4", "--steps", "20"],
            "bench": ["--workload", WORKLOADS, "--prefetch", "4", "--target-prefetch", "4", "--priorities", "auto",
                      "--rounds", "2,1", "--steps", "24", "--warmup", "72"]},
    "cpu": {"equality": ["--optimizers", "rowwise_adagrad,adam", "--dim", "257", "--prefetch", "4", "--nodes",
                         "1000", "--steps", "8"],
            "bench": ["--quick", "--workload", WORKLOADS]},
    "tiny": {"equality": ["--optimizers", "rowwise_adagrad", "--dim", "16", "--prefetch", "4", "--nodes", "300",
                          "--steps", "6"],
             "bench": ["--quick", "--workload", "node-adam-128"]},
}
GPU_THREADS = 8  # bench_modes' torch threads on the GPU machine's 16 cores (the rest: gather, write-back)


def size_of(args: argparse.Namespace) -> str:
    return "tiny" if args.tiny else ("cpu" if args.device == "cpu" else "gpu")


def pytest_argv(label: str, files: List[str], out: Path) -> List[str]:
    """pytest without ``-x`` (a failure hides nothing after it), each report streamed to ``tests.jsonl``, the
    tests that concern CUDA first (``-ra`` comes from setup.cfg)."""
    return [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "gpu.pytest_stream",
            f"--outcome-stream={out / 'tests.jsonl'}", f"--outcome-label={label}", "--cuda-first", *files]


def plan(args: argparse.Namespace, out: Path, scratch: Path) -> List[Dict[str, Any]]:
    """The steps in the order they run (module docstring)."""
    py, dev, size = sys.executable, args.device, size_of(args)
    bench = [*SIZES[size]["bench"], "--modes", MODES]
    if size == "gpu":
        bench += ["--threads", str(args.threads or GPU_THREADS)]
    if not args.dgl_baseline:
        bench.append("--no-dgl")  # PyPI's DGL cannot put a batch's graphs on a GPU: no plain-DGL baseline there
    return [
        {"name": "equality", "share": 0.18, "needs": ["device"], "inputs": [], "keep": [],
         "argv": [py, "scripts/device_equality.py", "--device", dev, "--out", str(out / "equality.json"),
                  *SIZES[size]["equality"]]},
        {"name": "bench_modes", "share": 0.55, "needs": ["device"], "inputs": [], "keep": ["bench_modes.json"],
         "argv": [py, "benchmarks/bench_modes.py", "--device", dev, "--no-progress",
                  "--out", str(scratch / "bench_modes.json"), "--stream", str(out / "bench_modes.jsonl"), *bench]},
        {"name": "sync_audit", "share": 0.06, "needs": [], "inputs": [], "keep": [],
         "argv": pytest_argv("sync_audit", ["tests/engine/test_sync_audit.py"], out)},
        {"name": "cuda_tests", "share": 0.16, "needs": ["cuda"], "inputs": [], "keep": [],
         "argv": pytest_argv("cuda_tests", list(CUDA_TESTS), out)},
        {"name": "pipeline_model", "share": 0.05, "needs": [], "inputs": ["bench_modes.json", "bench_modes.jsonl"],
         "keep": ["pipeline_model.json"],
         "argv": [py, "benchmarks/pipeline_model.py", "--input", "{input}",
                  "--out", str(scratch / "pipeline_model.json"), "--cores", str(os.cpu_count() or 1),
                  "--h2d-gbps", "{h2d_gbps}"]},
    ]


def unmet(step: Dict[str, Any], device: str, cuda: bool, out: Optional[Path]) -> str:
    """Why ``step`` cannot run (``""``: it can): its first need that does not hold, or none of its inputs in
    ``out`` (``out=None``: only what is known before any step runs)."""
    for need in step["needs"]:
        if need == "cuda" and not cuda:
            return "no CUDA device (the environment probe: torch.cuda.is_available() is False)"
        if need == "device" and device != "cpu" and not cuda:
            return f"--device {device} but the environment probe found no CUDA device"
    if out is not None and step["inputs"] and first_input(step, out) is None:
        return f"needs {' or '.join(step['inputs'])}, which no earlier step left in {out}"
    return ""


def first_input(step: Dict[str, Any], out: Path) -> Optional[Path]:
    return next((out / name for name in step["inputs"] if (out / name).is_file()), None)
