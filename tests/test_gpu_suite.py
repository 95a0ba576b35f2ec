"""scripts/gpu_suite.py on CPU: its plan (dry run), its offline set-up from a folder of wheels (a DGL wheel for
another Python is unzipped and switched to DGL's ctypes FFI; others go through pip --no-index), and a step that
overruns its share of the budget is killed and reported. (The full --tiny run takes minutes: run it by hand.)"""
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import gpu_suite  # noqa: E402


def test_dry_run_prints_every_step_and_runs_nothing(tmp_path):
    out = subprocess.run([sys.executable, "scripts/gpu_suite.py", "--dry-run", "--out", str(tmp_path / "r")],
                         cwd=ROOT, capture_output=True, text=True, check=True).stdout
    plan = json.loads(out)
    assert [s["name"] for s in plan["steps"]] == ["cuda_tests", "equality", "sync_audit", "bench_modes",
                                                  "pipeline_model"]
    assert sum(s["share"] for s in plan["steps"]) <= 1.0
    assert all(Path(ROOT, s["argv"][1]).exists() or s["argv"][1] == "-m" for s in plan["steps"])
    assert not (tmp_path / "r").exists()
    bench = next(s for s in plan["steps"] if s["name"] == "bench_modes")["argv"]
    assert "--no-dgl" in bench and "cuda" in bench, "PyPI's DGL: no plain-DGL baseline on the device"


def test_only_names_unknown_steps():
    r = subprocess.run([sys.executable, "scripts/gpu_suite.py", "--dry-run", "--only", "bench"], cwd=ROOT,
                       capture_output=True, text=True)
    assert r.returncode != 0 and "unknown step(s) ['bench']" in r.stderr


def test_set_up_unzips_a_dgl_wheel_for_another_python(tmp_path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    with zipfile.ZipFile(wheels / "dgl-1.1.3-cp39-cp39-manylinux1_x86_64.whl", "w") as z:
        z.writestr("dgl/__init__.py", "__version__ = 'fake'\n")
    env = {}
    done = gpu_suite.set_up(wheels, tmp_path / "site", env)
    assert (tmp_path / "site" / "dgl" / "__init__.py").exists() and env["DGL_FFI"] == "ctypes"
    assert done["wheels"] == [{"wheel": "dgl-1.1.3-cp39-cp39-manylinux1_x86_64.whl",
                               "how": "unzipped, DGL_FFI=ctypes"}]


def test_a_step_over_its_limit_is_killed_and_reported(tmp_path):
    step = {"name": "slow", "argv": [sys.executable, "-c", "import time; time.sleep(30)"]}
    res = gpu_suite.run_step(step, tmp_path, {}, limit=1.0)
    assert res["rc"] == "timeout" and not res["ok"] and res["seconds"] < 10
    assert (tmp_path / "slow.log").exists()
