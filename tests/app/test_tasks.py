"""``dgl-oac train`` end to end for every task and mode on small synthetic data, plus the task contracts:
oac's per-epoch metrics equal sync's exactly, async runs, bad input fails with a clear message."""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Dict, List

import dgl
import pytest
import torch

from dgl_oac.app.cli import main
from dgl_oac.app.data import data_root, generate_synthetic
from dgl_oac.app.tasks import TrainConfig, backend, build_task
from dgl_oac.app.tasks.common import run
from dgl_oac.app.tasks.kg import KGTask, seeded_uniform
from dgl_oac.app.tasks.link import LinkTask, reverse_edge_ids

MODES = ("sync", "async", "oac", "dgl")
TIMING = {"epoch", "train_seconds", "epoch_seconds", "eval_seconds"}
# Small and fast: 500 nodes/entities, 5 batches per epoch (node: 300 train nodes / 64; link: 2250 train pairs
# / 512; kg: 2250 train triples / 512), one torch thread (the test machine is shared; OpenMP teams of 2 on a
# busy 2-core machine stall at every barrier).
SMALL = {
    "node": ["--num-nodes", "500", "--batch-size", "64", "--fanouts", "5,5", "--dim", "16", "--hidden", "16"],
    "link": ["--num-nodes", "500", "--batch-size", "512", "--fanouts", "5,5", "--dim", "16", "--hidden", "16",
             "--negatives", "16"],
    "kg": ["--num-nodes", "500", "--batch-size", "512", "--dim", "16", "--negatives", "32", "--model", "complex"],
}
METRIC = {"node": "valid_acc", "link": "valid_mrr", "kg": "valid_mrr"}
# exactness checks want real staleness: gathers that run as soon as they are queued (at the default idle
# priority they may run late, after the steps in flight, and find little to patch)
STALE = ["--background-priority", "normal"]


def train_cli(tmp_path: Path, task: str, mode: str, *extra: str, max_steps: int = 8, epochs: int = 2) -> Dict:
    out = tmp_path / f"{task}-{mode}.json"
    argv = ["train", "--task", task, "--mode", mode, "--epochs", str(epochs), "--max-steps", str(max_steps),
            "--seed", "3", "--threads", "1", "--no-progress", "--out", str(out), *SMALL[task], *extra]
    assert main(argv) == 0
    return json.loads(out.read_text())


@pytest.fixture(autouse=True)
def _restore_threads():
    """``--threads`` sets torch's thread count for the process: give the next test file its own back."""
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def metrics_of(curve: List[Dict]) -> List[Dict]:
    return [{k: v for k, v in p.items() if k not in TIMING} for p in curve]


@pytest.mark.hang_timeout(60)
@pytest.mark.parametrize("task", ["kg", "link", "node"])
@pytest.mark.parametrize("mode", MODES)
def test_cli_trains_every_task_in_every_mode(tmp_path, task, mode):
    res = train_cli(tmp_path, task, mode)
    assert res["config"]["task"] == task and res["config"]["mode"] == mode
    assert res["steps"] == 8
    curve = res["curve"]
    assert len(curve) == 2 and [p["epoch"] for p in curve] == [1, 2]
    for p in curve:
        assert p["train_seconds"] > 0 and math.isfinite(p["train_loss"])
        assert 0.0 <= p[METRIC[task]] <= 1.0
    if task != "node":
        assert {"valid_mrr", "valid_hits@1", "valid_hits@3", "valid_hits@10", "test_mrr"} <= set(curve[-1])
    assert curve[1]["train_seconds"] > curve[0]["train_seconds"]
    assert res["final"] == curve[-1]
    assert Path(str(tmp_path / f"{task}-{mode}.png")).exists()  # the CLI plots beside the JSON
    if mode in ("sync", "async", "oac"):
        assert res["loader_stats"]["batches"] >= 8


@pytest.mark.hang_timeout(60)
@pytest.mark.parametrize("model", ["distmult", "complex", "transe"])
def test_kg_oac_equals_sync_epoch_by_epoch(tmp_path, model):
    """Same seed: oac reproduces sync's per-epoch losses and filtered metrics bit for bit, although it
    patched rows (hub entities and shared negatives recur in consecutive batches); async runs too."""
    extra = ["--model", model, "--optimizer", "adagrad", "--lr", "0.2", "--dense-lr", "0.05",
             "--reg-weight", "0.001", "--prefetch", "3", *STALE]
    runs = {m: train_cli(tmp_path, "kg", m, *extra, max_steps=100, epochs=3) for m in ("sync", "oac", "async")}
    sync, oac, asy = (metrics_of(runs[m]["curve"]) for m in ("sync", "oac", "async"))
    assert len(sync) == 3
    assert oac == sync
    assert runs["oac"]["loader_stats"]["rows_patched"] > 0
    assert len(asy) == 3 and all(math.isfinite(p["valid_mrr"]) for p in asy)


@pytest.mark.hang_timeout(60)
def test_link_oac_equals_sync(tmp_path):
    runs = {m: train_cli(tmp_path, "link", m, "--scorer", "mlp", "--neg-dist", "degree", *STALE, max_steps=12)
            for m in ("sync", "oac")}
    assert metrics_of(runs["oac"]["curve"]) == metrics_of(runs["sync"]["curve"])
    assert runs["oac"]["loader_stats"]["rows_patched"] > 0


@pytest.mark.hang_timeout(60)
def test_kg_tables_equal_and_learning():
    """Through the Python API: after training, oac's entity table and relation table equal sync's bitwise,
    and the model has learned (filtered test MRR well above a random ranking's, ln(500)/500 ~ 0.012)."""
    torch.set_num_threads(1)
    tables = {}
    for mode in ("sync", "oac"):
        cfg = TrainConfig(task="kg", mode=mode, num_nodes=500, epochs=6, batch_size=64, dim=16, negatives=64,
                          model="distmult", optimizer="adagrad", lr=0.05, dense_lr=0.05, reg_weight=0.05,
                          seed=1, progress=False, background_priority="normal", extra={"num_classes": 4})
        task = build_task(cfg)
        res = run(cfg, task)  # closes the task; the tables stay readable
        tables[mode] = (task.emb.weight.clone(), task.model.relation.weight.detach().clone(), res)
    assert torch.equal(tables["sync"][0], tables["oac"][0])
    assert torch.equal(tables["sync"][1], tables["oac"][1])
    assert tables["oac"][2]["loader_stats"]["rows_patched"] > 0
    curve = tables["sync"][2]["curve"]
    assert curve[-1]["test_mrr"] > 0.05 > curve[0]["test_mrr"]
    assert curve[-1]["train_loss"] < curve[0]["train_loss"]


@pytest.mark.parametrize("mode,storage", [("sync", "memory"), ("sync", "file"), ("dgl", "memory")])
def test_kg_entity_init_does_not_repeat_every_chunk(tmp_path, mode, storage):
    """The KG entity init over more than 2**20 rows (the file-backed table's init chunk): no row equals the row
    2**20 later, and every backend and storage gets the values of one draw over the whole table."""
    chunk, num, dim = 1 << 20, (1 << 20) + 64, 2
    path = str(tmp_path / "entity.bin") if storage == "file" else "memory"
    emb = backend.make_embedding(mode, num, dim, "entity", seeded_uniform(7, 0.1), storage=path)
    try:
        table = backend.table_of(emb)
        assert not (table[:num - chunk] == table[chunk:]).all(1).any()
        expect = seeded_uniform(7, 0.1)(torch.empty(num, dim))
        assert torch.equal(table, expect)
    finally:
        backend.close(None, [emb])


def test_kg_entity_init_is_one_stream_whatever_the_calls_and_threads(monkeypatch):
    """seeded_uniform's values depend only on the seed and each element's place in the stream: chunks of any
    size (crossing its blocks), any thread count and a non-contiguous table get the values of one call; they are
    uniform in [-scale, scale) and a different seed draws different values."""
    import dgl_oac.app.tasks.kg as kg

    monkeypatch.setattr(kg, "INIT_BLOCK", 1000)  # many blocks, chunks that start and end inside them
    whole = seeded_uniform(3, 0.5, threads=4)(torch.empty(901, 7))
    for threads in (1, 3):
        init, parts = seeded_uniform(3, 0.5, threads=threads), torch.empty(901, 7)
        for lo, hi in ((0, 1), (1, 150), (150, 151), (151, 600), (600, 901)):
            init(parts[lo:hi])
        assert torch.equal(parts, whole), threads
    strided = torch.empty(7, 901).t()  # a transposed view: filled as a contiguous copy, returned
    assert torch.equal(seeded_uniform(3, 0.5)(strided), whole)
    assert whole.min() >= -0.5 and whole.max() < 0.5 and abs(whole.mean().item()) < 0.02
    assert not torch.equal(seeded_uniform(4, 0.5)(torch.empty(901, 7)), whole)
    with pytest.raises(TypeError, match="float32"):
        seeded_uniform(3, 0.5)(torch.empty(3, 3, dtype=torch.float64))


def test_a_failing_run_closes_its_task():
    """An error in the middle of training (here the model's step) still stops the task's threads."""
    import threading

    cfg = TrainConfig(task="node", mode="oac", num_nodes=300, epochs=1, batch_size=32, dim=8, hidden=8,
                      fanouts="3,3", progress=False)
    task = build_task(cfg)
    calls = []

    def broken(batch):
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("model blew up")
        return original(batch)

    original, task.step = task.step, broken
    with pytest.raises(RuntimeError, match="model blew up"):
        run(cfg, task)
    alive = [t.name for t in threading.enumerate() if t.name.startswith("dgl-oac") and t.is_alive()]
    assert alive == [], alive
    assert task.emb.weight.shape == (300, 8)  # closed, still readable


@pytest.mark.usefixtures("single_torch_thread")
def test_a_step_returns_its_loss_unread_and_the_driver_reads_them_together(monkeypatch):
    """No host sync a step: ``step()`` returns the loss as a detached 0-d tensor (``float(loss)`` there used
    to wait for the device every step), and the driver reads an epoch's losses together: without a progress
    bar once, at the epoch's end; with one, every ``PROGRESS_EVERY`` steps. ``train_loss`` is still the mean of
    every step's ``float(loss)``."""
    from dgl_oac.app.tasks import base, common

    cfg = TrainConfig(task="node", mode="sync", num_nodes=300, epochs=1, batch_size=8, dim=8, hidden=8,
                      fanouts="3,3", max_steps=common.PROGRESS_EVERY + 3, progress=False)
    task = build_task(cfg)
    seen, reads = [], []
    step = task.step

    def recorded(batch):
        loss = step(batch)
        seen.append(loss)
        return loss

    flush = base.EpochLosses._flush
    monkeypatch.setattr(base.EpochLosses, "_flush",
                        lambda self: (reads.append(len(self._pending)) if self._pending else None, flush(self)))
    task.step = recorded
    point = run(cfg, task)["curve"][0]
    assert all(isinstance(x, torch.Tensor) and x.dim() == 0 and not x.requires_grad for x in seen)
    assert reads == [len(seen)] == [cfg.max_steps]  # one read, at the epoch's end
    assert point["train_loss"] == sum(float(x) for x in seen) / len(seen)
    cfg.progress = True
    task, reads[:] = build_task(cfg), []
    step, task.step = task.step, recorded
    run(cfg, task)
    assert reads == [common.PROGRESS_EVERY, 3]  # the bar's update, then the epoch's end
    reads.clear()
    losses = base.EpochLosses(every=4, done=[0.5])
    for x in seen[:10]:
        losses.add(x)
    assert losses.values() == [0.5] + [float(x) for x in seen[:10]] and reads == [4, 4, 2]
    assert losses.mean(2) == (float(seen[8]) + float(seen[9])) / 2


@pytest.mark.hang_timeout(120)
@pytest.mark.skipif(not (data_root() / "FB15k-237").is_dir(), reason=f"shared data not found at {data_root()}")
def test_kg_oac_equals_sync_bitwise_with_two_threads():
    """FB15k-237 (shared data), 2 torch threads: two sync runs and an oac run end with bitwise equal tables. The
    step gathers rows with index_select, whose backward sums in a fixed order; with advanced indexing (x[ids])
    the accumulating backward ran on threads and two sync runs already differed in the 9th digit."""
    torch.set_num_threads(2)
    tables = []
    for mode in ("sync", "sync", "oac"):
        cfg = TrainConfig(task="kg", dataset="FB15k-237", mode=mode, dim=128, batch_size=1024, negatives=256,
                          lr=0.1, dense_lr=0.1, optimizer="adagrad", model="distmult", progress=False,
                          background_priority="normal")
        torch.manual_seed(0)
        task = build_task(cfg)
        for _, batch in zip(range(20), task.loader):  # training steps only: no evaluation
            task.step(batch)
        task.sync()
        tables.append((task.emb.weight.clone(), task.model.relation.weight.detach().clone()))
        task.close()
    for entities, relations in tables[1:]:
        assert torch.equal(entities, tables[0][0]) and torch.equal(relations, tables[0][1])


def test_kg_given_negatives_and_eval_limit():
    """A dataset shipping per-triple negatives (ogbl-wikikg2 style) is ranked against them; --eval-limit
    ranks a subset on all but the last epoch."""
    ds = generate_synthetic(num_nodes=200, task="kg", seed=0)
    gen = torch.Generator().manual_seed(0)
    ds.negatives = {f"{s}_{m}_neg": torch.randint(200, (getattr(ds, s).shape[0], 20), generator=gen)
                    for s in ("valid", "test") for m in ("head", "tail")}
    cfg = TrainConfig(task="kg", mode="sync", epochs=2, dim=8, negatives=8, eval_limit=10, progress=False)
    task = KGTask(cfg, ds)
    try:
        first, second = task.evaluate(), task.evaluate()
    finally:
        task.close()
    for m in (first, second):
        assert {"valid_mrr", "valid_hits@10", "test_mrr"} <= set(m)
        # 20 negatives: every rank lies in [1, 21], so MRR >= 1/21
        assert 1 / 21 - 1e-9 <= m["valid_mrr"] <= 1.0
    assert task._subsets["valid"].numel() == 10


def test_bad_input_clear_errors(capsys, tmp_path):
    # --task kg on a node dataset (through the task, and through the CLI on a node dataset folder)
    node_ds = generate_synthetic(num_nodes=100, task="node")
    with pytest.raises(ValueError, match="--task kg needs a knowledge-graph dataset"):
        KGTask(TrainConfig(task="kg"), node_ds)
    with pytest.raises(ValueError, match="--task link needs a link-prediction dataset"):
        LinkTask(TrainConfig(task="link"), node_ds)
    kg_ds = generate_synthetic(num_nodes=100, task="kg")
    with pytest.raises(ValueError, match="--task link needs a link-prediction dataset"):
        LinkTask(TrainConfig(task="link"), kg_ds)
    for argv, message in [
        (["--task", "kg", "--model", "rotate"], "unknown --model"),
        (["--task", "kg", "--neg-dist", "zipf"], "unknown --neg-dist"),
        (["--task", "kg", "--loss", "hinge"], "unknown --loss"),
        (["--task", "kg", "--model", "complex", "--dim", "15"], "even --dim"),
        (["--task", "link", "--scorer", "cosine"], "unknown --scorer"),
        (["--task", "link", "--model", "distmult"], "trains GraphSAGE"),
    ]:
        assert main(["train", "--num-nodes", "100", "--no-progress", *argv]) == 2
        assert message in capsys.readouterr().err


def test_kg_on_node_dataset_from_cli(capsys, tmp_path):
    """The CLI reports the mismatch on a real node dataset (cora, shared data) with exit status 2."""
    from dgl_oac.app.data import DatasetNotFoundError, load

    try:
        load("cora")
    except (DatasetNotFoundError, ValueError):
        pytest.skip("shared dataset cora not available")
    assert main(["train", "--task", "kg", "--dataset", "cora", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "--task kg needs a knowledge-graph dataset" in err and "NodeDataset" in err


def test_reverse_edge_ids():
    g = dgl.graph((torch.tensor([0, 1, 1, 2]), torch.tensor([1, 0, 2, 1])))
    assert reverse_edge_ids(g).tolist() == [1, 0, 3, 2]
    assert reverse_edge_ids(dgl.graph((torch.tensor([0, 1]), torch.tensor([1, 2])))) is None


@pytest.mark.hang_timeout(60)
@pytest.mark.parametrize("task", ["kg", "link"])
def test_resume_from_checkpoint_equals_uninterrupted(tmp_path, task):
    """checkpoint_parts(): a run stopped after epoch 1 and resumed for epoch 2 reproduces the uninterrupted
    run's curve (dgl-oac's checkpoints hold the table, optimizer state, relation/GNN weights and loader)."""
    whole = train_cli(tmp_path / "whole", task, "oac", max_steps=100)
    ck = str(tmp_path / "ck")
    train_cli(tmp_path / "first", task, "oac", "--checkpoint-dir", ck, max_steps=100, epochs=1)
    resumed = train_cli(tmp_path / "resumed", task, "oac", "--checkpoint-dir", ck, "--resume", max_steps=100)
    assert metrics_of(resumed["curve"]) == metrics_of(whole["curve"])
