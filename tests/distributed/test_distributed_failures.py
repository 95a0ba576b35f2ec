"""A rank that dies mid-epoch makes the other fail promptly with an error naming it (2 gloo ranks). (The other
collective decision, a non-finite step skipped everywhere, is in test_distributed_sync.py.)"""
from __future__ import annotations

import os
import time

import dgl
import torch

import dgl_oac
from dgl_oac.distributed.group import PeerFailure

from conftest import power_law_graph
from dist_helpers import run_ranks
from helpers import loss_of


def _dies_program(rank: int, world: int):
    g = power_law_graph(60)
    emb = dgl_oac.NodeEmbedding(60, 4, "dies")
    opt = dgl_oac.optim.SparseAdagrad([emb], lr=0.1)
    loader = dgl_oac.DataLoader(g, torch.arange(60), dgl.dataloading.NeighborSampler([2]), embeddings=[emb],
                                batch_size=5, shuffle=True, seed=0, use_ddp=True, mode="sync")
    t0 = time.monotonic()
    try:
        for i, (_, _, blocks) in enumerate(loader):
            if rank == 1 and i == 2:
                os._exit(3)  # a trainer that crashes mid-epoch
            loss_of(blocks[0].srcdata["dies"]).backward()
            t0 = time.monotonic()
            opt.step()
    except PeerFailure as exc:
        return str(exc), time.monotonic() - t0
    return "finished", 0.0


def test_a_dead_rank_fails_the_others_with_its_number() -> None:
    (ok0, (msg, waited)), (ok1, why1) = run_ranks(_dies_program, 2, collective_timeout=20.0, timeout=80.0,
                                                  outcomes=True)
    assert ok0 and not ok1 and "exited with code 3" in why1
    assert "rank 0 of 2" in msg and "rank(s) [1] exited" in msg and "step 2" in msg
    assert waited < 20.0, "it failed at once (gloo saw the closed connection), not after the collective timeout"


def _races_once(rank: int, world: int, flag: str):
    from dist_helpers import SetupRace
    try:
        fd = os.open(flag, os.O_CREAT | os.O_EXCL)  # the first rank of the first attempt only
    except FileExistsError:
        return os.getpid()
    os.close(fd)
    raise SetupRace("Gloo connectFullMesh failed with [...] Connection closed by peer")


def _races_always(rank: int, world: int):
    from dist_helpers import SetupRace
    raise SetupRace("Gloo connectFullMesh failed with [...] Connection closed by peer")


def _fails_like_a_race(rank: int, world: int):
    raise RuntimeError("Gloo connectFullMesh failed with [...] Connection closed by peer")


def test_the_rank_pool_runs_again_on_new_ranks_once_when_a_group_could_not_connect(tmp_path) -> None:
    """The tests' harness (tests/dist_helpers.py): a group whose ranks gloo could not connect ("Gloo connectFullMesh
    failed", seen with two gloo jobs side by side) has the run start again on new ranks, once. A second failure, and
    the same error raised by the target itself, fail the test at once."""
    import pytest

    from dist_helpers import RankPool

    pool = RankPool(2)
    try:
        first = pool.run(_races_once, str(tmp_path / "flag"))
        assert len(first) == 2 and all(isinstance(pid, int) for pid in first)
        assert (tmp_path / "flag").exists()
        with pytest.raises(AssertionError, match="failed to join the group"):
            pool.run(_races_always)
        with pytest.raises(AssertionError, match="rank . failed:") as err:
            pool.run(_fails_like_a_race)
        assert "failed to join" not in str(err.value)
    finally:
        pool.close(grace=5.0)
