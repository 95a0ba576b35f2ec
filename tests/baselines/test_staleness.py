"""dgl_oac.baselines.staleness: Gap-Aware and DANA-style look-ahead for ``mode="async"``.

The hand-computed references drive the real gather, hand-out and commit with a schedule fixed by the test: every
batch is gathered before any step (all read the initial table, version -1), then handed out and committed one at
a time, so batch i is exactly i steps stale whatever the threads do. The loader tests run the real pipeline.
"""
from __future__ import annotations

import math
from typing import List, Optional

import dgl
import pytest
import torch

import dgl_oac
from dgl_oac.engine.pipeline import gather_batch_rows
from dgl_oac.dgl_frontend.graph_source import hand_out
from dgl_oac.baselines.staleness import STEP_SAMPLE, GapAware, Scratch, adam_drift, make_rule
from dgl_oac.loading.stats import LoaderStats

from conftest import power_law_graph, unique_name
from helpers import loss_of, node_loader, rows_of

pytestmark = [pytest.mark.hang_timeout(60), pytest.mark.filterwarnings("ignore:Dataloader CPU affinity")]

CPU = torch.device("cpu")


class Harness:
    """Gather every batch of ``ids_list`` up front (read version -1), then hand them out one by one."""

    def __init__(self, emb: "dgl_oac.NodeEmbedding", staleness: Optional[str], ids_list: List[List[int]]) -> None:
        self.emb, self.table = emb, emb.pipeline
        mode = "async" if staleness is None else f"async-{staleness}"
        self.table.prepare(CPU, False, mode)
        self.table.lease(mode, 4, "normal", 8)
        self.rules = [make_rule(staleness, emb)] if staleness else []
        self.gathered = [gather_batch_rows([self.table], [torch.tensor(ids)]) for ids in ids_list]
        assert all(g[0].rv == -1 for g in self.gathered)

    def hand_out(self, i: int) -> torch.Tensor:
        """Batch i's leaf (float32[n, D], the values it computes at)."""
        rows = self.gathered[i]
        n = rows[0].ids.numel()
        result = (rows[0].ids, dgl.graph(([], []), num_nodes=n))
        out, _ = hand_out(result, rows, [self.table], "async", CPU, True, LoaderStats(), None, hooks=self.rules)
        return out[1].ndata[self.emb.name]

    def close(self) -> None:
        self.table.end_lease()


def weighted(leaf: torch.Tensor, grad: List[List[float]]) -> torch.Tensor:
    """A loss whose gradient with respect to ``leaf`` is ``grad``."""
    return (leaf * torch.tensor(grad)).sum()


# --- Gap-Aware --------------------------------------------------------------------------------------------------
def test_gap_aware_two_steps_by_hand(make_emb):
    emb = make_emb(2, 2, init=lambda t: t.copy_(torch.tensor([[1.0, 2.0], [3.0, 4.0]])))
    opt = dgl_oac.SparseSGD([emb], lr=0.5)
    h = Harness(emb, "gap", [[0], [0, 1]])
    rule = h.rules[0]
    # step 0 (nothing committed since its read): G = 1, w0 = [1, 2] - 0.5 * [4, 1] = [-1, 1.5];
    # C = mean |Δ| = (2 + 0.5) / 2 = 1.25
    weighted(h.hand_out(0), [[4.0, 1.0]]).backward()
    opt.step()
    assert torch.equal(emb.weight, torch.tensor([[-1.0, 1.5], [3.0, 4.0]]))
    assert float(rule.step_size) == 1.25
    # step 1 computes at the rows read before step 0: row 0 at [1, 2]. Row 0 moved |[-1, 1.5] - [1, 2]| =
    # [2, 0.5]: gap = [1.6, 0.4], G = [1.6, 1]; row 1 did not move: G = 1.
    leaf = h.hand_out(1)
    assert torch.equal(leaf.detach(), torch.tensor([[1.0, 2.0], [3.0, 4.0]]))
    weighted(leaf, [[1.0, 3.0], [2.0, 2.0]]).backward()
    opt.step()
    # applied to the current row: [-1, 1.5] - 0.5 * [1 / 1.6, 3] = [-1.3125, 0]; row 1: [3, 4] - 0.5 * [2, 2]
    # (naive async would give row 0 = [-1.5, 0])
    assert torch.equal(emb.weight, torch.tensor([[-1.3125, 0.0], [2.0, 3.0]]))
    # C = 0.9 * 1.25 + 0.1 * mean(0.3125, 1.5, 1, 1)
    assert float(rule.step_size) == pytest.approx(0.9 * 1.25 + 0.1 * 3.8125 / 4, rel=1e-6)
    h.close()


def test_gap_aware_brings_adagrad_state_to_the_current_row(make_emb):
    emb = make_emb(1, 1, init=lambda t: t.fill_(1.0))
    opt = dgl_oac.SparseAdagrad([emb], lr=0.1, eps=1e-10)
    h = Harness(emb, "gap", [[0], [0]])
    weighted(h.hand_out(0), [[2.0]]).backward()
    opt.step()
    w1 = 1.0 - 0.1 * 2.0 / math.sqrt(4.0 + 1e-10)  # 0.9, sum 4; C = 0.1
    weighted(h.hand_out(1), [[3.0]]).backward()
    opt.step()
    g = 3.0 / max(1.0, abs(w1 - 1.0) / 0.1)  # gap 1: G = 1 (up to float rounding of C and the move)
    w2 = w1 - 0.1 * g / math.sqrt(4.0 + g * g + 1e-10)  # the current sum (4), not the one read (0)
    assert float(emb.weight[0, 0]) == pytest.approx(w2, abs=1e-6)
    assert float(emb.optm_state[0, 0]) == pytest.approx(4.0 + g * g, abs=1e-5)
    h.close()


def test_gap_aware_step_size_of_a_large_step_is_a_strided_sample(make_emb):
    """A step of more than STEP_SAMPLE rows: C is the mean |new - θ_now| over every ceil(u / STEP_SAMPLE)-th row
    (all rows of a smaller step, as in the two-step reference above)."""
    emb = make_emb(10, 3)
    rule = GapAware(emb)
    u = 2 * STEP_SAMPLE + 5  # every 3rd row: STEP_SAMPLE-ish rows, not u
    gen = torch.Generator().manual_seed(0)
    rows, new = torch.randn(u, 7, generator=gen), torch.randn(u, 7, generator=gen)
    rule.after_kernel(rows, new)
    sample = (new[::3, :3] - rows[::3, :3]).abs().mean()
    assert float(rule.step_size) == pytest.approx(float(sample), rel=1e-6)
    assert float(rule.step_size) != pytest.approx(float((new[:, :3] - rows[:, :3]).abs().mean()), rel=1e-6)
    rule.after_kernel(rows[:4], new[:4])  # a small step: every row, folded into the running average
    want = 0.9 * float(sample) + 0.1 * float((new[:4, :3] - rows[:4, :3]).abs().mean())
    assert float(rule.step_size) == pytest.approx(want, rel=1e-6)


# --- look-ahead ----------------------------------------------------------------------------------------------------
B1, B2, LR, EPS = 0.5, 0.75, 0.1, 1e-8


def adam_state(t: torch.Tensor) -> torch.Tensor:
    """Row 0 of an Adam table: w = 1, m = 0.1, v = 0.01, t = 1 (``[w | m | v | t]``)."""
    return t.copy_(torch.tensor([[1.0]]))


def test_lookahead_adam_by_hand(make_emb):
    emb = make_emb(1, 1, init=adam_state)
    opt = dgl_oac.SparseAdam([emb], lr=LR, betas=(B1, B2), eps=EPS)
    opt.load_state_dict({"param_groups": [dict(opt.defaults)],
                         "state": {emb.name: torch.tensor([[0.1, 0.01, 1.0]])}})
    h = Harness(emb, "lookahead", [[0], [0], [0]])
    # step 0: nothing committed since the read (k = 0): computes at w = 1
    leaf0 = h.hand_out(0)
    assert float(leaf0.detach()) == 1.0
    weighted(leaf0, [[1.0]]).backward()
    opt.step()
    m1, v1 = B1 * 0.1 + (1 - B1) * 1.0, B2 * 0.01 + (1 - B2) * 1.0
    w1 = 1.0 - LR * (m1 / (1 - B1 ** 2)) / (math.sqrt(v1 / (1 - B2 ** 2)) + EPS)

    def drift(j: int) -> float:  # Adam's update of the row read (m = 0.1, v = 0.01, t = 1) at its j-th zero step
        factor = B1 ** j / (1 - B1 ** (1 + j)) * math.sqrt((1 - B2 ** (1 + j)) / B2 ** j)
        return LR * 0.1 / (math.sqrt(0.01) + EPS) * factor

    # eps placed outside the bias correction: the same as Adam's own zero-gradient step to float rounding
    assert drift(1) == pytest.approx(LR * (B1 * 0.1 / (1 - B1 ** 2)) / (math.sqrt(B2 * 0.01 / (1 - B2 ** 2)) + EPS),
                                     rel=1e-6)

    # step 1: one step (0) committed since the read, and it wrote row 0: k = 1
    leaf1 = h.hand_out(1)
    assert float(leaf1.detach()) == pytest.approx(1.0 - drift(1), abs=1e-7)
    g = float(leaf1.detach())
    (leaf1.square().sum() / 2).backward()  # gradient = the look-ahead value
    opt.step()
    # applied to the current row and state (after step 0)
    m2, v2 = B1 * m1 + (1 - B1) * g, B2 * v1 + (1 - B2) * g * g
    w2 = w1 - LR * (m2 / (1 - B1 ** 3)) / (math.sqrt(v2 / (1 - B2 ** 3)) + EPS)
    assert float(emb.weight[0, 0]) == pytest.approx(w2, abs=1e-6)
    assert emb.optm_state[0].tolist() == pytest.approx([m2, v2, 3.0], abs=1e-6)
    # a batch two steps behind looks two zero-gradient steps ahead
    assert float(h.hand_out(2).detach()) == pytest.approx(1.0 - drift(1) - drift(2), abs=1e-7)
    h.close()


def test_lookahead_only_moves_rows_written_since_the_read(make_emb):
    emb = make_emb(2, 1, init=lambda t: t.fill_(1.0))
    opt = dgl_oac.SparseAdam([emb], lr=LR, betas=(B1, B2), eps=EPS)
    opt.load_state_dict({"param_groups": [dict(opt.defaults)],
                         "state": {emb.name: torch.tensor([[0.1, 0.01, 1.0], [0.1, 0.01, 1.0]])}})
    h = Harness(emb, "lookahead", [[0], [0, 1]])
    weighted(h.hand_out(0), [[1.0]]).backward()
    opt.step()
    leaf = h.hand_out(1).detach()
    assert float(leaf[0]) < 1.0 and float(leaf[1]) == 1.0  # row 1 was not written by step 0: current as read
    h.close()


def test_adam_drift_of_selected_rows_matches_the_formula(make_emb):
    """adam_drift on rows picked by ``idx`` (its scratch buffers reused across calls) = the closed form per row."""
    emb = make_emb(4, 2)
    opt = dgl_oac.SparseAdam([emb], lr=LR, betas=(B1, B2), eps=EPS)
    rows = torch.tensor([[9.0, 9.0, 0.1, -0.2, 0.01, 0.04, 1.0],   # [w | m | v | t], D = 2
                         [9.0, 9.0, 0.3, 0.5, 0.09, 0.25, 3.0],
                         [9.0, 9.0, -0.4, 0.2, 0.16, 0.01, 2.0]])
    scratch = Scratch()
    for idx, k in ((torch.tensor([0, 2]), 2), (torch.tensor([1]), 3)):
        got = adam_drift(opt, rows, idx, 2, k, scratch).clone()
        for out_row, r in zip(got, idx.tolist()):
            m, v, t = rows[r, 2:4].double(), rows[r, 4:6].double(), float(rows[r, 6])
            factor = sum(B1 ** j / (1 - B1 ** (t + j)) * math.sqrt((1 - B2 ** (t + j)) / B2 ** j)
                         for j in range(1, k + 1))
            assert out_row.double().tolist() == pytest.approx((LR * m / (v.sqrt() + EPS) * factor).tolist(),
                                                              rel=1e-5)
    assert scratch.take("m", 1, 2, CPU).data_ptr() == scratch.take("m", 2, 2, CPU).data_ptr()  # reused, not new


@pytest.mark.parametrize("cls", [dgl_oac.SparseSGD, dgl_oac.SparseAdagrad])
def test_lookahead_without_momentum_computes_at_the_rows_read(make_emb, cls):
    emb = make_emb(1, 1, init=lambda t: t.fill_(1.0))
    opt = cls([emb], lr=0.1)
    h = Harness(emb, "lookahead", [[0], [0]])
    weighted(h.hand_out(0), [[2.0]]).backward()
    opt.step()
    w1 = float(emb.weight[0, 0])
    leaf = h.hand_out(1)
    assert float(leaf.detach()) == 1.0
    weighted(leaf, [[3.0]]).backward()
    opt.step()
    # SGD: w1 - 0.1 * 3 (naive async's sum); Adagrad: with the current sum 4 + 9, not the one read (0 + 9)
    want = w1 - 0.3 if cls is dgl_oac.SparseSGD else w1 - 0.3 / math.sqrt(13.0 + 1e-10)
    assert float(emb.weight[0, 0]) == pytest.approx(want, abs=1e-6)
    h.close()


@pytest.mark.parametrize("staleness, ranges", [("gap", {"dgl_oac.catch_up", "dgl_oac.gap", "dgl_oac.step_size"}),
                                               ("lookahead", {"dgl_oac.catch_up", "dgl_oac.lookahead"})])
def test_rules_mark_their_work_for_the_profiler(make_emb, staleness, ranges):
    """benchmarks/studies/profile_modes.py reports each rule's pieces by these record_function names."""
    emb = make_emb(1, 1, init=adam_state)
    opt = dgl_oac.SparseAdam([emb], lr=LR, betas=(B1, B2), eps=EPS)
    h = Harness(emb, staleness, [[0], [0], [0]])
    with torch.profiler.profile() as prof:
        for i in range(3):
            weighted(h.hand_out(i), [[1.0]]).backward()
            opt.step()
    h.close()
    names = {e.key for e in prof.key_averages()}
    assert ranges <= names
    assert not ({"dgl_oac.gap", "dgl_oac.step_size", "dgl_oac.lookahead"} - ranges) & names


# --- naive async is unchanged -------------------------------------------------------------------------------------
def test_no_staleness_rule_adds_the_stale_delta(make_emb):
    """staleness=None: the kernel runs on the rows read and the table gets new - read added (Marius-style)."""
    emb = make_emb(1, 1, init=lambda t: t.fill_(1.0))
    opt = dgl_oac.SparseAdagrad([emb], lr=0.1, eps=1e-10)
    h = Harness(emb, None, [[0], [0]])
    assert h.table.log is None  # no write log: naive async does not pay for one
    for i, g in enumerate((2.0, 3.0)):
        weighted(h.hand_out(i), [[g]]).backward()
        opt.step()
    read = torch.tensor([[1.0, 0.0]])
    d0 = opt.update_rows(read, torch.tensor([[2.0]]), 1) - read
    d1 = opt.update_rows(read, torch.tensor([[3.0]]), 1) - read
    table = torch.cat([emb.weight, emb.optm_state], 1)
    assert torch.equal(table, read + d0 + d1)
    h.close()


def test_loader_default_is_naive_async(graph, make_emb):
    emb = make_emb(graph.num_nodes(), 4)
    dgl_oac.SparseAdagrad([emb], lr=0.1)
    loader = node_loader(graph, emb, "async")
    assert loader.staleness is None and loader.table_mode == "async"
    assert node_loader(graph, emb, "async", staleness="gap").table_mode == "async-gap"


# --- bad input ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["sync", "oac"])
def test_staleness_needs_async(graph, make_emb, mode):
    emb = make_emb(graph.num_nodes(), 4)
    with pytest.raises(ValueError, match="needs mode='async'"):
        node_loader(graph, emb, mode, staleness="gap")


@pytest.mark.parametrize("bad", ["Gap", "dana", "", 1])
def test_unknown_staleness(graph, make_emb, bad):
    emb = make_emb(graph.num_nodes(), 4)
    with pytest.raises(ValueError, match="unknown staleness"):
        node_loader(graph, emb, "async", staleness=bad)


def test_a_naive_async_batch_blocks_a_gap_loader(graph, make_emb):
    emb = make_emb(graph.num_nodes(), 4)
    dgl_oac.SparseAdagrad([emb], lr=0.1)
    batch = next(iter(node_loader(graph, emb, "async")))
    loss_of(rows_of(batch, emb)).backward()
    with pytest.raises(RuntimeError, match="still has async batches"):
        iter(node_loader(graph, emb, "async", staleness="gap"))


def test_one_step_refuses_batches_of_two_rules(make_emb):
    emb = make_emb(2, 1, init=lambda t: t.fill_(1.0))
    opt = dgl_oac.SparseSGD([emb], lr=0.1)
    gap = Harness(emb, "gap", [[0]])
    weighted(gap.hand_out(0), [[1.0]]).backward()
    gap.close()
    ahead = Harness(emb, "lookahead", [[1]])
    weighted(ahead.hand_out(0), [[1.0]]).backward()
    with pytest.raises(RuntimeError, match=r"different rules \(staleness rule 'gap', staleness rule 'lookahead'\)"):
        opt.step()
    assert torch.equal(emb.weight, torch.ones(2, 1))  # refused before anything was written
    ahead.close()


# --- the real pipeline --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("staleness", ["gap", "lookahead"])
@pytest.mark.parametrize("opt_cls", [dgl_oac.SparseAdam, dgl_oac.SparseAdagrad])
def test_trains_through_the_loader_at_prefetch_4(make_emb, staleness, opt_cls):
    """Rows pulled towards a target through a 2-hop loader: the loss falls, and the log brought stale rows up."""
    g = power_law_graph(300, seed=3)
    emb = make_emb(g.num_nodes(), 8, init=lambda t: t.normal_(generator=torch.Generator().manual_seed(0)))
    target = torch.randn(g.num_nodes(), 8, generator=torch.Generator().manual_seed(1))
    opt = opt_cls([emb], lr=0.2)
    loader = node_loader(g, emb, "async", staleness=staleness, prefetch=4, batch_size=32)

    def loss() -> float:
        return float((emb.weight - target).square().sum())

    before = loss()
    for _ in range(3):
        for batch in loader:
            x = rows_of(batch, emb)
            (x - target[batch[0]]).square().sum().backward()
            opt.step()
    assert loss() < 0.5 * before
    assert loader.stats.committed == 3 * len(loader)
    assert loader.stats.rows_repatched_at_commit > 0  # rows written while in flight were brought up to date
    if staleness == "gap":
        assert isinstance(loader.rules[0], GapAware) and float(loader.rules[0].step_size) > 0
