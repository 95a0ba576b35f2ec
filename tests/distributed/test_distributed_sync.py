"""N-trainer sync (dgl_oac.distributed) on 2 gloo ranks: the semantics, determinism, and DGL as the reference.

* a row read by both trainers with gradients 1 and 3 gets the same update as a row read by one with 2;
* the same program twice gives bitwise the same table and optimizer state (rank-ordered combine);
* a non-finite gradient on one rank skips the step on every rank (a collective decision), tables untouched;
* within float tolerance of ``dgl.nn.NodeEmbedding`` + ``dgl.optim`` (SparseAdagrad, SparseAdam) on the same
  reads, several steps, rows shared by the ranks and repeated within a rank.
"""
from __future__ import annotations

import uuid

import pytest
import torch
import torch.distributed as dist

import dgl_oac

from dist_helpers import RankPool, two_rank_pool  # noqa: F401 - the fixture "pool": the module's 2 ranks
from helpers import loss_of

NUM, DIM, STEPS = 40, 6, 6



def _fill(t: torch.Tensor) -> torch.Tensor:
    return t.fill_(0.5)


def _mean_program(rank: int, world: int, opt_name: str):
    emb = dgl_oac.NodeEmbedding(NUM, DIM, "mean", init_func=_fill)
    opt = getattr(dgl_oac.optim, opt_name)([emb], lr=0.1)
    # rank 0: row 0 with gradient 1, row 1 with gradient 2; rank 1: row 0 with gradient 3
    ids, grads = (torch.tensor([0, 1]), [1.0, 2.0]) if rank == 0 else (torch.tensor([0]), [3.0])
    x = emb(ids)
    (x * torch.tensor(grads).unsqueeze(1)).sum().backward()
    opt.step()
    return emb.weight.clone(), emb.optm_state.clone()


@pytest.mark.parametrize("opt_name", ["SparseSGD", "SparseAdagrad", "SparseAdam"])
def test_gradient_is_averaged_over_trainers(pool: RankPool, opt_name: str) -> None:
    (w0, s0), (w1, s1) = pool.run(_mean_program, opt_name)
    assert torch.equal(w0, w1) and torch.equal(s0, s1), "both ranks see one table"
    assert torch.equal(w0[0], w0[1]) and torch.equal(s0[0], s0[1]), "(1 + 3) / 2 updates as one read of 2"
    assert not torch.equal(w0[0], torch.full((DIM,), 0.5))
    assert torch.equal(w0[2:], torch.full((NUM - 2, DIM), 0.5)), "rows nobody read are untouched"
    if opt_name == "SparseSGD":
        assert torch.equal(w0[0], torch.full((DIM,), 0.5) - 0.1 * 2.0)


def _reads(rank: int, step: int) -> torch.Tensor:
    """Overlapping ids across ranks, with repeats within a rank (emb(ids) reads, not loader batches)."""
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randint(0, NUM // 2 + 4 * rank, (12,), generator=g)


def _loss(x: torch.Tensor) -> torch.Tensor:
    return x.square().sum() + torch.sin(x).sum() + x[:, 0].sum()


def _init(t: torch.Tensor) -> torch.Tensor:
    g = torch.Generator().manual_seed(7)
    return t.copy_(torch.rand(t.shape, generator=g) * 2 - 1)


def _train(emb, opt, rank: int) -> None:
    for step in range(STEPS):
        loss = _loss(emb(_reads(rank, step), torch.device("cpu")))
        opt.zero_grad()
        loss.backward()
        opt.step()


def _ours_program(rank: int, world: int, opt_name: str):
    emb = dgl_oac.NodeEmbedding(NUM, DIM, "ours", init_func=_init)
    opt = getattr(dgl_oac.optim, opt_name)([emb], lr=0.05)
    _train(emb, opt, rank)
    return emb.weight.clone(), emb.optm_state.clone()


def _dgl_program(rank: int, world: int, opt_name: str, name: str):
    import dgl
    from dgl.nn.pytorch import sparse_emb
    sparse_emb._STORE = dist.distributed_c10d._get_default_store()  # not DGL's TCPStore on its fixed port
    emb = dgl.nn.NodeEmbedding(NUM, DIM, name, init_func=_init)
    opt = getattr(dgl.optim, opt_name)([emb], lr=0.05)
    _train(emb, opt, rank)
    dist.barrier()
    return emb.weight.clone()


def test_same_program_same_bits(pool: RankPool) -> None:
    first = pool.run(_ours_program, "SparseAdam")
    second = pool.run(_ours_program, "SparseAdam")
    for (w1, s1), (w2, s2) in zip(first, second):
        assert torch.equal(w1, w2) and torch.equal(s1, s2)


@pytest.mark.parametrize("opt_name", ["SparseAdagrad", "SparseAdam"])
def test_matches_dgl_multiprocess(pool: RankPool, opt_name: str) -> None:
    ours = pool.run(_ours_program, opt_name)
    theirs = pool.run(_dgl_program, opt_name, f"ref{uuid.uuid4().hex[:12]}")
    start = _init(torch.empty(NUM, DIM))
    assert torch.equal(ours[0][0], ours[1][0])
    assert not torch.equal(ours[0][0], start)
    changed = (ours[0][0] != start).any(1)
    assert changed.sum() > NUM // 2, "most rows were trained"
    torch.testing.assert_close(ours[0][0], theirs[0], rtol=1e-5, atol=1e-6)


def _nan_program(rank: int, world: int):
    emb = dgl_oac.NodeEmbedding(30, 4, "nan", init_func=lambda t: t.fill_(0.2))
    opt = dgl_oac.optim.SparseAdam([emb], lr=0.1)
    errors, snaps = [], []
    for step in range(3):
        ids = torch.arange(rank, 30, 3)
        x = emb(ids)
        scale = float("nan") if (step == 1 and rank == 1) else 1.0
        (loss_of(x) * scale).backward()
        before = (emb.weight.clone(), emb.optm_state.clone())
        try:
            opt.step()
        except FloatingPointError as exc:
            errors.append((step, str(exc)))
            snaps.append(torch.equal(before[0], emb.weight) and torch.equal(before[1], emb.optm_state))
    return errors, snaps, emb.weight.clone(), bool(torch.isfinite(emb.weight).all())


def test_one_ranks_nan_skips_the_step_everywhere(pool: RankPool) -> None:
    results = pool.run(_nan_program)
    for errors, untouched, weight, finite in results:
        assert [s for s, _ in errors] == [1], "the step with rank 1's NaN fails on both ranks, and only that one"
        assert "rank(s) [1]" in errors[0][1]
        assert untouched == [True], "every table and optimizer state as before the skipped step"
        assert finite
    assert torch.equal(results[0][2], results[1][2])
    assert not torch.equal(results[0][2], torch.full((30, 4), 0.2)), "the other steps were applied"


def _destroy_program(rank: int, world: int) -> bool:
    import weakref
    emb = dgl_oac.NodeEmbedding(NUM, DIM, "destroy", init_func=_fill)
    opt = dgl_oac.SparseAdam([emb], lr=0.1)
    emb(torch.tensor([rank])).sum().backward()
    opt.step()
    world_group = weakref.ref(dist.group.WORLD)
    dist.destroy_process_group()
    return world_group() is None  # no gc.collect(): freed by reference counting, as the user's call intends


def test_destroy_process_group_frees_the_group_while_tables_live(pool) -> None:
    """Regression: dgl_oac kept a strong reference to the default process group, so the user's
    ``destroy_process_group()`` left it alive until interpreter finalization, where tearing gloo down aborted
    now and then ("terminate called without an active exception" at the exit of a torchrun rank)."""
    assert pool.run(_destroy_program) == [True, True]


class SummingSGD(dgl_oac.SparseSGD):
    """torch.optim's convention for duplicates: summed, not averaged."""

    duplicate_reduction = "sum"


def _sum_program(rank: int, world: int):
    emb = dgl_oac.NodeEmbedding(NUM, DIM, "sum", init_func=_fill)
    opt = SummingSGD([emb], lr=0.1)
    ids, grads = (torch.tensor([0, 1]), [1.0, 2.0]) if rank == 0 else (torch.tensor([0]), [3.0])
    (emb(ids) * torch.tensor(grads).unsqueeze(1)).sum().backward()
    opt.step()
    return emb.weight.clone()


def test_sum_reduction_adds_the_trainers_gradients(pool: RankPool) -> None:
    """The distributed committer honours ``duplicate_reduction="sum"``: row 0 gets 1 + 3, not their mean."""
    w0, w1 = pool.run(_sum_program)
    assert torch.equal(w0, w1)
    assert torch.equal(w0[0], torch.full((DIM,), 0.5) - 0.1 * 4.0)
    assert torch.equal(w0[1], torch.full((DIM,), 0.5) - 0.1 * 2.0)
