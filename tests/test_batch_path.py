"""One steady-state oac batch runs code in at most 15 library files (scripts/batch_path.py measures them; the
model's own files left out). ARCHITECTURE.md draws the path: a change that lengthens it shows up here."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("dgl")

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "batch_path.py"
MAX_FILES = 15


@pytest.fixture(scope="module")
def measured():
    env = {**os.environ, "DGLBACKEND": "pytorch"}
    out = subprocess.run([sys.executable, str(SCRIPT), "--json"], capture_output=True, text=True, env=env,
                         timeout=300, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_one_batch_runs_code_in_at_most_15_library_files(measured):
    assert 0 < len(measured["files"]) <= MAX_FILES, measured["files"]


def test_the_path_crosses_the_layers_it_claims(measured):
    """The recording sees what a batch does: the epoch, the engine's stages, the optimizer, on the caller's and
    the gather thread; the model's own files are not counted."""
    files = set(measured["files"])
    assert {"loading/epoch.py", "engine/pipeline.py", "engine/table.py", "engine/step.py", "optim/base.py"} <= files
    assert not any(f.startswith("app/") for f in files)
    functions = {(f, fn) for f, fn, _ in measured["calls"]}
    assert ("engine/pipeline.py", "validate_rows") in functions and ("engine/step.py", "commit") in functions
    threads = {t for _, _, t in measured["calls"]}
    assert len(threads) >= 2, threads  # the gather thread's work is counted too
