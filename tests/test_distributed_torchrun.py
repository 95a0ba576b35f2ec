"""``torchrun --standalone --nproc_per_node=2 examples/multi_trainer.py``: two trainers (DDP for the model, the
shared table for the embeddings) learn, and oac ends with the same table, bit for bit, as sync."""
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "multi_trainer.py"


def torchrun(*args: str) -> dict:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(EXAMPLE),
           "--num-nodes", "2000", "--epochs", "2", *args]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # torchrun and its workers
        proc.communicate()
        raise
    assert proc.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])


@pytest.mark.hang_timeout(600)
def test_torchrun_two_trainers_oac_equals_sync():
    oac = torchrun("--mode", "oac")
    sync = torchrun("--mode", "sync")
    assert oac["table_sha256"] == sync["table_sha256"]
    assert oac["test_accuracy"] == sync["test_accuracy"] > 0.2  # 5 planted classes: chance is 0.2
    assert oac["stats"]["committed"] == oac["stats"]["batches"] > 0
