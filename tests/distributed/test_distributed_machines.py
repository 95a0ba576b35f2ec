"""Trainers on several machines: a replica of every table per machine, each step's written rows mirrored to the
other machines (:mod:`dgl_oac.distributed.shared`, :func:`dgl_oac.distributed.committer.mirror_targets`).

Two gloo ranks counted as two machines (``GROUP_RANK`` 0 and 1, what ``torchrun --nnodes=2`` sets; one host
here): the replicas are separate memory; initialisation, ``all_set_embedding`` and a checkpoint's tables reach
both; sync and oac on two machines train bitwise what they train on one machine (tables, optimizer state, every
rank's losses), and without the mirror they do not. End to end: ``torchrun --nnodes=2`` run twice on this host
trains what ``torchrun --standalone --nproc_per_node=2`` trains, bit for bit."""
from __future__ import annotations

import os
from pathlib import Path

import dgl
import pytest
import torch

import dgl_oac
from dgl_oac.checkpoint import load_checkpoint, save_checkpoint
from dgl_oac.distributed import committer as dist_step_module
from dgl_oac.distributed.group import machines_of

from conftest import power_law_graph
from dist_helpers import RankPool, torchrun_nodes, two_rank_pool  # noqa: F401 - the fixture "pool"
from helpers import train_node_batches
from dist_helpers import TABLE, metrics_of, torchrun_train

NODES, DIM = 100, 4


def _as_machines(rank: int, machines: int) -> None:
    """Count this rank as machine ``rank % machines`` (torchrun's GROUP_RANK), before its first table."""
    os.environ["GROUP_RANK"] = str(rank % machines)


def _init(t: torch.Tensor) -> torch.Tensor:
    return t.copy_(torch.rand(t.shape) - 0.5)  # the global RNG: only rank 0's draw may count


def _train(rank: int, world: int, machines: int, opt_name: str, mode: str, prefetch: int, control: str = ""):
    mirror = dist_step_module._mirror_parts
    if control == "no-mirror":  # the pool's processes serve the next tests too: restored below
        dist_step_module._mirror_parts = lambda p, group: [torch.empty(0, 2 + p.grad.shape[1])] * group.world
    try:
        return _run(rank, machines, opt_name, mode, prefetch)
    finally:
        dist_step_module._mirror_parts = mirror


def _run(rank: int, machines: int, opt_name: str, mode: str, prefetch: int):
    _as_machines(rank, machines)
    torch.manual_seed(10 + rank)  # each rank's RNG differs: the replicas must still start equal (rank 0's)
    g = power_law_graph(NODES, seed=1)
    emb = dgl_oac.NodeEmbedding(NODES, DIM, "table", init_func=_init)
    start = emb.weight.clone()
    opt = getattr(dgl_oac.optim, opt_name)([emb], lr=0.05)
    loader = dgl_oac.DataLoader(g, torch.arange(NODES), dgl.dataloading.NeighborSampler([4, 4]), embeddings=[emb],
                                batch_size=8, shuffle=True, seed=2, use_ddp=True, mode=mode, prefetch=prefetch,
                                background_priority="normal")
    losses = train_node_batches(loader, opt, "table")
    s = loader.stats
    return (emb.group.machines, start, emb.weight.clone(), emb.optm_state.clone(), losses, s.rows_patched,
            s.rows_read, emb.group.sent.get("mirror", 0))


def test_machines_of_groups_ranks_by_machine():
    assert machines_of([("a", ""), ("a", ""), ("b", ""), ("a", "")]) == [[0, 1, 3], [2]]
    assert machines_of([("h", "0"), ("h", "1"), ("h", "0"), ("h", "1")]) == [[0, 2], [1, 3]]


@pytest.mark.parametrize("opt_name", ["SparseSGD", "SparseAdagrad", "SparseAdam"])
def test_two_machines_train_what_one_machine_trains(pool: RankPool, opt_name: str) -> None:
    one = pool.run(_train, 1, opt_name, "sync", 1)
    assert one[0][0] == [[0, 1]] and one[0][7] == 0  # one machine: one shared table, nothing mirrored
    for mode, prefetch in (("sync", 1), ("oac", 1), ("oac", 4)):
        two = pool.run(_train, 2, opt_name, mode, prefetch)
        for rank, (a, b) in enumerate(zip(one, two)):
            assert b[0] == [[0], [1]]
            assert torch.equal(b[1], a[1]), f"rank {rank}: the replicas start from rank 0's initial values"
            assert torch.equal(b[2], a[2]) and torch.equal(b[3], a[3]), f"rank {rank}'s replica, {mode}@{prefetch}"
            assert b[4] == a[4], f"rank {rank}'s losses, {mode}@{prefetch}"
            assert b[7] > 0  # the written rows crossed to the other machine
            if mode == "oac":
                assert b[5] > 0.1 * b[6], f"rank {rank}: {b[5]} of {b[6]} rows patched at prefetch {prefetch}"


def test_without_the_mirror_the_machines_drift_apart(pool: RankPool) -> None:
    one = pool.run(_train, 1, "SparseAdagrad", "sync", 1)
    broken = pool.run(_train, 2, "SparseAdagrad", "oac", 4, "no-mirror")
    assert not torch.equal(broken[0][2], one[0][2]) and not torch.equal(broken[0][2], broken[1][2])


def _replicas(rank: int, world: int, folder: str):
    _as_machines(rank, 2)
    emb = dgl_oac.NodeEmbedding(30, 3, "emb", init_func=lambda t: t.fill_(1.0))
    opt = dgl_oac.SparseAdagrad([emb], lr=0.1)
    group = emb.group
    if rank == 1:
        emb.store.table[0, 0] = 42.0  # not through the protocol: only this machine's replica changes
    group.barrier("written")
    separate = float(emb.weight[0, 0])
    emb.all_set_embedding(torch.full((30, 3), float(rank + 2)))  # DGL's rule: rank 0's values count
    after_set = emb.weight.clone()
    emb(torch.arange(rank, 30, 2)).pow(2).sum().backward()
    opt.step()
    save_checkpoint(Path(folder) / "ckpt", emb, opt)
    saved = (emb.weight.clone(), emb.optm_state.clone())
    group.barrier("saved")
    emb.all_set_embedding(torch.zeros(30, 3))
    emb.store.table[:, 3:].zero_()  # the optimizer state too, on each machine
    load_checkpoint(Path(folder) / "ckpt", emb, opt)
    return separate, after_set, saved, (emb.weight.clone(), emb.optm_state.clone())


def test_replicas_are_separate_and_every_whole_table_write_reaches_both(pool: RankPool, tmp_path: Path) -> None:
    (sep0, set0, saved0, loaded0), (sep1, set1, saved1, loaded1) = pool.run(_replicas, str(tmp_path))
    assert (sep0, sep1) == (1.0, 42.0)
    assert torch.equal(set0, torch.full((30, 3), 2.0)) and torch.equal(set1, set0)
    assert torch.equal(saved0[0], saved1[0]) and torch.equal(saved0[1], saved1[1])  # the step mirrored
    assert not torch.equal(saved0[0], set0)
    for loaded in (loaded0, loaded1):  # the checkpoint's rows (read by rank 0) on both machines
        assert torch.equal(loaded[0], saved0[0]) and torch.equal(loaded[1], saved0[1])


@pytest.mark.slow
@pytest.mark.hang_timeout(300)
def test_torchrun_two_nodes_trains_what_one_node_trains(tmp_path: Path) -> None:
    """``torchrun --nnodes=2 --nproc_per_node=1`` (twice on this host, static rendezvous) trains the node task
    exactly as ``torchrun --standalone --nproc_per_node=2``: table, optimizer state and metrics."""
    one = torchrun_train(tmp_path, "one", "node", "oac")
    two = torchrun_train(tmp_path, "two", "node", "oac", launch=torchrun_nodes)
    assert two["trainers"] == 2 and two["steps"] == one["steps"] > 0
    assert torch.equal(two["table"], one["table"])
    assert metrics_of(two["curve"]) == metrics_of(one["curve"])
    assert TABLE["node"] == "emb"
