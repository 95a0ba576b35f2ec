"""num_workers > 0 (dgl_oac.dgl_frontend.sampling.workers): the batch stream and the training are bit for bit those of
num_workers=0, at every depth; worker failures surface in the caller naming the batch; no worker outlives its
epoch."""
import dataclasses
import os
import signal
import time

import dgl
import pytest
import torch

import dgl_oac
from dgl_oac.dgl_frontend.sampling.edge import EdgeBatchSampler

from conftest import power_law_graph, seeded_init
from helpers import assert_same, loss_of, node_loader, rows_of, snapshot
from fakes import Scripted

GRAPH = power_law_graph(150, seed=4)


_BEFORE: set = set()


@pytest.fixture(autouse=True)
def _other_children():
    """Children that existed before the test (another module's process pool) are not the loader's."""
    _BEFORE.clear()
    _BEFORE.update(children(all_of_them=True))
    yield


def children(all_of_them: bool = False) -> set:
    """Live child processes of this process (zombies excluded) that the test started."""
    out = set()
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == os.getpid() and fields[0] != "Z":
            out.add(int(pid))
    if not all_of_them:
        out -= _BEFORE
    return out


def train(num_workers, prefetch, mode="oac", epochs=2, controller=None):
    """Two epochs of node training; returns (table snapshot, per-step losses, input ids of every batch)."""
    emb = dgl_oac.NodeEmbedding(GRAPH.num_nodes(), 5, "e", seeded_init(3))
    opt = dgl_oac.SparseAdam([emb], lr=0.05)
    loader = node_loader(GRAPH, emb, mode, prefetch=prefetch, seed=9, num_workers=num_workers)
    if controller is not None:
        loader.settings = dataclasses.replace(loader.settings, depth_controller=controller)
    losses, ids = [], []
    for _ in range(epochs):
        for batch in loader:
            loss = loss_of(rows_of(batch, emb))
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()))
            ids.append(batch[0].clone())
    out = snapshot(emb), losses, ids
    emb.close()
    return out


@pytest.mark.slow
def test_training_is_bitwise_the_same_for_any_num_workers_and_depth():
    ref_table, ref_losses, ref_ids = train(0, 4, mode="sync")
    for workers in (0, 1, 2):
        for mode, prefetch in (("sync", 4), ("oac", 4), ("oac", "auto")):
            table, losses, ids = train(workers, prefetch, mode)
            assert_same(ref_table, table)
            assert losses == ref_losses, (workers, mode, prefetch)
            assert len(ids) == len(ref_ids) and all(torch.equal(a, b) for a, b in zip(ids, ref_ids))
    assert not children()


def test_depth_switches_with_workers_stay_bitwise_equal_to_sync():
    ref, ref_losses, _ = train(0, 4, mode="sync")
    table, losses, _ = train(2, "auto", controller=Scripted((0, 4, 4, 1, 0, 2)))
    assert_same(ref, table)
    assert losses == ref_losses


def test_edge_batches_with_negatives_are_the_same_in_workers():
    """Negatives drawn from torch's generator (seeded per batch) and shallow edge batches."""
    def stream(workers):
        sampler = EdgeBatchSampler(num_negatives=3, shared=False)
        loader = dgl_oac.DataLoader(GRAPH, torch.arange(GRAPH.num_edges()), sampler, batch_size=40, shuffle=True,
                                    seed=2, num_workers=workers)
        out = [(b[0].clone(), torch.stack(b[2].edges())) for b in loader]
        loader.close()
        return out

    a, b = stream(0), stream(2)
    assert len(a) == len(b) > 1
    assert all(torch.equal(x[0], y[0]) and torch.equal(x[1], y[1]) for x, y in zip(a, b))


class FailingSampler(dgl.dataloading.NeighborSampler):
    def sample(self, g, seeds):
        if int(seeds.numel()) and 7 in seeds.tolist():
            raise KeyError("node 7 is cursed")
        return super().sample(g, seeds)


@pytest.mark.parametrize("prefetch", [1, 4])
def test_worker_exception_surfaces_in_the_caller_naming_the_batch(prefetch):
    order = torch.arange(GRAPH.num_nodes())
    loader = dgl_oac.DataLoader(GRAPH, order, FailingSampler([2]), batch_size=16, num_workers=2, mode="sync",
                                prefetch=prefetch)
    handed = 0
    with pytest.raises(KeyError, match="cursed") as info:
        for _ in loader:
            handed += 1
    assert handed == 0  # node 7 is in batch 0
    assert "sampling batch 0 of epoch 0 in sampling worker 0" in "".join(getattr(info.value, "__notes__", []))
    assert not children()


def test_a_killed_worker_is_reported_not_waited_for():
    loader = dgl_oac.DataLoader(GRAPH, torch.arange(GRAPH.num_nodes()), dgl.dataloading.NeighborSampler([2]),
                                batch_size=4, num_workers=2, mode="sync")
    it = iter(loader)
    next(it)
    pool = it.res.sampling
    os.kill(pool.pids[1], signal.SIGKILL)
    time.sleep(0.2)
    with pytest.raises(RuntimeError, match=r"sampling worker 1 \(pid \d+\) died with exit code -9"):
        for _ in range(GRAPH.num_nodes()):
            next(it)
    assert not children()


def test_close_break_and_garbage_leave_no_worker():
    emb = dgl_oac.NodeEmbedding(GRAPH.num_nodes(), 5, "e", seeded_init(3))
    opt = dgl_oac.SparseSGD([emb], lr=0.05)
    threads = torch.get_num_threads()
    loader = node_loader(GRAPH, emb, "oac", num_workers=2)
    for i, batch in enumerate(loader):  # break, then close()
        loss_of(rows_of(batch, emb)).backward()
        opt.step()
        assert len(children()) == 2
        if i == 2:
            break
    loader.close()
    assert not children()
    it = iter(loader)  # break without close: the epoch dies with its last reference
    next(it)
    assert len(children()) == 2
    del it
    loader.close()
    assert not children()
    for _ in iter(loader):  # a full epoch ends its workers by itself
        pass
    assert not children() and torch.get_num_threads() == threads
    emb.close()
