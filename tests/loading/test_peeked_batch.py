"""Hole 3 of issue 22: a batch the user keeps (``first = next(iter(loader))`` before the loop, to look at
shapes) must not pin the write log. A read closes at hand-out, so the log holds at most the steps of the batches
read ahead, whatever the user holds and whether or not the garbage collector runs."""
import gc

import pytest
import torch

import dgl_oac

from conftest import power_law_graph
from helpers import assert_same, loss_of, node_loader, snapshot

pytestmark = pytest.mark.hang_timeout(120)
STEPS = 40


def train(make_emb, mode, peek, staleness=None):
    """One epoch of STEPS batches (with ``peek``: after taking and keeping a batch of another iteration);
    returns the snapshot, the log's (entries, bytes) after each step, and the reads still open at the end."""
    graph = power_law_graph(16 * STEPS, seed=1)
    emb = make_emb(graph.num_nodes(), 16)
    opt = dgl_oac.SparseAdagrad([emb], lr=0.05)
    loader = node_loader(graph, emb, mode, staleness=staleness)
    first = next(iter(loader)) if peek else None
    sizes = []
    for batch in loader:
        loss_of(batch[-1][0].srcdata[emb.name]).backward()
        opt.step()
        log = emb.pipeline.log
        if log is not None:
            sizes.append((len(log.entries), log.nbytes()))
    open_reads = emb.pipeline.clock.open_reads()
    assert first is None or first[-1][0].srcdata[emb.name].requires_grad  # still alive and held
    return snapshot(emb), sizes, open_reads, loader


@pytest.mark.parametrize("staleness", [None, "gap"])
def test_a_peeked_batch_does_not_pin_the_write_log(make_emb, staleness):
    mode = "oac" if staleness is None else "async"
    gc.disable()  # the bound must not depend on the collector finalizing anything
    try:
        _, held, open_reads, loader = train(make_emb, mode, peek=True, staleness=staleness)
        _, free, _, _ = train(make_emb, mode, peek=False, staleness=staleness)
    finally:
        gc.enable()
    assert len(held) == STEPS
    most = max(n for n, _ in held)
    # before the fix: the log grew by one entry per step (40 here; 121 entries after 120 steps)
    assert most <= loader.prefetch + loader.writeback_depth + 2, [n for n, _ in held]
    assert max(b for _, b in held) == max(b for _, b in free)  # the ring is as large as without the peek
    assert open_reads == 0  # the peeked batch's read closed when it was handed out


def test_oac_with_a_peeked_batch_equals_sync(make_emb):
    a, _, _, _ = train(make_emb, "sync", peek=True)
    b, _, _, _ = train(make_emb, "oac", peek=True)
    assert_same(a, b)


def test_a_peeked_batch_trained_late_commits_its_current_rows(make_emb):
    """The held batch is committed after STEPS later steps (far outside the log): its rows are re-read at
    commit, as sync's are, so oac still equals sync."""
    snaps = []
    for mode in ("sync", "oac"):
        graph = power_law_graph(16 * 12, seed=1)
        emb = make_emb(graph.num_nodes(), 16)
        opt = dgl_oac.SparseAdagrad([emb], lr=0.05)
        loader = node_loader(graph, emb, mode)
        first = next(iter(loader))
        for batch in loader:
            loss_of(batch[-1][0].srcdata[emb.name]).backward()
            opt.step()
        ids = first[0]
        loss_of(emb(ids, ids.device)).backward()
        opt.step()
        snaps.append(snapshot(emb))
        del first
    assert_same(*snaps)
