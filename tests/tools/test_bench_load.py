"""benchmarks/bench_load.py (issue 39): its children's environment, its summary's ratios, and its plain-torch
reference loop (the measurement itself is a benchmark: ``python benchmarks/bench_load.py``)."""
from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_load  # noqa: E402


def test_children_get_the_users_environment_without_openmp_settings(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("GOMP_SPINCOUNT", "10")
    monkeypatch.setenv("OMP_WAIT_POLICY", "active")
    default, passive = bench_load.child_env("default"), bench_load.child_env("passive")
    assert not any(k.startswith(("OMP_", "GOMP_")) for k in default)
    assert passive["OMP_WAIT_POLICY"] == "PASSIVE" and "OMP_NUM_THREADS" not in passive
    assert default["PATH"] == passive["PATH"]


def test_summary_is_the_median_per_condition_over_quiet():
    rows = [{"workload": "kg", "config": "oac@4", "policy": "default", "condition": c, "steps_per_s": v}
            for c, v in [("quiet", 10.0), ("quiet", 12.0), ("burner", 2.0), ("burner", 4.0), ("trainer", 5.5)]]
    (s,) = bench_load.summarize(rows)
    assert s["quiet_steps_per_s"] == 11.0 and s["burner/quiet"] == 3.0 / 11.0 and s["trainer/quiet"] == 0.5


def test_a_condition_not_run_is_nan_not_zero():
    rows = [{"workload": "kg", "config": "torch", "policy": "passive", "condition": "quiet", "steps_per_s": 4.0}]
    (s,) = bench_load.summarize(rows)
    assert math.isnan(s["burner/quiet"]) and math.isnan(s["trainer/quiet"])


def test_the_torch_reference_runs_and_reports_its_rate():
    out = subprocess.run([sys.executable, "benchmarks/bench_load.py", "--child-reference", "--steps", "2"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert float(out.stdout.split()[-1]) > 0


def test_quiet_is_required():
    out = subprocess.run([sys.executable, "benchmarks/bench_load.py", "--conditions", "burner"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "must include quiet" in out.stderr


def test_configs_keep_the_priority_and_drop_the_thread_count():
    """oac@4 at normal priority is its own configuration, not mixed into oac@4's median."""
    assert bench_load.config_of("oac@4/t2") == "oac@4"
    assert bench_load.config_of("oac@4/t2/normal") == "oac@4/normal"
    assert bench_load.config_of("oac@auto/t16") == "oac@auto"


def test_allcores_is_a_team_the_user_set(monkeypatch):
    import os

    env = bench_load.child_env("allcores")
    assert env["OMP_NUM_THREADS"] == str(len(os.sched_getaffinity(0)))


def test_the_trainer_competitor_is_a_dgl_oac_training():
    """Its command trains (here cut to 2 steps; the benchmark runs it until stopped)."""
    out = subprocess.run(bench_load.TRAINER + ["--max-steps", "2"], cwd=ROOT, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "dgl_oac" in bench_load.TRAINER and "train" in bench_load.TRAINER


def test_only_the_runs_at_the_thread_count_are_measured():
    lines = [{"kind": "run", "workload": "kg", "label": lab, "steps_per_s": v}
             for lab, v in (("sync/t2", 10.0), ("sync/t1", 6.0), ("async@4/t2", 11.0), ("oac@auto/t2", 12.0),
                            ("resident/t2", 30.0))] + [{"kind": "pair", "label": "x"}]
    got = {(r["config"], r["steps_per_s"]) for r in bench_load.measured(lines, 2)}
    assert got == {("sync", 10.0), ("async@4", 11.0), ("oac@auto", 12.0)}
