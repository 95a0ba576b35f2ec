"""The runnable examples (examples/*.py) keep working: they train above chance, and a run resumed from its
checkpoint ends with the same table, bit for bit, as an uninterrupted one."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def run(script: str, *args: str) -> dict:
    nodes = "5000" if script == "link_prediction.py" else "2000"  # (link prediction needs more edges to learn)
    proc = subprocess.run([sys.executable, str(EXAMPLES / script), "--num-nodes", nodes, *args],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.hang_timeout(600)
@pytest.mark.parametrize("script,metric,chance", [
    ("node_classification.py", "test_accuracy", 0.2),  # CI's end-to-end example; the other two: pytest -m slow
    pytest.param("link_prediction.py", "test_mrr", 0.06, marks=pytest.mark.slow),
    pytest.param("kg_embedding.py", "test_mrr", 0.035, marks=pytest.mark.slow)])
def test_example_trains_checkpoints_and_resumes_exactly(tmp_path, script, metric, chance):
    whole = run(script, "--epochs", "2", "--ckpt", str(tmp_path / "whole.ckpt"))
    assert whole[metric] > chance and whole["stats"]["committed"] == whole["stats"]["batches"]
    run(script, "--epochs", "1", "--ckpt", str(tmp_path / "split.ckpt"))
    resumed = run(script, "--epochs", "2", "--ckpt", str(tmp_path / "split.ckpt"), "--resume")
    assert resumed["table_sha256"] == whole["table_sha256"]
    assert resumed[metric] == whole[metric]
