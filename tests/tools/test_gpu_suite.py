"""scripts/gpu_suite.py on CPU: its plan, its offline set-up, the probe's read of its last stdout line, the budget
passing forward, a killed or failed step never stopping the next, missing inputs skipped with a reason, the
output folder kept to the device tool's 8 files, pytest's outcome stream, and a CI-sized rehearsal (``--tiny
--device cpu``, a fresh HOME, --out outside the repository) in which every step runs to its end."""
import json
import os
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path
from typing import Any, Dict, List

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import gpu_suite  # noqa: E402
from gpu import plan as P  # noqa: E402
from gpu.probe import last_json, probe  # noqa: E402
from gpu.runner import Budget, run_step  # noqa: E402
from gpu import wheels as gpu_wheels  # noqa: E402
from gpu.wheels import set_up, step_env  # noqa: E402

PY = sys.executable
DGL_NOTICE = 'Setting the default backend to "pytorch". You can change it in the ~/.dgl/config.json file'


def dry_run(*args: str) -> Dict[str, Any]:
    out = subprocess.run([PY, "scripts/gpu_suite.py", "--dry-run", *args], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout
    return json.loads(out)


def test_dry_run_prints_every_step_most_valuable_first_and_runs_nothing(tmp_path):
    plan = dry_run("--out", str(tmp_path / "r"))
    steps = {s["name"]: s for s in plan["steps"]}
    assert list(steps) == ["equality", "bench_modes", "sync_audit", "cuda_tests", "pipeline_model"]
    assert sum(s["share"] for s in plan["steps"]) == pytest.approx(1.0)
    assert all(Path(ROOT, s["argv"][1]).exists() or s["argv"][1] == "-m" for s in plan["steps"])
    assert not (tmp_path / "r").exists()
    bench = steps["bench_modes"]["argv"]
    assert "--no-dgl" in bench and "cuda" in bench, "PyPI's DGL: no plain-DGL baseline on the device"
    assert bench[bench.index("--stream") + 1] == str(tmp_path / "r" / "bench_modes.jsonl")
    assert "resident" in bench[bench.index("--modes") + 1].split(",")
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import _workloads as W

    kg = [W.WORKLOADS[w] for w in bench[bench.index("--workload") + 1].split(",") if W.WORKLOADS[w]["task"] == "kg"]
    assert [(k["model"], k["dim"] >= 256, k["num_nodes"] >= 10_000_000) for k in kg] == [("complex", True, True)], \
        "the KG race: ComplEx, dim >= 256, a table of at least 10M rows"
    for name in ("sync_audit", "cuda_tests"):
        argv = steps[name]["argv"]
        assert "-x" not in argv and "gpu.pytest_stream" in argv
        assert f"--outcome-stream={tmp_path / 'r' / 'tests.jsonl'}" in argv
    assert plan["budget_s"] + 60 <= 400, "set-up and the budget fit the documented timeout_s: 400"


@pytest.mark.parametrize("size", [[], ["--device", "cpu"], ["--tiny", "--device", "cpu"]])
def test_every_file_a_step_writes_into_the_output_folder_is_one_of_the_8(tmp_path, size):
    out = tmp_path / "r"
    for step in dry_run("--out", str(out), *size)["steps"]:
        named = [Path(a.split("=", 1)[-1]) for a in step["argv"] if str(out) in a]
        assert {p.name for p in named} | set(step["keep"]) | set(step["inputs"]) <= set(P.OUT_FILES), step["name"]
    assert len(P.OUT_FILES) <= 8


def test_only_names_unknown_steps():
    r = subprocess.run([PY, "scripts/gpu_suite.py", "--dry-run", "--only", "bench"], cwd=ROOT,
                       capture_output=True, text=True)
    assert r.returncode != 0 and "unknown step(s) ['bench']" in r.stderr


def test_set_up_unzips_a_dgl_wheel_for_another_python_once(tmp_path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    with zipfile.ZipFile(wheels / "dgl-1.1.3-cp39-cp39-manylinux1_x86_64.whl", "w") as z:
        z.writestr("dgl/__init__.py", "__version__ = 'fake'\n")
        z.writestr("dgl-1.1.3.dist-info/METADATA", "Name: dgl\n")
    env: Dict[str, str] = {}
    done = set_up(wheels, tmp_path / "site", env)
    assert (tmp_path / "site" / "dgl" / "__init__.py").exists() and env["DGL_FFI"] == "ctypes"
    assert done["wheels"] == [{"wheel": "dgl-1.1.3-cp39-cp39-manylinux1_x86_64.whl",
                               "how": "unzipped, DGL_FFI=ctypes"}]
    env = {}
    again = set_up(wheels, tmp_path / "site", env)  # a rerun on a warm machine
    assert again["wheels"][0]["how"] == "already in the site folder" and env["DGL_FFI"] == "ctypes"


def test_set_up_unzips_a_pure_python_wheel_pip_cannot_install(monkeypatch, tmp_path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    with zipfile.ZipFile(wheels / "littleutils-0.2.4-py3-none-any.whl", "w") as z:
        z.writestr("littleutils/__init__.py", "")
    no_pip = subprocess.CompletedProcess([], 1, "", "No module named pip")  # a machine without pip
    monkeypatch.setattr(gpu_wheels.subprocess, "run", lambda *a, **kw: no_pip)
    done = set_up(wheels, tmp_path / "site", {})
    assert done["wheels"][0]["how"] == "unzipped: pip failed" and (tmp_path / "site" / "littleutils").is_dir()


def test_set_up_names_a_missing_wheel_folder(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such folder"):
        set_up(tmp_path / "nope", tmp_path / "site", {})


def test_the_steps_env_names_dgls_backend_and_streams_output(tmp_path):
    env = step_env(tmp_path / "site")
    assert env["DGLBACKEND"] == "pytorch" and env["PYTHONUNBUFFERED"] == "1"
    assert env["PYTHONPATH"].split(os.pathsep)[:3] == [str(tmp_path / "site"), str(ROOT), str(ROOT / "scripts")]


def test_the_probe_reads_its_last_line_past_dgls_first_import_notice(tmp_path):
    assert last_json(f"{DGL_NOTICE}\n\n{{\"cuda\": false}}\n") == {"cuda": False}
    with pytest.raises(ValueError, match="not JSON"):
        last_json('{"cuda": false}\nDone.\n')
    fake = tmp_path / "probe.py"
    fake.write_text(f"import json; print({DGL_NOTICE!r}); print(json.dumps({{'cuda': False, 'dgl': '1.1.3'}}))\n")
    info = probe(dict(os.environ), "cpu", argv=[PY, str(fake)])
    assert info["cuda"] is False and info["dgl"] == "1.1.3" and info["chatter"] == DGL_NOTICE
    fake.write_text("print('no json here')\n")
    assert "not JSON" in probe(dict(os.environ), "cpu", argv=[PY, str(fake)])["probe_error"]


def test_budget_passes_unused_time_forward():
    now = [0.0]
    b = Budget(100.0, clock=lambda: now[0])
    assert b.limit(0.5, 0.5) == pytest.approx(50.0)
    now[0] = 10.0  # the first step used 10 of its 50 s
    assert b.limit(0.25, 0.25) == pytest.approx(45.0)
    now[0] = 200.0
    assert b.left() == 0.0 and b.limit(0.25, 0.0) == 0.0


def test_a_step_over_its_limit_is_killed_with_its_whole_group(tmp_path):
    late = tmp_path / "late"
    child = f"import time; time.sleep(1.5); open({str(late)!r}, 'w').close()"
    argv = [PY, "-c", f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {child!r}]); "
                      "print('started', flush=True); time.sleep(30)"]
    res = run_step("slow", argv, tmp_path / "log.txt", dict(os.environ), limit=1.0)
    assert res["status"] == "timeout" and res["seconds"] < 10
    assert "started" in res["tail"] and res["log"]["file"] == "log.txt"
    time.sleep(2)
    assert not late.exists(), "the step's child outlived the kill"


def fake_step(name: str, code: str, share: float = 0.25, needs: List[str] = (), inputs: List[str] = (),
              keep: List[str] = ()) -> Dict[str, Any]:
    return {"name": name, "argv": [PY, "-c", code], "share": share, "needs": list(needs), "inputs": list(inputs),
            "keep": list(keep)}


def run_fake_suite(monkeypatch, tmp_path, steps, budget: float = 60.0, cuda: bool = False) -> Dict[str, Any]:
    """gpu_suite.main in this process with ``steps`` as its plan and a stand-in probe (no torch import)."""
    monkeypatch.setattr(gpu_suite.P, "plan", lambda args, out, scratch: [
        {**s, "argv": [a.replace("SCRATCH", str(scratch)) for a in s["argv"]]} for s in steps])
    monkeypatch.setattr(gpu_suite, "probe", lambda env, device: {"cuda": cuda})
    monkeypatch.setattr(gpu_suite, "machine", lambda: {})
    out = tmp_path / "out"
    rc = gpu_suite.main(["--device", "cpu", "--out", str(out), "--budget", str(budget)])
    summary = json.loads((out / "summary.json").read_text())
    summary["rc"] = rc
    return summary


def test_a_killed_or_failed_step_never_stops_the_next_and_time_passes_forward(monkeypatch, tmp_path):
    s = run_fake_suite(monkeypatch, tmp_path, [
        fake_step("killed", "import time; time.sleep(60)", share=0.1),
        fake_step("failed", "import sys; print('boom'); sys.exit(3)", share=0.1),
        fake_step("quick", "print('fine')", share=0.4),
        fake_step("last", "print('last')", share=0.4)], budget=20.0)
    st = {r["name"]: r for r in s["steps"]}
    assert [r["status"] for r in s["steps"]] == ["ok", "timeout", "failed", "ok", "ok"] and s["rc"] == 1
    assert st["failed"]["rc"] == 3 and "boom" in st["failed"]["tail"]
    assert st["killed"]["limit_s"] == pytest.approx(2.0, abs=0.2)
    assert st["last"]["limit_s"] > 0.4 * 20.0 + 2.0, "the time 'quick' left unused passes to 'last'"
    assert s["status"] == "done" and s["files"] == ["env.json", "log.txt", "summary.json"]


def test_steps_missing_an_input_are_skipped_with_the_reason(monkeypatch, tmp_path):
    s = run_fake_suite(monkeypatch, tmp_path, [
        fake_step("needs_device", "print(1)", needs=["device"]),
        fake_step("needs_cuda", "print(1)", needs=["cuda"]),
        fake_step("needs_file", "print(1)", inputs=["bench_modes.json", "bench_modes.jsonl"])], budget=60.0)
    st = {r["name"]: r for r in s["steps"]}
    assert st["needs_cuda"]["status"] == "skipped" and "no CUDA" in st["needs_cuda"]["reason"]
    assert st["needs_device"]["status"] == "ok", "--device cpu needs no CUDA"
    assert st["needs_device"]["limit_s"] == pytest.approx(30.0, abs=1.0), "no share kept for a step without CUDA"
    assert st["needs_file"]["status"] == "skipped"
    assert "needs bench_modes.json or bench_modes.jsonl" in st["needs_file"]["reason"]
    assert s["rc"] == 0


def test_only_the_kept_files_come_into_the_output_folder(monkeypatch, tmp_path):
    code = "import sys; [open(f'SCRATCH/{n}', 'w').write('{}') for n in ('bench_modes.json', 'bench_modes.png')]"
    s = run_fake_suite(monkeypatch, tmp_path, [fake_step("bench", code, keep=["bench_modes.json"]),
                                               fake_step("model", "print(1)", inputs=["bench_modes.json"])])
    assert [r["status"] for r in s["steps"]] == ["ok", "ok", "ok"]
    assert s["files"] == ["bench_modes.json", "env.json", "log.txt", "summary.json"]


def test_a_bug_of_the_suite_is_on_record_in_the_summary(monkeypatch, tmp_path):
    def broken(*args):
        raise RuntimeError("a bug in the suite")

    monkeypatch.setattr(gpu_suite.P, "unmet", broken)
    with pytest.raises(RuntimeError, match="a bug in the suite"):
        run_fake_suite(monkeypatch, tmp_path, [fake_step("a", "print(1)")])
    s = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert s["status"] == "crashed" and "a bug in the suite" in s["traceback"] and s["steps"][0]["status"] == "ok"


def test_out_defaults_to_the_device_machines_out_folder(monkeypatch, tmp_path):
    monkeypatch.setenv("OUT", str(tmp_path))
    assert gpu_suite.out_dir(gpu_suite.parse([]), "stamp") == tmp_path / "gpu"
    monkeypatch.delenv("OUT")
    assert gpu_suite.out_dir(gpu_suite.parse([]), "stamp") == ROOT / "benchmarks" / "results" / "gpu" / "stamp"


def test_the_model_reads_the_benchs_stream_when_the_bench_was_cut_short(monkeypatch, tmp_path):
    cut = f"open({str(tmp_path / 'out' / 'bench_modes.jsonl')!r}, 'w').write('{{}}\\n'); import time; time.sleep(60)"
    model = {**fake_step("model", "", inputs=["bench_modes.json", "bench_modes.jsonl"]),
             "argv": [PY, "-c", "import sys; print('input', sys.argv[1])", "{input}"]}
    s = run_fake_suite(monkeypatch, tmp_path, [fake_step("bench", cut, share=0.1), model], budget=10.0)
    assert [r["status"] for r in s["steps"]] == ["ok", "timeout", "ok"]
    assert f"input {tmp_path / 'out' / 'bench_modes.jsonl'}" in s["steps"][2]["tail"]


def test_an_output_folder_with_files_is_refused(tmp_path):
    (tmp_path / "old.json").write_text("{}")
    with pytest.raises(SystemExit, match="already holds files"):
        gpu_suite.main(["--device", "cpu", "--out", str(tmp_path)])


def test_sigterm_kills_the_running_step_and_leaves_a_summary_that_says_so(tmp_path):
    out, late = tmp_path / "out", tmp_path / "late"
    driver = f"""
import sys; sys.path.insert(0, {str(ROOT / 'scripts')!r})
import gpu_suite
step = {{"name": "long", "argv": [sys.executable, "-c", "import time; time.sleep(2); open({str(late)!r}, 'w')"],
        "share": 1.0, "needs": [], "inputs": [], "keep": []}}
gpu_suite.P.plan = lambda args, out, scratch: [step]
gpu_suite.probe = lambda env, device: {{"cuda": False}}
gpu_suite.machine = lambda: {{}}
sys.exit(gpu_suite.main(["--device", "cpu", "--out", {str(out)!r}]))
"""
    proc = subprocess.Popen([PY, "-c", driver], stdout=subprocess.PIPE, text=True)
    assert "long: running" in proc.stdout.readline()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 1
    s = json.loads((out / "summary.json").read_text())
    assert s["status"] == "stopped by SIGTERM" and s["steps"][1]["status"] == "interrupted"
    time.sleep(2.5)
    assert not late.exists(), "the step outlived the suite"


def test_pytest_outcome_stream_keeps_every_report_before_a_kill(tmp_path):
    (tmp_path / "test_x.py").write_text(
        "import os, signal, pytest\n"
        "def test_a(): pass\n"
        "def test_b(): assert 1 == 2\n"
        "@pytest.mark.skip(reason='not here')\n"
        "def test_c(): pass\n"
        "def test_d(): os.kill(os.getpid(), signal.SIGKILL)\n")
    stream = tmp_path / "tests.jsonl"
    env = {**step_env(tmp_path / "site"), "PYTEST_ADDOPTS": ""}
    argv = [PY, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "gpu.pytest_stream",
            f"--outcome-stream={stream}", "--outcome-label=t", "--rootdir", str(tmp_path),
            str(tmp_path / "test_x.py")]
    res = run_step("t", argv, tmp_path / "log.txt", env, limit=60.0)
    assert res["status"] == "failed" and res["rc"] == -signal.SIGKILL
    lines = [json.loads(ln) for ln in stream.read_text().splitlines()]
    got = {ln["nodeid"].split("::")[-1]: ln for ln in lines if ln["event"] == "test"}
    assert lines[0]["event"] == "start" and all(ln["label"] == "t" for ln in lines)
    assert got["test_a"]["outcome"] == "passed" and got["test_b"]["outcome"] == "failed"
    assert "assert 1 == 2" in got["test_b"]["longrepr"] and got["test_c"]["reason"].endswith("not here")
    assert "test_d" not in got and lines[-1]["event"] != "finish"


def test_cuda_first_runs_the_tests_that_concern_cuda_before_the_rest(tmp_path):
    (tmp_path / "test_y.py").write_text(
        "import pytest\n"
        "def test_a(): pass\n"
        "@pytest.mark.parametrize('device', ['cpu', 'cuda'])\n"
        "def test_b(device): pass\n"
        "@pytest.mark.skipif(True, reason='needs CUDA')\n"
        "def test_c(): pass\n"
        "def test_d_on_cuda(): pass\n")
    stream = tmp_path / "tests.jsonl"
    subprocess.run([PY, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "gpu.pytest_stream",
                    f"--outcome-stream={stream}", "--cuda-first", "--rootdir", str(tmp_path),
                    str(tmp_path / "test_y.py")], env=step_env(tmp_path / "site"), capture_output=True, check=True)
    order = [json.loads(ln)["nodeid"].split("::")[-1] for ln in stream.read_text().splitlines()[1:-1]]
    assert order == ["test_b[cuda]", "test_c", "test_d_on_cuda", "test_a", "test_b[cpu]"]


def test_the_ci_sized_rehearsal_runs_every_step_to_its_end(tmp_path):
    """The suite as the GPU session runs it, at toy sizes on this CPU: fresh HOME (DGL's first import), --out
    outside the repository; every step ends ok, or skipped with its reason (no CUDA here)."""
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("DGLBACKEND", "OUT")}
    env["HOME"] = str(home)
    out = tmp_path / "gpu"
    r = subprocess.run([PY, "scripts/gpu_suite.py", "--tiny", "--device", "cpu", "--out", str(out),
                        "--site", str(tmp_path / "site")], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=600)
    s = json.loads((out / "summary.json").read_text())
    st = {x["name"]: x for x in s["steps"]}
    assert s["status"] == "done", r.stdout[-3000:] + r.stderr[-3000:]
    for name, rec in st.items():
        assert rec["status"] == "ok" or (rec["status"] == "skipped" and rec["reason"]), (name, rec)
    assert st["cuda_tests"]["status"] == "skipped" and "no CUDA" in st["cuda_tests"]["reason"]
    assert st["env"]["env"]["dgl"] and not st["env"]["env"]["cuda"]
    assert r.returncode == 0 and len(s["files"]) <= 8 and set(s["files"]) <= set(P.OUT_FILES)
    runs = [json.loads(ln) for ln in (out / "bench_modes.jsonl").read_text().splitlines()]
    assert runs, "bench_modes streamed nothing"
    tests = [json.loads(ln) for ln in (out / "tests.jsonl").read_text().splitlines()]
    assert tests[-1]["event"] == "finish" and tests[-1]["label"] == "sync_audit"


def test_equality_repeat_reports_each_run_and_keeps_going(tmp_path):
    """scripts/gpu/equality_repeat.py on the CPU: one JSON line a run, oac equal to the reference sync run; an
    unknown variant is refused by name."""
    out = tmp_path / "repeat.jsonl"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    subprocess.run([PY, "scripts/gpu/equality_repeat.py", "--device", "cpu", "--repeats", "1", "--variants",
                    "sync,oac4_w0", "--label", "ci", "--out", str(out)], cwd=ROOT, env=env, check=True,
                   capture_output=True, timeout=300)
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert [(x["variant"], x["label"]) for x in lines] == [("sync", "ci"), ("oac4_w0", "ci")]
    assert all(x["first_loss_diff"] is None and x["table_equal"] and x["state_equal"] for x in lines)
    assert lines[1]["rows_patched"] > 0 and lines[1]["num_workers"] == 0
    bad = subprocess.run([PY, "scripts/gpu/equality_repeat.py", "--variants", "nope"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "unknown variant(s) ['nope']" in bad.stderr


def test_committed_results_name_no_machines_paths():
    """Every result file under benchmarks/results (not the prose pages, which quote commands) spells the paths of
    the machine it ran on as placeholders (scripts/gpu/normalize_paths.py)."""
    from gpu.normalize_paths import left_over, normalize

    left = {str(p.relative_to(ROOT)): left_over(p.read_text(errors="replace"))
            for p in (ROOT / "benchmarks" / "results").rglob("*")
            if p.is_file() and p.suffix in (".json", ".jsonl", ".txt", ".log")}
    assert {k: v for k, v in left.items() if v} == {}
    line = ("/opt/torch/.venv/bin/python3 x.py --out /root/out/gpu/a.json --stream /tmp/dgl-oac-gpu-scratch-ab_1/b "
            f"{ROOT}/tests/t.py /tmp/dgl-oac-gpu-site/dgl/x.py /opt/torch/.venv/lib/python3.12/site-packages/y.py")
    assert normalize(line, ROOT) == ("python3 x.py --out $OUT/gpu/a.json --stream $SCRATCH/b ./tests/t.py "
                                     "$SITE/dgl/x.py $SITE_PACKAGES/y.py")
    assert left_over(normalize(line, ROOT)) == [] and left_over("see /home/me/x") == ["/home/me/x"]
