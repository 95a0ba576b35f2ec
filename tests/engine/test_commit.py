"""dgl_oac.engine.step: what one ``step()`` writes.

Duplicate ids' gradients are averaged (DGL's convention); the batches of one step are merged (a loader batch and
an ``emb(ids)`` read of overlapping ids give the mean of their gradients, once); a step is all or nothing over
every embedding of the optimizer (a non-finite gradient in one leaves all of them bitwise as they were).
"""
from __future__ import annotations

import dgl
import pytest
import torch

import dgl_oac

from conftest import power_law_graph, seeded_init, unique_name
from helpers import assert_same, loss_of, node_loader, rows_of, snapshot

pytestmark = [pytest.mark.hang_timeout(60), pytest.mark.filterwarnings("ignore:Dataloader CPU affinity")]

N, DIM = 200, 4
GRAPH = power_law_graph(N, seed=1)


# --- all or nothing over the optimizer's embeddings --------------------------------------------------------------
def two_embeddings(make_emb, cls=dgl_oac.SparseAdagrad):
    a = make_emb(N, 3, init=1, name=unique_name("a"))
    b = make_emb(N, 5, init=2, name=unique_name("b"))
    return a, b, cls([a, b], lr=0.1)


def idle(emb) -> bool:
    return emb.pipeline.pending() == [] and emb.pipeline.clock.open_reads() == 0


@pytest.mark.parametrize("bad", [0, 1])
def test_nan_in_one_embedding_leaves_both_unchanged(make_emb, bad):
    a, b, opt = two_embeddings(make_emb)
    ids = torch.tensor([1, 5, 9, 5])
    (loss_of(a(ids)) + loss_of(b(ids))).backward()
    opt.step()  # a good step first: optimizer state is not all zeros
    before = [snapshot(a), snapshot(b)]
    steps = [a.pipeline.steps, b.pipeline.steps]
    xs = [a(torch.tensor([0, 1, 2, 3])), b(torch.tensor([2, 3, 4, 2]))]
    losses = [loss_of(x) for x in xs]
    losses[bad] = (xs[bad] * float("nan")).sum()
    sum(losses).backward()
    with pytest.raises(FloatingPointError, match="NaN or Inf in the gradient"):
        opt.step()
    assert_same(snapshot(a), before[0])
    assert_same(snapshot(b), before[1])
    assert [a.pipeline.steps, b.pipeline.steps] == steps
    assert idle(a) and idle(b), "the rejected step's reads are released, not kept for the next step()"
    # the next step commits only its own reads
    x = a(torch.tensor([7]))
    loss_of(x).backward()
    opt.step()
    changed = (a.weight != before[0][0]).any(1).nonzero().squeeze(1)
    assert changed.tolist() == [7]
    assert_same(snapshot(b), before[1])


def train_two_with_a_nan_batch(make_emb, mode, nan_at=4):
    a, b, opt = two_embeddings(make_emb, dgl_oac.SparseAdam)
    loader = node_loader(GRAPH, a, mode, embeddings=[a, b], prefetch=3)
    for i, (_, _, blocks) in enumerate(loader):
        xa, xb = blocks[0].srcdata[a.name], blocks[0].srcdata[b.name]
        loss = loss_of(xa) + (xb[:, :3] * xa).sum()
        if i == nan_at:
            loss = loss + (xb * float("nan")).sum()
        loss.backward()
        if i == nan_at:
            before = [snapshot(a), snapshot(b)]
            with pytest.raises(FloatingPointError):
                opt.step()
            assert_same(snapshot(a), before[0])
            assert_same(snapshot(b), before[1])
            assert a.pipeline.pending() == [] and b.pipeline.pending() == []
        else:
            opt.step()
    assert a.pipeline.steps == b.pipeline.steps == len(loader) - 1
    return snapshot(a), snapshot(b), loader.stats.rows_patched


def test_rejected_step_in_a_pipelined_loader_over_two_embeddings(make_emb):
    """Through the oac pipeline (write-back thread, write log): the rejected step writes nothing anywhere, and
    the rest of the epoch equals sync's with the same step rejected."""
    sync, oac = train_two_with_a_nan_batch(make_emb, "sync"), train_two_with_a_nan_batch(make_emb, "oac")
    assert_same(sync[0], oac[0])
    assert_same(sync[1], oac[1])
    assert oac[2] > 0


# --- several pending batches in one step --------------------------------------------------------------------------
def batch_and_overlapping_read(emb, mode):
    """A loader batch and an ``emb(ids)`` read with ids partly in the batch (and repeated), in one step."""
    loader = node_loader(GRAPH, emb, mode, prefetch=2)
    it = iter(loader)
    batch = next(it)
    inside, outside = batch[0][:6], torch.tensor([i for i in range(N) if i not in set(batch[0].tolist())][:5])
    ids = torch.cat([inside, outside, inside[:2]])
    y = emb(ids)
    assert y.is_leaf and y.requires_grad, "ids not all in the batch: a read of its own"
    return loader, it, batch, ids, y


@pytest.mark.parametrize("mode", ["sync", "oac"])
def test_loader_batch_and_emb_read_average_overlapping_gradients(make_emb, mode):
    emb = make_emb(N, DIM)
    opt = dgl_oac.SparseSGD([emb], lr=0.5)
    loader, it, batch, ids, y = batch_and_overlapping_read(emb, mode)
    assert len(emb.pipeline.pending()) == 2
    x = rows_of(batch, emb)
    gen = torch.Generator().manual_seed(0)
    c1, c2 = torch.randn(x.shape, generator=gen), torch.randn(y.shape, generator=gen)
    ((x * c1).sum() + (y * c2).sum()).backward()
    table = emb.weight.clone()
    opt.step()
    # every occurrence of a row, over both reads, weighs the same: the mean over occurrences
    total, count = torch.zeros(N, DIM), torch.zeros(N)
    total.index_add_(0, batch[0], c1)
    total.index_add_(0, ids, c2)
    count.index_add_(0, batch[0], torch.ones(len(batch[0])))
    count.index_add_(0, ids, torch.ones(len(ids)))
    read = count > 0
    expect = table.clone()
    expect[read] -= 0.5 * total[read] / count[read].unsqueeze(1)
    torch.testing.assert_close(emb.weight, expect, rtol=0, atol=1e-6)
    assert count.max() == 3  # a row read three times (once by the batch, twice by emb(ids))
    assert emb.pipeline.pending() == []
    loader.close()


@pytest.mark.parametrize("opt_name", ["SparseAdagrad", "SparseAdam"])
def test_loader_batch_and_emb_read_match_dgl(make_emb, opt_name):
    emb = make_emb(N, DIM)
    opt = getattr(dgl_oac, opt_name)([emb], lr=0.1)
    ref = dgl.nn.NodeEmbedding(N, DIM, unique_name("dgl"), init_func=seeded_init(0))
    ref_opt = getattr(dgl.optim, opt_name)([ref], lr=0.1)
    loader, it, batch, ids, y = batch_and_overlapping_read(emb, "oac")
    loss_of(torch.cat([emb(batch[0]), y])).backward()
    opt.step()
    ref_opt.zero_grad()
    loss_of(torch.cat([ref(batch[0]), ref(ids)])).backward()
    ref_opt.step()
    torch.testing.assert_close(emb.weight, ref.weight, rtol=1e-5, atol=1e-6)
    # and the rest of the epoch, one batch a step, stays with DGL
    for b in it:
        x = emb(b[0])
        loss_of(x).backward()
        opt.step()
        ref_opt.zero_grad()
        loss_of(ref(b[0])).backward()
        ref_opt.step()
    torch.testing.assert_close(emb.weight, ref.weight, rtol=1e-5, atol=1e-6)
