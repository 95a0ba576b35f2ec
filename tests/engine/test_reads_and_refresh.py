"""Two owners of dgl_oac.engine, each on its own: Reads (dgl_oac.engine.table: a read holds the write log's horizon
while open, and closes exactly once, from any thread) and the refresh (TablePipeline.refresh: a batch held across
later steps is brought to the newest rows, from the write log while the log covers it, else by a re-read, with the
same bits either way)."""
import threading

import pytest
import torch

import dgl_oac
from dgl_oac.engine.table import Reads, VersionClock

from conftest import seeded_init

N, D = 30, 3


def test_an_open_read_holds_the_horizon_until_it_closes():
    clock = VersionClock()
    reads = Reads(clock)
    for step in range(2):
        clock.publish(step)
    ticket = reads.open(torch.tensor([1, 2]))
    assert ticket.rv == 1 and ticket.open
    for step in range(2, 5):
        clock.publish(step)
    assert clock.horizon() == 1 and reads.open_count() == 1  # the log must keep steps 2..4 for this read
    assert reads.close(ticket) and not ticket.open
    assert clock.horizon() == 4 and reads.open_count() == 0
    assert not reads.close(ticket)  # a second close does nothing
    assert clock.horizon() == 4


def test_a_read_closed_from_several_threads_at_once_closes_once():
    clock = VersionClock()
    reads = Reads(clock)
    tickets = [reads.open(torch.tensor([i])) for i in range(50)]
    closed = []
    barrier = threading.Barrier(4)

    def close_all():
        barrier.wait()
        closed.extend(t for t in tickets if reads.close(t))

    threads = [threading.Thread(target=close_all) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert sorted(map(id, closed)) == sorted(map(id, tickets))  # each closed by exactly one call
    assert reads.open_count() == 0


def held_then_refreshed(with_log: bool) -> torch.Tensor:
    """A batch read with ``emb(ids)`` and held (no gradient) while two other reads are stepped; then refreshed.
    ``with_log``: under an epoch-like lease (a write log, a write-back thread), with a read open from before the
    steps (as a batch read ahead holds one) so that the log keeps them, the refresh patches from the log; without
    one it re-reads the table. Returns the held batch's rows after the refresh."""
    emb = dgl_oac.NodeEmbedding(N, D, "held", seeded_init(4))
    opt = dgl_oac.SparseAdam([emb], lr=0.1)
    table = emb.pipeline
    table.prepare(torch.device("cpu"), False, "oac")
    pin = None
    if with_log:
        table.lease("oac", 2, "normal", 4)
        pin = table.reads.open(torch.tensor([0]))  # the horizon stays at its version: the log keeps every step
    held_ids = torch.tensor([0, 3, 5, 7])
    leaf = emb(held_ids)  # registered and held: no gradient
    (held,) = table.pending()
    for ids in (torch.tensor([3, 4, 5]), torch.tensor([5, 7, 9])):
        emb(ids).square().sum().backward()
        opt.step()
    assert held.state.seen < table.steps - 1  # behind the two steps
    log = table.log
    assert (log is not None and log.covers(held.state.seen)) == with_log
    # from the log: the batch's rows the steps wrote (3, 5 and 7); re-read: every row of the batch
    assert int(table.refresh(held, leaf=True)) == (3 if with_log else 4)
    out = held.rows[:, :D].clone()
    assert not torch.equal(leaf.detach(), out)  # the caller's leaf keeps what it read (a step's input)
    table.flush()
    assert torch.equal(out, emb.weight[held_ids])  # the newest rows
    if with_log:
        table.reads.close(pin)
        table.end_lease()
    emb.close()
    return out


def test_a_held_batch_is_refreshed_to_the_newest_rows_with_or_without_a_lease():
    assert torch.equal(held_then_refreshed(with_log=True), held_then_refreshed(with_log=False))


def test_catch_up_is_for_async_reads_only():
    emb = dgl_oac.NodeEmbedding(N, D, "sync-read", seeded_init(4))
    leaf = emb(torch.tensor([1, 2]))  # held while its leaf lives
    (held,) = emb.pipeline.pending()
    with pytest.raises(RuntimeError, match="catch_up\\(\\) is for async reads, not sync"):
        emb.pipeline.catch_up(held)
    del leaf
    emb.close()
