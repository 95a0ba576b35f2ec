"""ShadowSync (``--dense-sync shadow``, :mod:`dgl_oac.baselines.shadow`) on 2 gloo ranks: the averaging arithmetic
against hand-computed values, how it differs from DDP's all-reduce (an averaging lands ``every`` steps late), the
ranks ending with bitwise-equal dense parameters after training a task, a peer's failure surfacing as
PeerFailure, and the option's clear errors (bad ``--shadow-every``, one process, checkpoints)."""
from __future__ import annotations

import json
import os
import threading

import pytest
import torch

from dgl_oac.app.cli import main
from dgl_oac.distributed import current_group
from dgl_oac.distributed.dense import average_gradients
from dgl_oac.distributed.group import PeerFailure
from dgl_oac.baselines.shadow import ShadowSync

from dist_helpers import torchrun, two_rank_pool  # noqa: F401 - the fixture "pool": the module's 2 ranks

SMALL = ["--num-nodes", "600", "--batch-size", "64", "--fanouts", "5,5", "--dim", "16", "--hidden", "16",
         "--epochs", "2", "--seed", "3", "--threads", "1", "--no-progress"]


def _constant_gradients(rank: int, world: int):
    """SGD (lr 1) from p = 0 with gradient 1 on rank 0 and 3 on rank 1, every 2 steps averaged; p after each step."""
    p = torch.zeros(1, requires_grad=True)
    opt = torch.optim.SGD([p], lr=1.0)
    shadow = ShadowSync([p], current_group(), every=2, timeout=30.0)
    seen = []
    try:
        for _ in range(5):
            p.grad = torch.tensor([1.0 + 2.0 * rank])
            opt.step()
            shadow.after_step()
            seen.append(float(p))
        shadow.average()
        seen.append(float(p))
        alive = any(t.name == "dgl-oac-shadow-sync-rank%d" % rank for t in threading.enumerate())
    finally:
        shadow.close()
    shadow.close()  # idempotent
    return seen, alive, shadow.rounds, [t.name for t in threading.enumerate()]


@pytest.mark.slow
def test_averaging_arithmetic_by_hand(pool):
    (r0, alive0, rounds, threads), (r1, _, _, _) = pool.run(_constant_gradients)
    # step 2 starts round A on snapshots (-2, -6), mean -4; step 4 applies it (p += -4 - snapshot: -4-2, -12+2)
    # and starts round B on (-6, -10), mean -8; average() applies B after step 5 (-7-2, -13+2), then the mean
    assert r0 == [-1.0, -2.0, -3.0, -6.0, -7.0, -10.0]
    assert r1 == [-3.0, -6.0, -9.0, -10.0, -13.0, -10.0]
    assert alive0 and rounds == 3  # A, B and average()'s own
    assert not any(name.startswith("dgl-oac-shadow-sync") for name in threads)  # joined by close()


def _quadratic(rank: int, world: int, dense_sync: str):
    """SGD (lr 1) on 0.5 * a * p^2 (a = 1/2 on rank 0, 1/4 on rank 1) from p = 1 for 2 steps, then the end."""
    p = torch.ones(1, requires_grad=True)
    opt = torch.optim.SGD([p], lr=1.0)
    group = current_group()
    shadow = ShadowSync([p], group, every=1, timeout=30.0) if dense_sync == "shadow" else None
    a = (0.5, 0.25)[rank]
    try:
        for step in range(2):
            opt.zero_grad()
            (0.5 * a * p * p).sum().backward()
            if shadow is None:
                average_gradients([p], group, step)
            opt.step()
            if shadow is not None:
                shadow.after_step()
        if shadow is not None:
            shadow.average()
    finally:
        if shadow is not None:
            shadow.close()
    return float(p)


def test_every_step_lands_one_step_late_unlike_allreduce(pool):
    # all-reduce: p *= 1 - (1/2 + 1/4) / 2 each step: 0.625^2. Shadow, K=1: step 1 gives (0.5, 0.75), round A
    # (mean 0.625); step 2 gives (0.25, 0.5625), A applied: (0.375, 0.4375), round B (mean 0.40625); the end
    # applies B: both 0.40625. The average arrives a step late, so the result is not DDP's.
    assert pool.run(_quadratic, "allreduce") == [0.390625, 0.390625]
    assert pool.run(_quadratic, "shadow") == [0.40625, 0.40625]


def _train_task(rank: int, world: int, dense_sync: str):
    from dgl_oac.app.tasks import TrainConfig, build_task
    from dgl_oac.app.tasks.common import run

    cfg = TrainConfig(task="node", mode="oac", prefetch="2", background_priority="normal", num_nodes=600,
                      batch_size=64, fanouts="5,5", dim=16, hidden=16, epochs=2, seed=3, progress=False,
                      dense_sync=dense_sync, shadow_every=3)
    task = build_task(cfg)
    res = run(cfg, task)
    return {k: v.clone() for k, v in task.model.state_dict().items()}, res["steps"], res["curve"]


def test_ranks_end_with_bitwise_equal_dense_parameters(pool):
    (m0, steps, curve), (m1, steps1, _) = pool.run(_train_task, "shadow")
    assert steps == steps1 > 3 and len(curve) == 2  # several rounds an epoch
    assert m0.keys() == m1.keys() and all(torch.equal(m0[k], m1[k]) for k in m0)
    (ddp, _, _), _ = pool.run(_train_task, "allreduce")
    assert any(not torch.equal(m0[k], ddp[k]) for k in m0)  # not exact: another model than DDP's


def _peer_dies(rank: int, world: int):
    p = torch.zeros(3, requires_grad=True)
    shadow = ShadowSync([p], current_group(), every=1, timeout=20.0)
    try:
        shadow.after_step()  # round 1 in flight on both ranks
        if rank == 1:
            os._exit(3)
        shadow.after_step()  # waits for round 1, then round 2 has no peer
        shadow.average()
    finally:
        shadow.close()


def test_a_dead_peer_is_a_peer_failure(pool):
    (ok0, err0), (ok1, _) = pool.run(_peer_dies, outcomes=True, timeout=60.0)
    assert not ok0 and not ok1
    assert "PeerFailure" in err0 and "shadow sync: dense parameters" in err0


def test_bad_shadow_every_is_a_clear_error(capsys):
    for bad in ("0", "-2"):
        assert main(["train", *SMALL, "--dense-sync", "shadow", "--shadow-every", bad]) == 2
        assert f"--shadow-every must be a positive integer (steps between averagings), got {int(bad)}" in \
            capsys.readouterr().err
    with pytest.raises(ValueError, match="every must be a positive integer"):
        ShadowSync([], None, every=0)  # checked before any collective


def test_refused_with_one_process_and_with_checkpoints(capsys, tmp_path):
    assert main(["train", *SMALL, "--dense-sync", "shadow"]) == 2
    assert "run under torchrun with --nproc_per_node 2 or more" in capsys.readouterr().err
    assert main(["train", *SMALL, "--dense-sync", "shadow", "--checkpoint-dir", str(tmp_path)]) == 2
    assert "--dense-sync shadow cannot checkpoint" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.hang_timeout(120)
def test_torchrun_cli(tmp_path):
    out = tmp_path / "shadow.json"
    stdout = torchrun("-m", "dgl_oac", "train", *SMALL, "--dense-sync", "shadow", "--shadow-every", "2",
                      "--out", str(out), timeout=100)
    res = json.loads(out.read_text())
    assert res["trainers"] == 2 and res["config"]["dense_sync"] == "shadow" and len(res["curve"]) == 2
    assert "on each of 2 trainers" in stdout
