"""``torchrun --standalone --nproc_per_node=2 examples/multi_trainer.py``: two trainers (DDP for the model, the
shared table for the embeddings) learn, and oac ends with the same table, bit for bit, as sync."""
import json
from pathlib import Path

import pytest

from dist_helpers import torchrun

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "multi_trainer.py"


def run_example(*args: str) -> dict:
    out = torchrun(str(EXAMPLE), "--num-nodes", "2000", "--epochs", "2", *args)
    return json.loads(out.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.hang_timeout(600)
def test_torchrun_two_trainers_oac_equals_sync():
    oac = run_example("--mode", "oac")
    sync = run_example("--mode", "sync")
    assert oac["table_sha256"] == sync["table_sha256"]
    assert oac["test_accuracy"] == sync["test_accuracy"] > 0.2  # 5 planted classes: chance is 0.2
    assert oac["stats"]["committed"] == oac["stats"]["batches"] > 0
