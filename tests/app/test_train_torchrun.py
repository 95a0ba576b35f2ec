"""``torchrun --standalone --nproc_per_node=2 -m dgl_oac train``: two trainers train a task; oac's table (values
and optimizer state, read from the checkpoint's per-owner shards) and metrics equal sync's bit for bit; a run stopped
mid-epoch and continued with ``--resume`` ends equal to an uninterrupted one; resuming with another number of
trainers is a clear error. The launch settings (:mod:`dgl_oac.app.tasks.launch`), CUDA's included, are checked on
CPU."""
from typing import Dict

import pytest
import torch

from dgl_oac.app.cli import main
from dgl_oac.app.tasks import TrainConfig, launch

from dist_helpers import LAUNCH_S, SMALL, metrics_of, torchrun_train

def assert_oac_equals_sync(oac: Dict, sync: Dict) -> None:
    assert oac["trainers"] == sync["trainers"] == 2
    assert oac["steps"] == sync["steps"] > 0
    assert torch.equal(oac["table"], sync["table"])  # values and optimizer state, every owner's rows
    assert metrics_of(oac["curve"]) == metrics_of(sync["curve"]) and len(oac["curve"]) == 2
    assert oac["loader_stats"]["rows_patched"] > 0  # rank 0 read ahead and was patched (other owners' writes)
    assert "on each of 2 trainers" in oac["stdout"] and oac["stdout"].count("throughput:") == 1  # rank 0 prints


@pytest.mark.hang_timeout(2 * LAUNCH_S + 120)
def test_node_two_trainers_oac_equals_sync(tmp_path):
    sync = torchrun_train(tmp_path, "sync", "node", "sync")
    oac = torchrun_train(tmp_path, "oac", "node", "oac")
    assert_oac_equals_sync(oac, sync)
    assert oac["final"]["test_acc"] > 0.3  # 8 planted classes: chance is 0.125


@pytest.fixture(scope="module")
def kg_runs(tmp_path_factory) -> Dict:
    tmp = tmp_path_factory.mktemp("kg")
    return {"tmp": tmp, "sync": torchrun_train(tmp, "sync", "kg", "sync"),
            "oac": torchrun_train(tmp, "oac", "kg", "oac")}


@pytest.mark.slow
@pytest.mark.hang_timeout(2 * LAUNCH_S + 120)
def test_kg_two_trainers_oac_equals_sync(kg_runs):
    assert_oac_equals_sync(kg_runs["oac"], kg_runs["sync"])


@pytest.mark.slow
@pytest.mark.hang_timeout(2 * LAUNCH_S + 120)
def test_kg_two_trainers_resume_equals_uninterrupted(kg_runs, tmp_path):
    full = kg_runs["oac"]
    stop = full["steps"] // 2 - 1  # inside the first epoch: each trainer resumes mid-epoch
    cut = torchrun_train(tmp_path, "run", "kg", "oac", "--max-steps", str(stop), "--checkpoint-every", str(stop))
    assert cut["steps"] == stop
    resumed = torchrun_train(tmp_path, "run", "kg", "oac", "--resume")
    assert resumed["checkpoint"]["resumed_at_step"] == stop and resumed["steps"] == full["steps"]
    assert torch.equal(resumed["table"], full["table"])
    assert metrics_of([resumed["final"]]) == metrics_of([full["final"]])


def test_resume_with_another_number_of_trainers_is_an_error(kg_runs, capsys):
    argv = ["train", "--task", "kg", "--mode", "oac", "--epochs", "2", "--seed", "3", "--no-progress",
            "--checkpoint-dir", str(kg_runs["tmp"] / "oac"), "--resume", *SMALL["kg"]]
    assert main(argv) == 2
    assert "written by 2 trainer(s), this run has 1" in capsys.readouterr().err


def test_launch_settings():
    assert launch.world_size({}) == 1 and launch.world_size({"WORLD_SIZE": "4"}) == 4
    with pytest.raises(ValueError, match="WORLD_SIZE must be a positive integer"):
        launch.world_size({"WORLD_SIZE": "two"})
    assert launch.trainer_device("cuda", 3, cuda_available=True) == "cuda:3"  # one GPU per trainer
    assert launch.trainer_device("auto", 1, cuda_available=True) == "cuda:1"
    assert launch.trainer_device("auto", 1, cuda_available=False) == "cpu"
    assert launch.trainer_device("cuda:0", 1, cuda_available=True) == "cuda:0"  # explicit: kept
    assert launch.backend_for("cpu") == "gloo"
    assert launch.backend_for("cuda:1") == "cpu:gloo,cuda:nccl"  # table rows travel as CPU tensors
    assert launch.start(TrainConfig(mode="async"), env={}) is None  # one process: nothing to start
    with pytest.raises(ValueError, match="--mode dgl with 2 trainers"):  # plain DGL's path is single-process
        launch.start(TrainConfig(mode="dgl"), env={"WORLD_SIZE": "2"})
