"""``dgl-oac``'s ends a user causes, each one line with its own exit status (issue 38): a NaN step (the step and
the table named, 3), Ctrl-C (130), a refused flag (the valid range, 2); ``--prefetch 0`` as sync's schedule;
``--help`` as plain text, parsed without importing torch or DGL."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from dgl_oac.app.cli import EXIT_INTERRUPTED, EXIT_NONFINITE, build_parser, main, options

ROOT = Path(__file__).resolve().parents[2]
SMALL = ["train", "--num-nodes", "300", "--no-progress", "--epochs", "1"]


def _env() -> dict:
    return dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))


def test_help_imports_neither_torch_nor_dgl_and_is_plain_text():
    """The parser module alone (the package's ``__init__`` stubbed out: it imports the library) answers both
    helps and refuses a flag without importing torch or DGL, whose imports take seconds."""
    probe = textwrap.dedent(f"""
        import contextlib, io, json, sys, types
        pkg = types.ModuleType("dgl_oac"); pkg.__path__ = [{str(ROOT / "dgl_oac")!r}]; sys.modules["dgl_oac"] = pkg
        from dgl_oac.app.cli import main
        out = {{}}
        for argv in (["--help"], ["train", "--help"], ["train", "--threads", "0"]):
            text = io.StringIO()
            with contextlib.redirect_stdout(text), contextlib.redirect_stderr(text):
                try:
                    main(argv)
                except SystemExit as exc:
                    out[" ".join(argv)] = [exc.code, text.getvalue()]
        out["heavy"] = sorted(m for m in ("torch", "dgl", "numpy") if m in sys.modules)
        print(json.dumps(out))
    """)
    run = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, env=_env())
    assert run.returncode == 0, run.stderr
    import json

    out = json.loads(run.stdout)
    assert out.pop("heavy") == []
    assert out["train --threads 0"][0] == 2 and "--threads: must be an integer >= 1" in out["train --threads 0"][1]
    for argv in ("--help", "train --help"):
        code, text = out[argv]
        assert code == 0 and "usage: dgl-oac" in text and "exit status: 0 done" in text
        for rest in ("``", ":mod:", ":func:", ":class:", "`"):  # no reST or Markdown leaks into a terminal
            assert rest not in text, (argv, rest)


@pytest.mark.parametrize("argv,msg", [
    (["--num-nodes", "0"], "argument --num-nodes: must be an integer >= 16"),
    (["--num-nodes", "5"], "argument --num-nodes: must be an integer >= 16"),
    (["--num-nodes", "many"], "argument --num-nodes: must be an integer >= 16"),
    (["--threads", "0"], "argument --threads: must be an integer >= 1, got '0'"),
    (["--num-workers", "-1"], "argument --num-workers: must be an integer >= 0, got '-1'"),
    (["--max-steps", "0"], "argument --max-steps: must be an integer >= 1, got '0'"),
    (["--prefetch", "-1"], "argument --prefetch: must be 'auto' or an integer >= 0 (0: sync's schedule)"),
    (["--dataset", "cora", "--num-nodes", "500"], "--num-nodes: sizes the generated datasets"),
])
def test_refused_values_name_the_flag_and_the_range(argv, msg, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["train", *argv])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and msg in err, err
    assert "num_classes" not in err and "num_nodes" not in err  # flags, not internal parameters
    assert "Traceback" not in err


def test_prefetch_0_is_syncs_schedule(capsys):
    parser = build_parser()
    for mode in ("oac", "async"):
        opts = options(parser, parser.parse_args(["train", "--mode", mode, "--prefetch", "0"]))
        assert (opts["mode"], opts["prefetch"]) == ("sync", "auto")
        assert "--prefetch 0 gathers each batch after the previous step" in capsys.readouterr().err
    opts = options(parser, parser.parse_args(["train", "--mode", "async", "--staleness", "gap", "--prefetch", "0"]))
    assert (opts["mode"], opts["staleness"]) == ("sync", None)
    assert main([*SMALL, "--prefetch", "0", "--max-steps", "2"]) == 0
    out = capsys.readouterr().out
    assert "node on synthetic [sync]" in out and "conflict rate" not in out  # sync reads after every step


def test_a_nan_step_is_one_line_naming_the_step_and_the_table(capsys):
    # --dense-lr 1e30: the first dense step makes the model's output infinite, the next gradient NaN
    assert main([*SMALL, "--batch-size", "32", "--dense-lr", "1e30"]) == EXIT_NONFINITE == 3
    captured = capsys.readouterr()
    lines = [line for line in captured.err.splitlines() if line.strip()]
    assert len(lines) == 1, captured.err
    assert re.match(r"dgl-oac: error: training stopped at step \d+: NaN or Inf in .* of NodeEmbedding 'emb'",
                    lines[0]), lines[0]
    assert "--lr" in lines[0] and "Traceback" not in captured.err and "best validation" not in captured.out


@pytest.mark.hang_timeout(240)
def test_ctrl_c_is_one_line_and_exit_130(tmp_path):
    """SIGINT once training has started (the progress bar is on stderr): one line, status 130, no traceback,
    and the process ends (the task's threads stopped)."""
    # SIGINT as a terminal gives it (a test run started in the background of a script ignores it, and a child
    # inherits that: Python then installs no handler and Ctrl-C does nothing, as Unix intends)
    proc = subprocess.Popen([sys.executable, "-m", "dgl_oac", "train", "--num-nodes", "3000", "--epochs", "100",
                             "--batch-size", "64"], cwd=tmp_path, env=_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        seen = ""
        deadline = time.monotonic() + 180
        while "it/s" not in seen and "s/it" not in seen:  # a step done: tqdm shows a rate
            assert proc.poll() is None and time.monotonic() < deadline, seen[-2000:]
            seen += proc.stderr.read(1)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == EXIT_INTERRUPTED == 130, (out, seen + err)
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    last = [line for line in re.split(r"[\r\n]", err) if line.strip()][-1]
    assert re.fullmatch(r"dgl-oac: interrupted \(Ctrl-C\) after \d+ steps", last.strip()), last
