"""benchmarks/pipeline_model.py: the arithmetic of the schedule's cost model (no timing)."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import pipeline_model as M  # noqa: E402

ST = {"S": 5.0, "G": 4.0, "V": 1.0, "C": 20.0, "U": 10.0, "O": 2.0}


def test_sync_is_the_sum_of_its_stages_and_the_rest_is_what_they_leave():
    ms = {"sample": 5.0, "gather": 3.0, "copy": 1.0, "validate": 1.0, "fwd_bwd_dense": 20.0, "sparse_step": 10.0,
          "step_total": 42.0}
    st = M.sync_stages(ms)
    assert st == ST
    assert M.predict_sync(st) == 42.0


def test_background_work_hides_in_the_callers_serial_parts_with_all_cores_computing():
    # 2 cores, 2 torch threads: free core time = the caller's serial parts (S + V + U + O = 5+1+8+2 = 16 ms)
    assert M.predict_pipelined(ST, V=1.0, U=8.0, W=6.0, cores=2, threads=2) == 5 + 1 + 20 + 8 + 2
    # background 4 + 20 = 24 ms > 16 ms free: the 8 ms left over are waited for on 2 threads
    assert M.predict_pipelined(ST, V=1.0, U=8.0, W=20.0, cores=2, threads=2) == 36 + 8 / 2


def test_one_torch_thread_leaves_a_core_free_during_compute():
    # free = 16 + 20 = 36 ms: 4 + 30 background fits
    assert M.predict_pipelined(ST, V=1.0, U=8.0, W=30.0, cores=2, threads=1) == 36
    # a single background stage longer than the caller bounds the step (one thread each)
    assert M.predict_pipelined(ST, V=1.0, U=8.0, W=40.0, cores=2, threads=1) == 40
    # 4 cores, 2 threads: 3 * 16 + 2 * 20 = 88 ms free
    assert M.predict_pipelined(ST, V=1.0, U=8.0, W=30.0, cores=4, threads=2) == 36


def test_gpu_prediction_bus_patch_and_overlap():
    # 10k rows of 256 floats: 10.24 MB each way at 10.24 GB/s = 1 ms
    g = M.predict_gpu(ST, W=3.0, rows=10_000, row_floats=256, conflict=0.5, h2d_gbps=10.24, device_ms=6.0,
                      patch_ns_per_row=4.0, cores=2)
    assert g["bus_ms_one_way"] == pytest.approx(1.0)
    assert g["patch_ms"] == pytest.approx(0.02)
    assert g["sync"] == pytest.approx(5 + 4 + 1 + 6 + 1 + 3 + 2)
    assert g["async"] == pytest.approx(max(5 + 6 + 2, 4 + 1, 3 + 1, (5 + 4 + 3 + 2) / 2))
    assert g["oac"] == pytest.approx(g["async"] + 0.02)
    assert g["resident"] == pytest.approx(5 + 6 + 2)  # the ceiling: the caller's path, no bus, gather or write-back
    assert "rule" not in g
    # a staleness rule: async's schedule plus oac's patch (at commit) and 3 ns a row of its own arithmetic
    r = M.predict_gpu(ST, W=3.0, rows=10_000, row_floats=256, conflict=0.5, h2d_gbps=10.24, device_ms=6.0,
                      patch_ns_per_row=4.0, cores=2, rule_ns_per_row=3.0)
    assert r["rule_ms"] == pytest.approx(0.03)
    assert r["rule"] == pytest.approx(g["async"] + 0.02 + 0.03)
    # ... which only shows when the device is the bottleneck, not when the bus or the write-back is
    assert M.predict_gpu(ST, W=30.0, rows=10_000, row_floats=256, conflict=0.5, h2d_gbps=10.24, device_ms=6.0,
                         patch_ns_per_row=4.0, cores=2, rule_ns_per_row=3.0)["rule"] == pytest.approx(31.0)


def test_model_section_predicts_every_idle_priority_config_and_auto_as_the_faster_depth():
    def cfg(mode, prefetch, ms, bps, priority="idle"):
        return {"mode": mode, "prefetch": prefetch, "threads": 2, "priority": priority, "ms_per_step": ms,
                "batches_per_s": {"median": bps}}

    sync_ms = {"sample": 5.0, "gather": 4.0, "validate": 1.0, "fwd_bwd_dense": 20.0, "sparse_step": 10.0,
               "step_total": 42.0}
    oac_ms = {**sync_ms, "validate": 3.0, "sparse_step": 8.0, "writeback_bg": 2.0}
    sec = {"summary": {"sync/t2": cfg("sync", 1, sync_ms, 25.0), "oac@4/t2": cfg("oac", 4, oac_ms, 26.0),
                       "oac@auto/t2": cfg("oac", "auto", oac_ms, 25.5),
                       "oac@4/t2/normal": cfg("oac", 4, oac_ms, 20.0, "normal")}}
    rows = {r["config"]: r for r in M.model_section(sec, cores=2)}
    assert set(rows) == {"sync/t2", "oac@4/t2", "oac@auto/t2"}
    oac = 5 + 3 + 20 + 8 + 2  # background 4 + 2 fits in 18 ms of serial caller time
    assert rows["oac@4/t2"]["predicted_batches_per_s"] == pytest.approx(1e3 / oac)
    assert rows["oac@auto/t2"]["predicted_batches_per_s"] == pytest.approx(1e3 / min(oac, 42))
    assert rows["sync/t2"]["error"] == pytest.approx(1e3 / 42 / 25.0 - 1)


def test_main_reads_a_bench_modes_json_of_either_layout(tmp_path):
    """Per-workload sections (today) or one top-level summary (bench_modes before --workload)."""
    import json

    ms = {"sample": 5.0, "gather": 4.0, "validate": 1.0, "fwd_bwd_dense": 20.0, "sparse_step": 10.0,
          "step_total": 42.0, "writeback_bg": 2.0}
    summary = {"sync/t2": {"mode": "sync", "prefetch": 1, "threads": 2, "priority": "idle", "ms_per_step": ms,
                           "batches_per_s": {"median": 24.0}, "rows_per_batch": 1000.0, "conflict_rate": None},
               "oac@4/t2": {"mode": "oac", "prefetch": 4, "threads": 2, "priority": "idle", "ms_per_step": ms,
                            "batches_per_s": {"median": 24.0}, "rows_per_batch": 1000.0, "conflict_rate": 0.5}}
    section = {"summary": summary, "workload": {"row_floats": 385}}
    top = {"benchmark": "bench_modes", "env": {}, "args": {"target_prefetch": 4}}
    for name, bench in (("new", {**top, "workloads": {"w": section}}), ("old", {**top, **section})):
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(bench))
        res = M.main(["--input", str(path), "--out", str(tmp_path / f"model_{name}.json"), "--device-ms", "4"])
        rows = next(iter(res["cpu"].values()))
        assert {r["config"] for r in rows} == {"sync/t2", "oac@4/t2"}
        assert (tmp_path / f"model_{name}.png").stat().st_size > 0
        gpu = res["gpu_prediction"]["w" if name == "new" else "node-adam-128"]
        assert gpu["oac_batches_per_s"] > 0 and gpu["device_ms"] == 4.0 and gpu["device_ms_source"] == "--device-ms"
    # a CPU run measured no device time: without --device-ms there is no prediction, and it says why
    res = M.main(["--input", str(tmp_path / "new.json"), "--out", str(tmp_path / "model_x.json")])
    assert res["gpu_prediction"]["w"] == {"skipped": "no device time in the input (a CPU run): pass --device-ms"}
    with pytest.raises(SystemExit, match="not a bench_modes.py JSON"):
        (tmp_path / "x.json").write_text(json.dumps({"benchmark": "scale"}))
        M.main(["--input", str(tmp_path / "x.json"), "--out", str(tmp_path / "y.json")])


def _summary(device_step=None, resident=True):
    """A bench_modes summary of sync, oac@4 and (``resident``) resident on 2 threads; ``device_step``: each
    configuration's device ms a step (a run on the device), None for a CPU run."""
    def cfg(mode, prefetch, bps, **ms):
        base = {"sample": 5.0, "gather": 4.0, "validate": 1.0, "fwd_bwd_dense": 20.0, "sparse_step": 10.0,
                "step_total": 42.0, "writeback_bg": 3.0, **ms}
        if device_step is not None:
            base["device_step"] = device_step[mode]
        return {"mode": mode, "prefetch": prefetch, "threads": 2, "priority": "idle", "ms_per_step": base,
                "batches_per_s": {"median": bps}, "rows_per_batch": 10_000.0,
                "conflict_rate": 0.5 if mode == "oac" else None}

    out = {"sync/t2": cfg("sync", 1, 25.0), "oac@4/t2": cfg("oac", 4, 40.0)}
    if resident:
        out["resident/t2"] = cfg("resident", 1, 80.0)
    return out


def _args(*argv):
    return M.parse(["--h2d-gbps", "10.24", "--patch-ns-per-row", "4", *argv])


def test_device_ms_is_measured_from_a_run_on_the_device_resident_first():
    sec = {"summary": _summary({"sync": 30.0, "oac": 7.0, "resident": 6.0}), "workload": {"row_floats": 256}}
    g = M.gpu_section(sec, _args(), depth=4)
    assert g["device_ms"] == 6.0 and g["device_ms_source"] == "measured: resident/t2's device time a step"
    # sync's stages (S 5, G 4, O 2), 1 ms a way, oac's write-back 3 ms
    assert g["resident"] == pytest.approx(5 + 6 + 2) and g["sync"] == pytest.approx(5 + 4 + 1 + 6 + 1 + 3 + 2)
    # beside what the same run measured, each mode's configuration
    assert set(g["measured"]) == {"sync", "oac", "resident"}
    assert g["measured"]["resident"]["config"] == "resident/t2"
    assert g["measured"]["resident"]["error"] == pytest.approx(1e3 / 13 / 80.0 - 1)
    # without a resident run, oac's device time; --device-ms wins over either
    sec["summary"] = _summary({"sync": 30.0, "oac": 7.0}, resident=False)
    assert M.gpu_section(sec, _args(), depth=4)["device_ms"] == 7.0
    g = M.gpu_section(sec, _args("--device-ms", "2"), depth=4)
    assert g["device_ms"] == 2.0 and g["device_ms_source"] == "--device-ms"
    assert M.gpu_section({"summary": {}, "workload": {}}, _args(), 4)["skipped"].startswith("needs a sync run")


def test_main_predicts_the_device_race_from_a_stream_cut_short(tmp_path):
    """A bench_modes --stream of a device run killed after its first workload: the model reads the workloads it
    finished, measures the device time from it, sets each prediction beside the measurement and leaves the CPU
    rules out (they are a CPU run's)."""
    import json

    lines = [{"kind": "start", "benchmark": "bench_modes", "env": {}, "args": {"target_prefetch": 4,
                                                                            "device": "cuda"}},
             {"kind": "run", "workload": "w", "label": "sync/t2", "round": 0},
             {"kind": "workload", "name": "w", "target_prefetch": 4, "workload": {"row_floats": 256},
              "summary": _summary({"sync": 30.0, "oac": 7.0, "resident": 6.0})},
             {"kind": "run", "workload": "w2", "label": "sync/t2", "round": 0}]
    path = tmp_path / "bench_modes.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    res = M.main(["--input", str(path), "--out", str(tmp_path / "model.json")])
    assert res["cpu"] == {} and list(res["gpu_prediction"]) == ["w"] and res["input_device"] == "cuda"
    assert res["gpu_prediction"]["w"]["device_ms"] == 6.0
    assert res["gpu_within_target"]["max_abs_error"] == max(
        abs(r["error"]) for r in res["gpu_prediction"]["w"]["measured"].values())
    (tmp_path / "bad.jsonl").write_text(json.dumps({"kind": "run"}) + "\n")
    with pytest.raises(SystemExit, match="not a bench_modes.py --stream"):
        M.main(["--input", str(tmp_path / "bad.jsonl"), "--out", str(tmp_path / "y.json")])


def test_gpu_prediction_from_a_run_on_the_device_uses_each_modes_own_stages():
    """From a run on the device: the caller launches while the device runs (max of C and the device time), runs
    the mode's own validate and sparse step, and the background threads take what they took in that mode (the
    H200's gather thread: 11-16 ms against sync's 2 ms on the caller)."""
    st = {"S": 5.0, "G": 2.0, "V": 0.3, "C": 4.0, "U": 3.0, "O": 4.0}
    modes = {"async": {"V": 0.4, "U": 1.0, "G": 12.0, "W": 18.0}, "oac": {"V": 1.2, "U": 1.0, "G": 12.0, "W": 9.0}}
    g = M.predict_gpu(st, W=9.0, rows=10_000, row_floats=256, conflict=0.5, h2d_gbps=10.24, device_ms=6.0,
                      patch_ns_per_row=4.0, cores=16, rule_ns_per_row=3.0, modes=modes)
    assert g["sync"] == pytest.approx(5 + 2 + 0.3 + 6 + 3 + 4)  # its own stages; the device time outlasts C
    assert g["async"] == pytest.approx(18 + 1)  # the write-back thread (18 ms + 1 ms on the bus) bounds it
    assert g["oac"] == pytest.approx(5 + 1.2 + 1 + 6 + 0.02 + 4)  # the caller bounds it: 17.22 > 12 + 1, 9 + 1
    assert g["resident"] == pytest.approx(5 + 6 + 4)
    assert g["rule"] == pytest.approx(19) and g["rule_ms"] == pytest.approx(0.03)
