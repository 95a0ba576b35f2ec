"""dgl_oac.engine.step: the stages every committer shares, seen through a test exchange.

The plan, not the exchange, runs the kernel and the finite check: an exchange that records what it is given
and vetoes the step shows that nothing is written before ``settle()`` returns, and the owners' finite rule (a
gradient other trainers sent is their own to report) is the plan's, so it holds for any exchange.
"""
from __future__ import annotations

from typing import List

import pytest
import torch

import dgl_oac
from dgl_oac.engine.step import KernelInput, LocalExchange, StepPlan, TableStep, Update, gradient_problem, nonfinite

from helpers import assert_same, loss_of, snapshot

pytestmark = pytest.mark.hang_timeout(60)

IDS = torch.tensor([1, 5, 9, 5])


class Recording(LocalExchange):
    """The identity exchange, recording what ``settle`` gets; ``veto``: raised there instead."""

    def __init__(self, veto: BaseException = None) -> None:
        self.veto = veto
        self.settled: List[List[Update]] = []

    def settle(self, kernel, updates, problems) -> None:
        self.settled.append(list(updates))
        if self.veto is not None:
            raise self.veto
        super().settle(kernel, updates, problems)


def _read(emb: dgl_oac.NodeEmbedding) -> None:
    loss_of(emb(IDS)).backward()


def test_the_identity_exchange_steps_as_the_local_committer(make_emb) -> None:
    a, b = make_emb(20, 3, init=1), make_emb(20, 3, init=1)
    opt_a, opt_b = dgl_oac.SparseAdam([a], lr=0.1), dgl_oac.SparseAdam([b], lr=0.1)
    plan = StepPlan(Recording())
    for _ in range(3):
        _read(a)
        opt_a.step()
        _read(b)
        plan.commit(opt_b, [b.pipeline])
    assert_same(snapshot(a), snapshot(b))
    last = plan.exchange.settled[-1][0]
    assert torch.equal(last.ids, torch.tensor([1, 5, 9])) and not last.delta
    assert torch.equal(torch.cat([b.weight, b.optm_state], 1)[last.ids], last.new)  # what settle saw is written


def test_a_vetoed_step_writes_nothing_and_releases_its_batches(make_emb) -> None:
    emb = make_emb(20, 3, init=1)
    opt = dgl_oac.SparseAdagrad([emb], lr=0.1)
    _read(emb)
    opt.step()
    before, steps = snapshot(emb), emb.pipeline.steps
    _read(emb)
    plan = StepPlan(Recording(veto=RuntimeError("peer gone")))
    with pytest.raises(RuntimeError, match="peer gone"):
        plan.commit(opt, [emb.pipeline])
    assert len(plan.exchange.settled) == 1  # the kernel ran; the veto came before any write
    assert_same(before, snapshot(emb))
    assert emb.pipeline.steps == steps and emb.pipeline.pending() == []


def _input(emb, rows_nan: bool, grad_nan: bool, owners: bool) -> KernelInput:
    ids = torch.tensor([2, 3, 4])
    rows = emb.pipeline.store.gather(ids)
    sums = torch.ones(3, emb.embedding_dim)
    if rows_nan:
        rows[1, 0] = float("nan")
    if grad_nan:
        sums[2, 1] = float("inf")
    return KernelInput(ids, ids, rows, sums, torch.ones(3), owners=owners)


@pytest.mark.parametrize("rows_nan,grad_nan,owners,expected", [
    (False, False, True, ""), (False, False, False, ""),
    (False, True, False, "the gradient of NodeEmbedding 't': 1 of 3 rows, ids [4]"),
    # an owner: the trainer that sent it reports it (tests/distributed/test_distributed_sync.py)
    (False, True, True, ""),
    (True, False, True, "the rows read from the table (values) of NodeEmbedding 't': 1 of 3 rows, ids [3]"),
    (True, False, False, "the rows read from the table (values) of NodeEmbedding 't': 1 of 3 rows, ids [3]"),
])
def test_the_finite_rule_is_the_plans(make_emb, rows_nan, grad_nan, owners, expected) -> None:
    emb = make_emb(10, 2, init=1, name="t")
    opt = dgl_oac.SparseSGD([emb], lr=0.1)
    step = TableStep(emb.pipeline, [], None, 0.0)  # no batch of its own: checked (another rank's rows)
    update, problem = StepPlan.kernel(opt, step, _input(emb, rows_nan, grad_nan, owners))
    assert problem == expected
    assert (update.new_host is not None) == owners and not update.delta


def test_nonfinite_names_the_first_bad_part_and_its_ids() -> None:
    ids = torch.arange(10, 17)
    good, bad = torch.zeros(7, 2), torch.zeros(7, 2)
    bad[:6, 0] = float("nan")
    assert nonfinite("e", ids, [("a", good), ("b", bad), ("c", bad)]) == \
        "b of NodeEmbedding 'e': 6 of 7 rows, ids [10, 11, 12, 13, 14] ..."
    assert nonfinite("e", ids, [("a", good)]) == ""


def test_an_overflowing_sum_of_finite_gradients_is_no_problem() -> None:
    big = torch.full((4, 2), 3e38)  # finite, and their sum is inf: only the exact check tells
    assert gradient_problem("e", torch.arange(4), big) == ""
    big[3, 1] = float("-inf")
    assert gradient_problem("e", torch.arange(4), big) == "the gradient of NodeEmbedding 'e': 1 of 4 rows, ids [3]"
