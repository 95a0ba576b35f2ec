"""Processes that leave an oac epoch early exit cleanly (issue 10, item 10): ``scripts/exit_soak.py``.

The old core aborted (exit 134, ``terminate called without an active exception``) in most such runs: a daemon
gather or write-back thread was still inside a torch call while the interpreter finalized. The full acceptance
run is ``python scripts/exit_soak.py --runs 50`` (200 processes); CI runs two rounds.
"""
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "exit_soak.py"


@pytest.mark.slow
@pytest.mark.hang_timeout(300)
def test_early_exits_never_abort():
    proc = subprocess.run([sys.executable, str(SCRIPT), "--runs", "2"], capture_output=True, text=True,
                          timeout=290)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert "8 passed, 0 failed" in proc.stdout


@pytest.mark.slow
@pytest.mark.hang_timeout(300)
def test_early_exits_with_sampling_workers_never_abort_nor_leave_orphans():
    proc = subprocess.run([sys.executable, str(SCRIPT), "--runs", "1", "--num-workers", "2"], capture_output=True,
                          text=True, timeout=290)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert "4 passed, 0 failed" in proc.stdout
