"""benchmarks/_resident.py, the race's ceiling mode: on the CPU the resident table trains sync's bits exactly
(table, optimizer state, dense parameters, losses), node and KG workloads, with and without optimizer state."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import _resident as R  # noqa: E402
import _workloads as W  # noqa: E402
import bench_modes  # noqa: E402

STEPS = 6

pytestmark = pytest.mark.usefixtures("single_torch_thread")


def _settings(name: str):
    args = bench_modes.parse(["--quick", "--workload", name])
    return W.settings(args, name)


def _train(w, ds, mode: str):
    """``STEPS`` steps of workload ``w`` in ``mode``: (losses, values, state, dense parameters), all CPU."""
    torch.manual_seed(w.seed)
    task = W.build_task(w, ds, mode, 1, "idle", 0)
    try:
        it = iter(task.loader)
        losses = [task.step(next(it)) for _ in range(STEPS)]
        if hasattr(task.emb, "flush"):
            task.emb.flush()
        out = (torch.stack(losses), task.emb.weight.clone(), task.emb.optm_state.clone(),
               {k: v.detach().clone() for k, v in task.model.state_dict().items()})
    finally:
        task.close()
    return out


@pytest.mark.hang_timeout(120)
@pytest.mark.parametrize("name", ["node-adam-128", "node-sgd-32-model", "kg-adagrad-256"])
def test_resident_trains_the_same_bits_as_sync_on_cpu(name):
    w = _settings(name)
    ds = W.dataset(w)
    sync = _train(w, ds, "sync")
    resident = _train(w, ds, "resident")
    for what, a, b in zip(("losses", "table", "optimizer state"), sync[:3], resident[:3]):
        assert torch.equal(a, b), f"{name}: resident's {what} differs from sync's"
    assert sync[2].shape[1] == W.row_floats(w.optimizer, w.dim) - w.dim  # the state was trained too
    assert sync[3].keys() == resident[3].keys()
    for k in sync[3]:
        assert torch.equal(sync[3][k], resident[3][k]), f"{name}: dense parameter {k} differs"
    # and training moved the table: equality is not two untouched copies
    torch.manual_seed(w.seed)
    fresh = W.build_task(w, ds, "sync", 1, "idle", 0)
    try:
        assert not torch.equal(fresh.emb.weight, sync[1])
    finally:
        fresh.close()


def test_resident_is_the_table_in_place_on_cpu_and_refuses_a_trained_or_foreign_task():
    w = _settings("node-adam-128")
    ds = W.dataset(w)
    task = W.build_task(w, ds, "sync", 1, "idle", 0)
    try:
        store = task.emb.store.table
        R.make_resident(task)
        assert task.emb.table.data_ptr() == store.data_ptr()  # no copy on the CPU
        assert isinstance(task.sparse, R.ResidentOptimizer) and not task.loader.embeddings
    finally:
        task.close()
    task = W.build_task(w, ds, "sync", 1, "idle", 0)
    try:
        task.step(next(iter(task.loader)))
        with pytest.raises(ValueError, match="needs a fresh task; NodeEmbedding 'emb' has trained 1 steps"):
            R.make_resident(task)
    finally:
        task.close()
    task = W.build_task(w, ds, "dgl", 1, "idle", 0)
    try:
        with pytest.raises(TypeError, match="needs a dgl-oac task"):
            R.make_resident(task)
    finally:
        task.close()


def test_a_read_without_a_gradient_is_dropped_at_the_step_and_the_device_is_checked():
    table = torch.arange(12, dtype=torch.float32).reshape(4, 3)  # dim 2, one state column
    emb = R.ResidentEmbedding("t", table, 2)

    class Kernel:  # w -= g, the state column counts updates
        duplicate_reduction = "mean"

        def update_table(self, view, rows, grad):
            assert view.store.dim == 2 and view.name == "t"
            out = rows.clone()
            out[:, :2] -= grad
            out[:, 2] += 1
            return out

    opt = R.ResidentOptimizer(Kernel(), [emb])
    emb(torch.tensor([0, 1]))  # no backward: dropped at the step
    emb(torch.tensor([3, 1])).sum().backward()
    opt.step()
    want = torch.arange(12, dtype=torch.float32).reshape(4, 3)
    want[[3, 1], :2] -= 1.0
    want[[3, 1], 2] += 1.0
    assert torch.equal(emb.table, want)
    with pytest.raises(ValueError, match="lives on cpu, not meta"):
        emb(torch.tensor([0]), torch.device("meta"))
