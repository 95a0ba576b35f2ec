"""dgl_oac.engine.pipeline: one batch's records, one writer each.

The gathered rows and the hand-out are frozen records; a commit is reported to the batch's ``CommitListener``
(the first table's only: a batch counts once); what a gathered batch owns (its read, its rows buffer) goes back
once however often it is released; the first ``emb(input_nodes)`` call alone claims the hand-out leaf.
"""
from __future__ import annotations

import dataclasses
import time
from typing import List, Tuple

import pytest
import torch

import dgl_oac
from dgl_oac.engine.pipeline import HandedOut, gather_batch_rows, validate_rows
from dgl_oac.loading.stats import LoaderStats

pytestmark = pytest.mark.hang_timeout(60)

CPU = torch.device("cpu")
IDS = torch.tensor([1, 5, 7, 11])


class Recorder:
    """A :class:`~dgl_oac.engine.pipeline.CommitListener` that keeps every call."""

    def __init__(self) -> None:
        self.calls: List[Tuple[HandedOut, float, object]] = []

    def committed(self, batch: HandedOut, seconds: float, repatched: object) -> None:
        self.calls.append((batch, seconds, repatched))


def tables(make_emb, n: int = 1):
    embs = [make_emb(20, 3, init=i) for i in range(n)]
    opt = dgl_oac.SparseAdagrad(embs, lr=0.1)
    for e in embs:
        e.pipeline.prepare(CPU, False, "sync")
    return embs, [e.pipeline for e in embs], opt


def test_the_gathered_rows_and_the_hand_out_are_frozen(make_emb):
    _, (table,), _ = tables(make_emb)
    (rows,) = gather_batch_rows([table], [IDS])
    with pytest.raises(dataclasses.FrozenInstanceError):
        rows.rv = 3
    (handed,) = validate_rows([rows], [table], "sync", True, LoaderStats(), None)
    batch = handed.batch
    assert batch.gathered is rows and batch.ids is rows.ids and batch.rows is rows.rows
    for name, value in [("kind", "async"), ("hook", object()), ("listener", Recorder()), ("state", None)]:
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(batch, name, value)
    assert batch.kind == "sync" and batch.hook is None and batch.listener is None
    table.release(batch)


def test_a_commit_tells_the_listener_of_the_batchs_first_table_once(make_emb):
    embs, tabs, opt = tables(make_emb, 2)
    listener = Recorder()
    handed = validate_rows(gather_batch_rows(tabs, [IDS, IDS]), tabs, "sync", True, LoaderStats(), listener)
    assert handed[0].batch.listener is listener and handed[1].batch.listener is None
    sum(h.leaf.square().sum() for h in handed).backward()
    assert listener.calls == []  # nothing before the commit
    t0 = time.perf_counter()
    opt.step()
    took = time.perf_counter() - t0
    assert [(b, r) for b, _, r in listener.calls] == [(handed[0].batch, 0)]  # sync: nothing repatched
    assert 0.0 <= listener.calls[0][1] <= took  # the commit's own time, within the step that made it
    # a batch whose leaf dies without a gradient is released, never committed: its listener hears nothing
    dropped = validate_rows(gather_batch_rows(tabs, [IDS, IDS]), tabs, "sync", True, LoaderStats(), listener)
    assert all(len(t.pending()) == 1 for t in tabs)
    del dropped
    assert all(t.pending() == [] for t in tabs) and len(listener.calls) == 1


def test_a_gathered_batch_gives_back_its_read_and_rows_buffer_once(make_emb):
    _, (table,), _ = tables(make_emb)
    (first,) = gather_batch_rows([table], [IDS])
    assert table.clock.open_reads() == 1
    table.release_gathered(first)
    assert table.clock.open_reads() == 0
    (second,) = gather_batch_rows([table], [IDS])
    assert second.rows.data_ptr() == first.rows.data_ptr()  # the pooled buffer came back, and is reused
    table.release_gathered(first)  # again: the buffer is second's now, and must not go back to the pool
    (third,) = gather_batch_rows([table], [IDS])
    assert third.rows.data_ptr() != second.rows.data_ptr()
    assert table.clock.open_reads() == 2
    for rows in (second, third):
        table.release_gathered(rows)
    assert table.clock.open_reads() == 0


def test_releasing_the_gathered_rows_of_a_registered_batch_releases_it(make_emb):
    """A hand-out that failed after registering the batch (the epoch releases what it gathered)."""
    _, (table,), _ = tables(make_emb)
    (rows,) = gather_batch_rows([table], [IDS])
    (handed,) = validate_rows([rows], [table], "sync", True, LoaderStats(), None)
    assert table.pending() == [handed.batch] and not handed.batch.state.released
    table.release_gathered(rows)
    assert table.pending() == [] and handed.batch.state.released and table.clock.open_reads() == 0


def test_only_the_first_claim_gets_the_hand_out_leaf(make_emb):
    embs, (table,), _ = tables(make_emb)
    (handed,) = validate_rows(gather_batch_rows([table], [IDS]), [table], "sync", True, LoaderStats(), None)
    assert embs[0](IDS) is handed.leaf and handed.batch.state.claimed
    again = embs[0](IDS)
    assert again is not handed.leaf and torch.equal(again, handed.leaf)
    assert [r.pos for r in handed.batch.state.reads] == [None]  # the second call: a read of every row
    third = embs[0](IDS)  # and so is every later call
    assert third is not handed.leaf and [r.pos for r in handed.batch.state.reads] == [None, None]
    table.release(handed.batch)
