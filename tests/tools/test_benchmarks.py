"""Smoke tests of the benchmark scripts: each ``--quick`` run in a subprocess, then its JSON's keys and values.

Only structure and sanity are checked (keys, counts, ranges, the PNG beside the JSON), never timings: the
machine is shared and timings are what the scripts themselves report. The scripts start together (one
subprocess each) so the file stays within a few minutes.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Dict, Tuple

import pytest
import torch

from dgl_oac.app.data import data_root

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks"
STUDIES = BENCH / "studies"  # the one-off studies (benchmarks/studies/README.md)
SCRIPTS = ("bench_modes", "time_to_accuracy", "scale", "bench_stages", "profile_modes", "bench_ogb", "bench_step",
           "native_ab", "row_ops")
TIMEOUT_S = 300  # a hang guard: bench_modes --quick runs four workloads


def script(name: str) -> Path:
    """``benchmarks/<name>.py``, or ``benchmarks/studies/<name>.py`` for a study."""
    top = BENCH / f"{name}.py"
    return top if top.exists() else STUDIES / f"{name}.py"


# more --quick runs of a script, with options ("{tmp}": the runs' temporary folder): {key: (script, options)}
VARIANTS = {"time_to_accuracy_x2": ("time_to_accuracy", ("--modes", "oac@4x2,oac@4x2-shadow2")),
            "bench_modes_stream": ("bench_modes", ("--workload", "kg-adagrad-256", "--stream",
                                                   "{tmp}/bench_modes.jsonl"))}
OPTIONS: Dict[str, Tuple[str, ...]] = {}  # of the scripts' own --quick runs


class _Run:
    def __init__(self, name: str, out: Path, *options: str) -> None:
        self.name, self.out = name, out
        self.proc = subprocess.Popen(
            [sys.executable, str(script(name)), "--quick", "--no-progress", "--out", str(out), *options],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"})
        self.started = time.monotonic()
        self._result = None

    def result(self) -> Dict[str, Any]:
        if self._result is None:
            left = max(1.0, TIMEOUT_S - (time.monotonic() - self.started))
            try:
                log, _ = self.proc.communicate(timeout=left)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                log, _ = self.proc.communicate()
                pytest.fail(f"{self.name} --quick ran past {TIMEOUT_S}s:\n{log[-3000:]}")
            assert self.proc.returncode == 0, f"{self.name} --quick exited {self.proc.returncode}:\n{log[-3000:]}"
            assert self.out.exists(), f"{self.name} wrote no JSON:\n{log[-3000:]}"
            self._result = {"json": json.loads(self.out.read_text()), "log": log}
        return self._result


class _Runs(dict):
    """The --quick runs, each started when a test first asks for it (a deselected test starts none)."""

    def __init__(self, tmp: Path) -> None:
        super().__init__()
        self.tmp = tmp

    def __missing__(self, key: str) -> _Run:
        name, opts = VARIANTS.get(key, (key, OPTIONS.get(key, ())))
        if name not in SCRIPTS:
            raise KeyError(key)
        run = self[key] = _Run(name, self.tmp / f"{key}.json", *(o.replace("{tmp}", str(self.tmp)) for o in opts))
        return run


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    started = _Runs(tmp_path_factory.mktemp("bench"))
    yield started
    for r in started.values():
        if r.proc.poll() is None:
            r.proc.kill()
            r.proc.communicate()


def finite_pos(x: Any) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x) and x > 0


def check_env(env: Dict[str, Any]) -> None:
    for key in ("date", "command", "host_cpus", "torch", "dgl", "torch_threads_default", "omp_wait_policy",
                "loadavg_start", "loadavg_end", "memory_gib"):
        assert key in env, f"env lacks {key}"
    assert "--quick" in env["command"]


def finished(runs, name: str) -> Dict[str, Any]:
    """The quick run of ``name``: its JSON (with a complete ``env``) and log, its PNG written beside it."""
    r = runs[name].result()
    check_env(r["json"]["env"])
    assert Path(runs[name].out).with_suffix(".png").stat().st_size > 0
    return r


def test_quick_output_stays_out_of_the_checkout(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    import _common as C

    quick = C.out_path(argparse.Namespace(quick=True, out=None), "bench_modes")
    assert ROOT not in quick.parents and quick.name == "bench_modes.json"
    full = C.out_path(argparse.Namespace(quick=False, out=None), "bench_modes")
    assert full == BENCH / "results" / "bench_modes.json"
    assert C.out_path(argparse.Namespace(quick=True, out="x/y.json"), "bench_modes") == Path("x/y.json")


def test_results_hold_no_machine_paths(monkeypatch, tmp_path):
    """A committed JSON names files relative to the checkout, others by name only (a worktree's absolute path
    was committed once); every JSON in results/ holds none."""
    monkeypatch.syspath_prepend(str(BENCH))
    import _common as C

    got = C.portable({"input": str(BENCH / "results" / "x.json"), "out": str(tmp_path / "y.json"),
                      "command": f"python bench.py --out {tmp_path}/z.json --flag", "url": "https://a/b", "n": 3})
    assert got == {"input": "benchmarks/results/x.json", "out": "<elsewhere>/y.json",
                   "command": "python bench.py --out <elsewhere>/z.json --flag", "url": "https://a/b", "n": 3}
    # the checkout's folder and its parent (other worktrees and clones sit beside it), the temp dir, the home
    machine = {str(ROOT), str(ROOT.parent) + os.sep, tempfile.gettempdir() + os.sep, str(Path.home()) + os.sep}
    for f in sorted((BENCH / "results").glob("*.json")):
        text = f.read_text()
        assert not [m for m in machine if m in text], f.name


@pytest.mark.parametrize("name", SCRIPTS + ("workload_order", "segment_sums_ab", "bench_disk", "file_in_core",
                                             "cache_bound"))
def test_help(name):
    out = subprocess.run([sys.executable, str(script(name)), "--help"], cwd=ROOT, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "--quick" in out.stdout and "--out" in out.stdout


@pytest.mark.slow
def test_bench_modes_quick(runs, monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    import _workloads as W
    import bench_modes

    r = finished(runs, "bench_modes")
    res, log = r["json"], r["log"]
    sections = res["workloads"]
    assert list(sections) == W.names("all") == [w for w in W.WORKLOADS if w not in W.GPU_ONLY]  # every CPU one
    tasks = {s["workload"]["task"] for s in sections.values()}
    opts = {s["workload"]["optimizer"] for s in sections.values()}
    dims = {s["workload"]["dim"] for s in sections.values()}
    assert tasks == {"node", "link", "kg"} and opts == {"sgd", "adagrad", "adam"} and min(dims) <= 32 <= 256 <= max(dims)
    for name, sec in sections.items():
        rounds = res["args"]["rounds_of"][name]  # --rounds: one count, or one per workload
        labels = [c["label"] for c in sec["configs"]]
        assert {c["mode"] for c in sec["configs"]} == set(bench_modes.MODES)
        assert {"async-gap", "async-lookahead", "resident", "dgl"} <= set(bench_modes.MODES)
        assert {"oac@4/resident/t2", "oac@auto/resident/t2", "sync/resident/t2"} <= set(sec["ratios"])
        assert {"async-gap/async@4/t2", "async-lookahead/async@4/t2"} <= set(sec["ratios"])
        assert len(sec["run_order"]) == rounds * len(labels)
        for lab in labels:
            assert len(sec["runs"][lab]) == rounds
            s = sec["summary"][lab]
            assert finite_pos(s["batches_per_s"]["median"]) and finite_pos(s["rows_per_s"]["median"])
            assert s["ms_per_step"]["step_total"] > 0
            for run in sec["runs"][lab]:
                assert run["batches"] == res["args"]["steps"] and run["rows"] > 0
                if s["mode"] != "dgl":
                    assert set(run["stages"]) >= {"sample", "gather", "wait", "validate", "commit"}
                    assert all(v >= 0 for v in run["stages"].values())
            if s["mode"] == "oac":
                assert 0.0 <= s["conflict_rate"] <= 1.0
            else:
                assert s["conflict_rate"] is None
        # the same batches in every dgl-oac mode: rows per batch identical; plain DGL samples with its own RNG
        per_batch = {sec["summary"][lab]["rows_per_batch"] for lab in labels
                     if sec["summary"][lab]["mode"] != "dgl"}
        assert len(per_batch) == 1, (name, per_batch)
        for key, v in sec["ratios"].items():
            assert v["n"] == rounds and math.isfinite(v["median"]), (name, key)
        for key in ("oac_vs_async_at_target_prefetch", "oac_vs_sync", "oac_vs_dgl", "validate_share",
                    "oac_default_vs_sync", "oac_default_vs_dgl"):
            v = res["targets"][name][key]  # each verdict is its value against its threshold, in its direction
            assert v["met"] is (v["value"] <= v["threshold"] if v.get("max") else v["value"] >= v["threshold"])
        # the work ceiling: sync's one-thread CPU work a step, over every core (a bound no schedule passes)
        ceil = res["targets"][name]["work_ceiling"]
        work = sec["summary"]["sync/t1"]["ms_per_step"]["cpu_process"]
        assert ceil["sync_t1_work_ms"] == work > 0 and ceil["cores"] >= 1
        assert ceil["batches_per_s"] == pytest.approx(1000 * ceil["cores"] / work)
        dgl = sec["summary"]["dgl/t2"]["batches_per_s"]["median"]
        assert ceil["vs_dgl"] == pytest.approx(ceil["batches_per_s"] / dgl)
        assert res["targets"][name]["oac_default_vs_dgl"]["ceiling"] == ceil["vs_dgl"]
    assert "ratios of batches/s" in log and "every workload" in log and "ceiling/dgl" in log


def test_bench_modes_stream_keeps_each_run_as_it_finishes(runs, monkeypatch):
    """--stream: a flushed JSON line per run (its workload, configuration, round, steps, seconds, steps/s and the
    run's own entry), one per finished workload (its section less the runs), start and end; every configuration
    warmed up alike."""
    res = finished(runs, "bench_modes_stream")["json"]
    lines = [json.loads(x) for x in (runs.tmp / "bench_modes.jsonl").read_text().splitlines()]
    kinds = [x["kind"] for x in lines]
    assert kinds[0] == "start" and kinds[-1] == "end" and lines[0]["args"]["steps"] == res["args"]["steps"]
    expected = ["start"]
    for name, sec in res["workloads"].items():
        expected += ["run"] * len(sec["run_order"]) + ["workload"]
        streamed = [x for x in lines if x["kind"] == "run" and x["workload"] == name]
        assert [x["label"] for x in streamed] == sec["run_order"]
        for x in streamed:
            entry = sec["runs"][x["label"]][x["round"]]
            assert x["steps"] == entry["batches"] == res["args"]["steps"] and x["seconds"] == entry["wall_s"]
            assert x["steps_per_s"] == entry["batches_per_s"] and x["rows"] == entry["rows"]
            assert x["warmup"] == sec["workload"]["warmup"]  # the same warm-up for every configuration
        section = next(x for x in lines if x["kind"] == "workload" and x["name"] == name)
        assert section["summary"] == sec["summary"] and section["ratios"] == sec["ratios"] and "runs" not in section
    assert kinds == expected + ["end"]


def test_bench_modes_modes_keeps_those_and_leaves_out_what_compares_with_the_others(monkeypatch):
    """--modes sync,oac,resident (a GPU suite's race without async): only those configurations; the ratios and
    targets that need async are left out, oac/resident is there."""
    monkeypatch.syspath_prepend(str(BENCH))
    import bench_modes

    args = bench_modes.parse(["--quick", "--workload", "node-adam-128", "--modes", "sync,oac,resident"])
    cfgs = bench_modes.configs(args)
    assert {c["mode"] for c in cfgs} == {"sync", "oac", "resident"} and not args.dgl
    runs = {c["label"]: [{"batches_per_s": 10.0 + i, "batches": 4, "wall_s": 1.0, "stages": {"validate": 0.01}}]
            for i, c in enumerate(cfgs)}
    rat = bench_modes.ratios(args, runs)
    assert {"oac@4/resident/t2", "oac@auto/resident/t2", "sync/resident/t2", "oac@4/sync/t2"} <= set(rat)
    assert not [k for k in rat if "async" in k or "dgl" in k]
    assert rat["oac@4/resident/t2"]["median"] == runs["oac@4/t2"][0]["batches_per_s"] / runs["resident/t2"][0][
        "batches_per_s"]
    summary = {c["label"]: {"batches_per_s": {"median": runs[c["label"]][0]["batches_per_s"]},
                            "validate_share": 0.01, "ms_per_step": {"cpu_process": 50.0}} for c in cfgs}
    tgt = bench_modes.targets(args, summary, rat)
    assert "oac_vs_async_at_target_prefetch" not in tgt and "best_oac_vs_best_async" not in tgt
    assert tgt["oac_vs_sync"]["met"] in (True, False) and "best_oac_vs_best_resident" in tgt
    with pytest.raises(SystemExit):
        bench_modes.parse(["--modes", "sync,gpu"])


def test_gpu_sized_workloads_stay_out_of_cpu_defaults_and_warm_up_is_the_same_for_all(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    import _workloads as W
    import bench_modes

    assert "kg-complex-256-10m" in W.GPU_ONLY and "kg-complex-256-10m" not in W.names("all")
    assert "kg-complex-256-10m" in W.names("all", "cuda:0")
    with pytest.raises(ValueError, match="kg-complex-256-10m are sized for a GPU"):
        W.names("node-adam-128,kg-complex-256-10m")
    w = W.settings(bench_modes.parse(["--workload", "kg-complex-256-10m", "--device", "cuda"]), "kg-complex-256-10m")
    assert (w.num_nodes, w.dim, w.model, w.avg_degree) == (10_000_000, 256, "complex", 2.0)
    assert W.settings(bench_modes.parse(["--workload", "node-adam-128"]), "node-adam-128").avg_degree == 10.0
    args = bench_modes.parse(["--workload", "node-adam-128", "--warmup", "30"])
    cfgs = bench_modes.configs(args)
    assert bench_modes.steady_warmup(args, cfgs) == bench_modes.AUTO_WARMUP  # past auto's probe, for every mode
    args = bench_modes.parse(["--workload", "node-adam-128", "--warmup", "30", "--modes", "sync,resident,oac",
                              "--prefetch", "4"])
    cfgs = [c for c in bench_modes.configs(args) if c["prefetch"] != "auto"]
    assert bench_modes.steady_warmup(args, cfgs) == 30


def test_bench_modes_rounds_per_workload_and_no_cpu_work_ceiling_on_a_device(monkeypatch):
    """--rounds takes one count or one per workload (the GPU suite: 2 for the node race, 1 for the 10M-row KG
    race); sync/t1 (the CPU work ceiling's run) is left out on a device, where the cores do not bound a run."""
    monkeypatch.syspath_prepend(str(BENCH))
    import bench_modes

    both = ["--workload", "node-adam-128,kg-adagrad-256"]
    assert bench_modes.parse(both + ["--rounds", "2,1"]).rounds_of == {"node-adam-128": 2, "kg-adagrad-256": 1}
    assert bench_modes.parse(both + ["--rounds", "3"]).rounds_of == {"node-adam-128": 3, "kg-adagrad-256": 3}
    for bad in ("2,1,1", "0", "x"):
        with pytest.raises(SystemExit):
            bench_modes.parse(both + ["--rounds", bad])
    on_cpu = {c["label"] for c in bench_modes.configs(bench_modes.parse(["--threads", "2"]))}
    on_gpu = {c["label"] for c in bench_modes.configs(bench_modes.parse(["--threads", "8", "--device", "cuda"]))}
    assert "sync/t1" in on_cpu and on_gpu == {lb.replace("/t2", "/t8") for lb in on_cpu} - {"sync/t1"}


def test_dgl_sgd_baseline_is_dgls_sgd(monkeypatch):
    """The SGD workload's plain-DGL optimizer: DGL's gradient collection, duplicates averaged, then w -= lr * g."""
    import dgl

    monkeypatch.syspath_prepend(str(BENCH))
    import _workloads as W

    emb = dgl.nn.NodeEmbedding(6, 3, "sgd_check", init_func=lambda t: torch.nn.init.ones_(t))
    opt = W.DGLSparseSGD([emb], lr=0.5)
    ids = torch.tensor([1, 4, 1])
    (emb(ids, torch.device("cpu")) * torch.tensor([[1.0], [2.0], [3.0]])).sum().backward()
    opt.step()
    want = torch.ones(6, 3)
    want[1] -= 0.5 * 2.0  # row 1's gradients 1 and 3, averaged
    want[4] -= 0.5 * 2.0
    assert torch.equal(emb.weight, want)


@pytest.mark.skipif(not (ROOT.parent / "shared" / "data" / "ogbl-ddi" / "ogbl_ddi").is_dir() and
                    not os.environ.get("DGL_OAC_DATA"), reason="shared data ogbl-ddi absent")
@pytest.mark.slow  # CI keeps every script's --help, bench_modes' and time_to_accuracy's quick runs
def test_ogb_quick(runs):
    """ogbl-ddi (the real data) in every mode: a curve of OGB's Hits@20 per mode, oac's equal to sync's."""
    res = finished(runs, "bench_ogb")["json"]
    assert res["dataset"] == "ogbl-ddi" and res["measured_here"] is True and res["metric"] == "hits@20"
    assert set(res["runs"]) == {"sync", "oac", "async", "dgl"}
    for mode, run in res["runs"].items():
        assert "error" not in run, (mode, run.get("error"))
        assert len(run["curve"]) == 1 and run["steps"] == res["settings"]["max_steps"]
        point = run["curve"][0]
        assert 0.0 <= point["valid_hits@20"] <= 1.0 and 0.0 <= point["test_hits@20"] <= 1.0
        assert run["best"]["epoch"] == 1 and point["train_seconds"] > 0
    assert res["oac_equals_sync"] is True


def test_time_to_accuracy_quick(runs):
    r = finished(runs, "time_to_accuracy")
    res = r["json"]
    wl = res["workloads"]["synthetic:node"]
    modes = [m.strip() for m in res["args"]["modes"].split(",")]
    assert set(wl["runs"]) == set(modes)
    epochs = wl["settings"]["epochs"]
    for m in modes:
        run = wl["runs"][m]
        assert "error" not in run, run.get("error")
        assert len(run["curve"]) == epochs
        secs = [p["train_seconds"] for p in run["curve"]]
        assert all(b > a for a, b in zip(secs, secs[1:])) and secs[0] > 0
        assert all(0.0 <= p[wl["metric"]] <= 1.0 for p in run["curve"])
    assert wl["metric"] == "valid_acc"
    assert set(wl["time_to_target"]) == set(modes) and len(wl["targets"]) == 2
    # oac trains exactly what sync trains: same metric (evaluation itself may reorder float sums)
    assert abs(wl["final"]["oac@4"]["metric"] - wl["final"]["sync"]["metric"]) <= 0.02
    assert wl["time_to_target"]["sync"][f"{wl['targets'][0]:.4f}"] is not None  # sync reaches 95% of its best


@pytest.mark.slow  # CI keeps every script's --help, bench_modes' and time_to_accuracy's quick runs
def test_time_to_accuracy_two_trainers_quick(runs):
    """oac on 2 trainers under torchrun, with DDP's all-reduce and with ShadowSync: rank 0's curves."""
    wl = finished(runs, "time_to_accuracy_x2")["json"]["workloads"]["synthetic:node"]
    ddp, shadow = wl["runs"]["oac@4x2"], wl["runs"]["oac@4x2-shadow2"]
    for run, dense_sync in ((ddp, "allreduce"), (shadow, "shadow")):
        assert "error" not in run, run.get("error")
        assert run["trainers"] == 2 and run["config"]["dense_sync"] == dense_sync
        assert len(run["curve"]) == wl["settings"]["epochs"] and run["total_wall_s"] > run["train_seconds"] > 0
        assert all(0.0 <= p["valid_acc"] <= 1.0 for p in run["curve"])
    assert shadow["config"]["shadow_every"] == 2 and shadow["steps"] == ddp["steps"] > 0
    assert shadow["curve"][0]["train_loss"] != ddp["curve"][0]["train_loss"]  # not exact: another model
    assert set(wl["time_to_target"]) == {"oac@4x2", "oac@4x2-shadow2"}


@pytest.mark.slow  # CI keeps every script's --help, bench_modes' and time_to_accuracy's quick runs
def test_scale_quick(runs):
    r = finished(runs, "scale")
    res = r["json"]
    pts = res["size"]["points"]
    assert pts and all("error" not in p for p in pts), [p.get("error") for p in pts]
    for p in pts:
        assert set(p["modes"]) == {"sync", "async@4", "oac@4", "dgl"}
        for m, x in p["modes"].items():
            assert "skipped" not in x, x
            assert finite_pos(x["rows_per_s"]) and finite_pos(x["peak_rss_mib"])
            assert x["table_floats_per_row"] >= p["dim"]
            ce = x["ceiling"]
            assert finite_pos(ce["random_rows_s"]) and finite_pos(ce["contiguous_gb_s"])
            assert 0 < x["rows_per_s_fraction_of_random_gather"]
    t = res["targets"]
    assert t["largest_trains_in_all_modes"]["met"] is all(x == "ok" for x in
                                                          t["largest_trains_in_all_modes"]["per_mode"].values())
    falls = t["per_row_throughput_fall"]["ratio_smallest_over_largest"]
    assert t["per_row_throughput_fall"]["met"] is all(f is not None and f < 2.0 for f in falls.values())
    pf = res["prefetch"]
    for d in pf["depths"]:
        assert 0.0 <= pf["summary"][f"oac@{d}"]["conflict_rate"] <= 1.0
        assert pf["summary"][f"oac@{d}"]["max_in_flight"] <= d
    sk = res["skew"]
    for p in sk["powers"]:
        assert 0.0 <= sk["summary"][f"oac@4/p{p:g}"]["conflict_rate"] <= 1.0


@pytest.mark.slow  # CI keeps every script's --help, bench_modes' and time_to_accuracy's quick runs
def test_bench_stages_quick(runs):
    r = finished(runs, "bench_stages")
    res = r["json"]
    threads = [int(t) for t in res["args"]["threads"].split(",")]
    assert sorted(int(t) for t in res["ms"]) == sorted(threads)
    for t, ops in res["ms"].items():
        assert len(ops) >= 10
        assert all(finite_pos(v) for v in ops.values()), ops
        assert any("proposed" in k for k in ops) and any("WriteLog.patch" in k for k in ops)


@pytest.mark.slow  # CI keeps every script's --help, bench_modes' and time_to_accuracy's quick runs
def test_profile_modes_quick(runs):
    r = finished(runs, "profile_modes")
    res, log = r["json"], r["log"]
    assert set(res["configs"]) == {m.strip() for m in res["args"]["modes"].split(",")}
    for cfg, c in res["configs"].items():
        assert finite_pos(c["batches_per_s"]) and c["steps"] == res["args"]["steps"]
        assert all(v >= 0 for v in c["ms_per_step"].values())
        if cfg == "dgl":  # plain DGL runs no dgl-oac stage and expects none
            assert c["ms_per_step"] == {} and c["not_recorded"] == []
        else:  # every stage its mode runs is either measured or named as not recorded, in the JSON and the report
            assert set(c["ms_per_step"]) | set(c["not_recorded"]) == set(c["expected"])
            assert set(c["expected"]) <= set(res["stages"])
            assert not set(c["ms_per_step"]) & set(c["not_recorded"])
            assert not c["not_recorded"] or \
                f"{cfg}: expected stages not recorded: {', '.join(c['not_recorded'])}" in log


def test_profile_stages_summed_by_name_over_threads(monkeypatch):
    """Stage ranges are summed per name over every thread, one started before the profiler included; the
    expected stages that did not run are listed."""
    monkeypatch.syspath_prepend(str(STUDIES))
    import profile_modes as P

    running, stop = threading.Event(), threading.Event()

    def writeback() -> None:
        while not stop.is_set():
            with torch.profiler.record_function("dgl_oac.writeback"):
                running.set()
                time.sleep(0.002)
    t = threading.Thread(target=writeback)
    t.start()
    running.wait()
    prof = P.profiler()
    try:
        with prof:
            for _ in range(3):
                with torch.profiler.record_function("dgl_oac.commit"):
                    time.sleep(0.01)
                with torch.profiler.record_function("not_a_stage"):
                    pass
    finally:
        stop.set()
        t.join()
    out = P.stage_ms(prof.key_averages(), P.EXPECTED["oac"], steps=3)
    assert set(out["ms_per_step"]) == {"dgl_oac.commit", "dgl_oac.writeback"}
    assert out["ms_per_step"]["dgl_oac.commit"] >= 9.9 and out["ms_per_step"]["dgl_oac.writeback"] > 0
    assert out["not_recorded"] == ["dgl_oac.sample", "dgl_oac.gather", "dgl_oac.copy", "dgl_oac.validate",
                                   "dgl_oac.wait"]


def test_bench_modes_refuses_more_steps_than_an_epoch_has(monkeypatch):
    """A run whose warm-up + timed steps outlast the epoch says so (it used to end in a bare StopIteration)."""
    monkeypatch.syspath_prepend(str(BENCH))
    import bench_modes

    args = bench_modes.parse(["--quick", "--workload", "node-adam-128"])
    w = bench_modes.W.settings(args, "node-adam-128")
    ds = bench_modes.workload(w)
    threads = torch.get_num_threads()
    with pytest.raises(ValueError, match="node-adam-128: 2 warm-up \\+ 1000 timed steps need more batches"):
        bench_modes.run_one(ds, w, {"mode": "sync", "prefetch": 1, "threads": threads}, 2, 1000)


@pytest.mark.slow  # CI keeps every script's --help, bench_modes' and time_to_accuracy's quick runs
def test_native_ab_quick(runs):
    """Both sides of every optimizer and skew timed, and the tables they trained bitwise equal."""
    if shutil.which(os.environ.get("CC") or "cc") is None:
        pytest.skip("no C compiler: native_ab.py has no native side to time")
    res = finished(runs, "native_ab")["json"]
    assert list(res["results"]) == ["1.1", "0.8"]
    for per_opt in res["results"].values():
        assert set(per_opt) == {"sgd", "adagrad", "adam"}
        for out in per_opt.values():
            assert out["bitwise_equal"] is True and finite_pos(out["speedup"])
            assert set(out["ms"]) == {"native row ops", "torch ops (DGL_OAC_NATIVE=0)"}


@pytest.mark.slow  # CI keeps every script's --help, bench_modes' and time_to_accuracy's quick runs
def test_row_ops_quick(runs):
    """Every piece timed on both sides at both skews (the script itself checks each pair bitwise)."""
    if shutil.which(os.environ.get("CC") or "cc") is None:
        pytest.skip("no C compiler: row_ops.py has no native side to time")
    res = finished(runs, "row_ops")["json"]
    for per in res["results"].values():
        assert list(per) == ["sort", "gather", "scatter", "adagrad", "adam", "floor"]
        for out in per.values():
            assert len(out["ms"]) == 2 and finite_pos(out["ratio"])


@pytest.mark.slow  # CI keeps every script's --help, bench_modes' and time_to_accuracy's quick runs
def test_bench_step_quick(runs):
    """Every method of every optimizer timed (FBGEMM only when importable), the ratios the issue's targets read."""
    r = finished(runs, "bench_step")
    res = r["json"]
    assert list(res["results"]) == ["1.1", "0.8"]  # --quick keeps both skews
    steps = res["args"]["steps"]
    expected = {"sgd": {"torch"}, "adagrad": {"torch", "dgl"}, "adam": {"torch", "dgl"}, "rowwise_adagrad": set()}
    for per_opt in res["results"].values():
        assert set(per_opt) == set(expected)
        for opt_name, out in per_opt.items():
            want = {"dgl-oac", "dgl-oac loader sync", "dgl-oac loader oac", "kernel path"} | expected[opt_name]
            got = set(out["ms"]) - {"fbgemm"}
            assert got == want, (opt_name, got)
            assert ("fbgemm" in out["ms"]) == (res["fbgemm"] == "ok" and opt_name != "adam")
            assert all(v["n"] == steps and finite_pos(v["median"]) for v in out["ms"].values())
            assert 0 < out["unique_fraction"] < 1
            assert set(out["minor_faults"]) == set(out["ms"]) and min(out["minor_faults"].values()) >= 0
            q = out["ratios"]["dgl-oac"]
            assert finite_pos(q["over_kernel_path"]) and (q["speedup_vs_torch"] is None) == ("torch" not in want)
    if res["fbgemm"] != "ok":
        assert "fbgemm: skipped" in r["log"]


def test_bench_modes_without_the_dgl_baseline(monkeypatch):
    """--no-dgl (a GPU with PyPI's DGL): no plain-DGL configuration, and the ratios and targets leave out what
    compares with it instead of failing on its absence."""
    monkeypatch.syspath_prepend(str(BENCH))
    import bench_modes

    args = bench_modes.parse(["--quick", "--workload", "node-adam-128", "--no-dgl"])
    cfgs = bench_modes.configs(args)
    assert "dgl" not in {c["mode"] for c in cfgs} and "sync" in {c["mode"] for c in cfgs}
    runs = {c["label"]: [{"batches_per_s": 10.0 + i, "batches": 4, "wall_s": 1.0, "stages": {"validate": 0.01}}]
            for i, c in enumerate(cfgs)}
    rat = bench_modes.ratios(args, runs)
    assert not [k for k in rat if "dgl" in k] and f"oac/async@4/t{args.threads}" in rat
    summary = {c["label"]: {"batches_per_s": {"median": runs[c["label"]][0]["batches_per_s"]},
                            "validate_share": 0.01, "ms_per_step": {"cpu_process": 50.0}} for c in cfgs}
    tgt = bench_modes.targets(args, summary, rat)
    assert "oac_vs_dgl" not in tgt and tgt["oac_vs_sync"]["met"] in (True, False)
    assert "vs_dgl" not in tgt["work_ceiling"] and "ceiling" in tgt["oac_default_vs_sync"]


@pytest.mark.slow
@pytest.mark.skipif(not (data_root() / "coauthor-physics").exists(), reason="needs Coauthor-Physics")
def test_bench_sources_quick(tmp_path):
    """Every example and its methods, a time per round each, ratios to torch's own; the pipeline ran. Run on
    its own, not in the fixture's burst of scripts started together (at load 10, three of those already ran past
    300 s with it there)."""
    pytest.importorskip("torch_geometric")
    test_help("bench_sources")
    run = _Run("bench_sources", tmp_path / "bench_sources.json")
    res = finished({"bench_sources": run}, "bench_sources")["json"]
    assert list(res["results"]) == ["pinsage", "node2vec", "pyg_metapath2vec"]
    for name, r in res["results"].items():
        methods = ["torch", "import-only", "BatchLoader sync", "BatchLoader oac"] if name == "pyg_metapath2vec" \
            else ["torch", "dgl-oac sync", "dgl-oac oac"]
        assert list(r["ms"]) == methods
        assert all(v["n"] == res["args"]["rounds"] and finite_pos(v["median"]) for v in r["ms"].values())
        assert r["x_torch"]["torch"]["median"] == 1.0 and finite_pos(r["x_torch"][methods[-1]]["median"])
        oac = r["stats"][methods[-1]]
        assert oac["committed"] == res["args"]["steps"] and oac["rows_served"] > 0 and oac["seconds"]["gather"] > 0



def test_bench_modes_warms_a_large_workload_up_on_a_small_graph(monkeypatch):
    """A workload over WARM_UP_NODES warms up on a graph of that size (a GPU-sized table takes seconds to build
    per run); a smaller one on its own graph."""
    monkeypatch.syspath_prepend(str(BENCH))
    import bench_modes

    built, warmed = [], []
    monkeypatch.setattr(bench_modes, "workload", lambda w: built.append(w.num_nodes) or f"graph{w.num_nodes}")
    monkeypatch.setattr(bench_modes, "run_one", lambda ds, w, cfg, *a: warmed.append((ds, w.num_nodes, cfg["mode"])))
    w = bench_modes.W.settings(bench_modes.parse(["--workload", "kg-complex-256-10m", "--device", "cuda"]),
                               "kg-complex-256-10m")
    bench_modes.warm_up("big graph", w, 8, dgl=False)
    small = bench_modes.WARM_UP_NODES
    assert built == [small] and warmed == [(f"graph{small}", small, "oac")] and w.num_nodes == 10_000_000
    bench_modes.warm_up("own graph", bench_modes.W.settings(bench_modes.parse([]), "node-adam-128"), 2, dgl=False)
    assert built == [small] and warmed[-1] == ("own graph", 300_000, "oac")


def test_ogb_speed_check_verdict(monkeypatch):
    """bench_ogb --check-speed's verdict: within 3x of the record is ok; the bfloat16 default on a CPU without
    AVX512-BF16 (0.05 batches/s against 0.99, issue 49) is reported, naming where to look."""
    monkeypatch.syspath_prepend(str(BENCH))
    import bench_ogb

    ok, msg = bench_ogb.speed_verdict(1.22, 0.99)
    assert ok and "1.23x faster" in msg
    ok, msg = bench_ogb.speed_verdict(0.40, 0.99)
    assert ok and "2.47x slower" in msg
    ok, msg = bench_ogb.speed_verdict(0.05, 0.99)
    assert not ok and "19.80x slower" in msg and "bfloat16" in msg
    assert not bench_ogb.speed_verdict(0.0, 0.99)[0]
    record = json.loads((BENCH / "results" / bench_ogb.RECORD).read_text())
    assert record["config"]["dataset"] == "ogbl-ddi" and record["batches_per_s"] > 0


@pytest.mark.slow  # CI keeps every script's --help, bench_modes' and time_to_accuracy's quick runs
def test_file_in_core_quick(tmp_path):
    """The study's plumbing: every configuration runs in its own process, the same table in all of them, and only
    the forced file table counts as out of core."""
    out = tmp_path / "file_in_core.json"
    run = subprocess.run([sys.executable, str(script("file_in_core")), "--quick", "--out", str(out)], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    res = json.loads(out.read_text())
    assert res["same_table_everywhere"] is True
    assert res["out_of_core"] == {"sync/memory": False, "oac/memory": False, "sync/file": False,
                                  "oac/file": False, "sync/file-forced": True, "oac/file-forced": True}
    assert all(finite_pos(v["median"]) for v in res["summary"].values())


def test_cache_bound_policies_on_known_traces(monkeypatch):
    """The cache-bound study's simulators: LRU and Belady's OPT hit what they must on traces worked by hand, OPT
    is never below LRU, the best static set (but for cold rows) nor dgl-oac's own cache, and no cache beats the
    compulsory misses."""
    monkeypatch.syspath_prepend(str(STUDIES))
    import numpy as np
    import cache_bound as cb

    steps = [np.array(s) for s in ([0, 1], [2], [0], [1], [2], [0, 1])]
    # LRU of 2 rows, counted from step 2: row 0 is one of step 0's two rows behind step 1's row 2, held in half;
    # 1 and 2 were pushed out by the two steps since; in the last step 1 is held and 0 is not
    assert cb.lru_hits(steps, 3, 2, lo=2) == (0.5 + 0 + 0 + 1) / 5
    assert cb.lru_hits(steps, 3, 3, lo=2) == 1.0
    # OPT of 1 row keeps row 0 (back at step 2) over 1 and 2; then 0 or 1 (both back last) over 2 (never back)
    assert cb.opt_hits(steps, 3, 1, lo=2) == 2 / 5
    assert cb.opt_hits(steps, 3, 3, lo=2) == 1.0
    trace, popularity = cb.trace(5000, 80, 256, 16, 1.0, seed=1)
    rank_of = np.empty(5000, dtype=np.int64)
    rank_of[np.argsort(-popularity, kind="stable")] = np.arange(5000)
    seen, hits = np.zeros(5000, dtype=bool), []  # a row looked up before: what a cache of every row hits
    for t, s in enumerate(trace):
        if t >= 40:
            hits.append(seen[s])
        seen[s] = True
    compulsory = float(np.concatenate(hits).mean())
    for size in (50, 500, 2000):
        opt, lru = cb.opt_hits(trace, 5000, size, lo=40), cb.lru_hits(trace, 5000, size, lo=40)
        assert opt >= lru > 0
        assert opt >= cb.static_hits(trace, rank_of, size, lo=40) - 0.05  # OPT may trail an oracle by cold rows
        assert 0 < cb.ours_hits(trace, 5000, size, lo=40) <= opt  # dgl-oac's RowCache: online, so below OPT
    assert cb.opt_hits(trace, 5000, 5000, lo=40) == pytest.approx(compulsory, abs=1e-12)
    assert cb.lru_hits(trace, 5000, 5000, lo=40) == pytest.approx(compulsory, abs=1e-12)
    assert 0 < compulsory < 1
