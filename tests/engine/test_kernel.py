"""dgl_oac.engine.step: the row-kernel interface the committers call, and ``duplicate_reduction``."""
from __future__ import annotations

import dgl
import pytest
import torch
from conftest import power_law_graph

import dgl_oac
from dgl_oac.engine.step import LOCAL, reduce_duplicates


class SummingSGD(dgl_oac.SparseSGD):
    """``torch.optim``'s convention: a row read several times in a step gets the sum of its gradients."""

    duplicate_reduction = "sum"


def _step_with_duplicates(opt_cls: type) -> torch.Tensor:
    """One step over reads of row 1 three times and row 2 once (two emb(ids) calls), gradients 1, 2, 3 and 5."""
    emb = dgl_oac.NodeEmbedding(4, 2, "t", init_func=lambda t: t.fill_(1.0))
    opt = opt_cls([emb], lr=0.5)
    a = emb(torch.tensor([1, 1, 2]))
    b = emb(torch.tensor([1]))
    (a * torch.tensor([[1.0], [2.0], [5.0]])).sum().add((b * 3.0).sum()).backward()
    opt.step()
    return emb.weight.clone()


def test_mean_is_dgl_and_the_default() -> None:
    assert dgl_oac.SparseSGD.duplicate_reduction == "mean"
    w = _step_with_duplicates(dgl_oac.SparseSGD)
    # row 1: mean of 1, 2, 3 = 2; row 2: 5
    assert torch.equal(w, torch.tensor([[1.0, 1.0], [0.0, 0.0], [-1.5, -1.5], [1.0, 1.0]]))


def test_sum_skips_the_division_by_counts() -> None:
    w = _step_with_duplicates(SummingSGD)
    # row 1: 1 + 2 + 3 = 6; row 2: 5
    assert torch.equal(w, torch.tensor([[1.0, 1.0], [-2.0, -2.0], [-1.5, -1.5], [1.0, 1.0]]))


def test_sum_in_a_pipelined_loader_matches_sync() -> None:
    """With "sum", oac still reads what sync reads: the reduction is the kernel's, not the schedule's."""

    def run(mode: str) -> torch.Tensor:
        g = power_law_graph(60, seed=3)
        emb = dgl_oac.NodeEmbedding(60, 4, "e", init_func=lambda t: t.copy_(torch.linspace(-1, 1, t.numel())
                                                                              .view_as(t)))
        opt = SummingSGD([emb], lr=0.1)
        loader = dgl_oac.DataLoader(g, torch.arange(60), dgl.dataloading.NeighborSampler([3]), embeddings=[emb],
                                    mode=mode, prefetch=3, batch_size=8, shuffle=True, seed=1)
        for input_nodes, output_nodes, blocks in loader:
            x = blocks[0].srcdata["e"]
            y = emb(output_nodes)  # output nodes read again: duplicates within the step
            (x.pow(2).sum() + y.sum()).backward()
            opt.step()
        return emb.weight.clone()

    assert torch.equal(run("oac"), run("sync"))


def test_bad_reduction_is_named() -> None:
    class Bad(dgl_oac.SparseSGD):
        duplicate_reduction = "max"

    emb = dgl_oac.NodeEmbedding(4, 2, "t")
    with pytest.raises(ValueError, match=r"Bad.duplicate_reduction must be one of \('mean', 'sum'\), got 'max'"):
        Bad([emb], lr=0.1)


def test_reduce_duplicates_without_counts_is_the_sums() -> None:
    sums = torch.tensor([[2.0], [6.0]])
    assert reduce_duplicates(SummingSGD.__new__(SummingSGD), sums, torch.tensor([2.0, 3.0])) is sums
    assert torch.equal(reduce_duplicates(dgl_oac.SparseSGD.__new__(dgl_oac.SparseSGD), sums.clone(),
                                         torch.tensor([2.0, 3.0])), torch.tensor([[1.0], [2.0]]))


def test_tables_are_given_their_committer() -> None:
    emb = dgl_oac.NodeEmbedding(4, 2, "t")
    assert emb.committer is LOCAL


class _Table:
    """What ``run_kernel`` reads of a table: its name and ``store.dim``."""

    def __init__(self, dim: int) -> None:
        self.name = "t"
        self.store = type("S", (), {"dim": dim})()


def test_kernel_shape_is_checked() -> None:
    """A kernel that returns rows of the wrong shape is named."""
    from dgl_oac.engine.step import run_kernel

    class Narrow(dgl_oac.SparseSGD):
        def update_rows(self, rows, grad, dim, out=None):  # type: ignore[override]
            return rows[:, :1].clone()
    opt = Narrow([dgl_oac.NodeEmbedding(1, 4, "narrow")], lr=0.1)
    with pytest.raises(RuntimeError, match=r"Narrow.update_rows returned shape \(600, 1\) for rows of shape "
                                           r"\(600, 4\)"):
        run_kernel(opt, _Table(4), torch.zeros(600, 4), torch.zeros(600, 4), None, probe_grad=False)


def test_fresh_read_segment_sums_match_index_add() -> None:
    """``emb(ids)`` of fresh ids sums each row's gradients by segments of a stable sort (``embedding_bag`` on
    CPU): the table after the step is bitwise the per-occurrence mean computed with ``index_add_``."""
    n, d = 500, 8
    gen = torch.Generator().manual_seed(5)
    init = torch.randn(n, d, generator=gen)
    ids = torch.randint(0, n, (4000,), generator=gen)
    g = torch.randn(4000, d, generator=gen)
    emb = dgl_oac.NodeEmbedding(n, d, "segments", init_func=lambda t: t.copy_(init))
    opt = dgl_oac.SparseSGD([emb], lr=0.5)
    (emb(ids) * g).sum().backward()
    opt.step()
    uniq, inverse, counts = torch.unique(ids, return_inverse=True, return_counts=True)
    mean = torch.zeros(uniq.numel(), d).index_add_(0, inverse, g).div_(counts.unsqueeze(1).float())
    expect = init.clone()
    expect[uniq] = torch.add(init[uniq], mean, alpha=-0.5)
    assert torch.equal(emb.weight, expect)
