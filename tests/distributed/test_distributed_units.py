"""The pieces of dgl_oac.distributed that need no process group: id packing, the rank-ordered combine, the
use_ddp padding, and the in-flight bookkeeping of trainers and owners."""
from __future__ import annotations

import unittest.mock

import pytest
import torch

from dgl_oac.distributed.exchange import pack_ids, unpack_ids
from dgl_oac.distributed.inflight import OwnerBook, Registry
from dgl_oac.distributed.partition import RowPartition
from dgl_oac.distributed.split import pad_order
from dgl_oac.distributed.committer import owner_sums
from dgl_oac.engine.step import reduce_duplicates
from dgl_oac.engine.table import VersionClock


def test_ids_survive_packing_in_any_row_slice() -> None:
    ids = torch.tensor([0, 1, 2**40 + 3, 2**62, 7])
    message = torch.cat([pack_ids(ids), torch.randn(5, 1), torch.randn(5, 10)], 1)  # 13 columns: odd offsets
    for lo in range(5):
        for hi in range(lo, 6):
            assert torch.equal(unpack_ids(message[lo:hi, :2]), ids[lo:hi])  # (a one-row slice at an odd offset
            # once failed to view as int64)


class _Kernel:
    def __init__(self, duplicate_reduction: str) -> None:
        self.duplicate_reduction = duplicate_reduction


def combine(parts, dim, reduction="mean"):
    """An owner's gradient as the step plan makes it: the ranks' parts summed, then reduced."""
    ids, sums, reads = owner_sums(parts, dim)
    return ids, reduce_duplicates(_Kernel(reduction), sums, reads)


def test_combine_is_the_mean_over_every_read() -> None:
    def part(ids, reads, grads):
        return torch.cat([pack_ids(torch.tensor(ids)), torch.tensor(reads).unsqueeze(1), torch.tensor(grads)], 1)
    # rank 0 read row 4 once (grad 1) and row 6 twice (sum 4); rank 1 read row 4 once (grad 3)
    ids, mean = combine([part([4, 6], [1.0, 2.0], [[1.0], [4.0]]), part([4], [1.0], [[3.0]])], 1)
    assert torch.equal(ids, torch.tensor([4, 6])) and torch.equal(mean, torch.tensor([[2.0], [2.0]]))
    ids, total = combine([part([4, 6], [1.0, 2.0], [[1.0], [4.0]]), part([4], [1.0], [[3.0]])], 1, "sum")
    assert torch.equal(ids, torch.tensor([4, 6])) and torch.equal(total, torch.tensor([[4.0], [4.0]]))  # torch's
    ids, mean = combine([torch.empty(0, 4), torch.empty(0, 4)], 1)  # nobody read anything this rank owns
    assert ids.numel() == 0 and mean.shape == (0, 1)
    _, sums, reads = owner_sums([part([4, 6], [1.0, 2.0], [[1.0], [4.0]]), part([4], [1.0], [[3.0]])], 1)
    assert torch.equal(sums, torch.tensor([[4.0], [4.0]])) and torch.equal(reads, torch.tensor([2.0, 2.0]))


def test_by_owner_and_padding() -> None:
    part = RowPartition(7, 3)  # ranges of ceil(7 / 3) = 3 rows: [0, 3), [3, 6), [6, 7)
    assert [part.range_of(r) for r in range(3)] == [(0, 3), (3, 6), (6, 7)]
    ids = torch.tensor([5, 2, 6, 1, 3, 0])
    assert part.owner_of(ids).tolist() == [1, 0, 2, 0, 1, 0]
    order, counts = part.by_owner(ids)
    assert counts == [3, 2, 1] and torch.equal(ids[order], torch.tensor([2, 1, 0, 5, 3, 6]))
    assert RowPartition(2, 4).range_of(3) == (2, 2)  # more ranks than rows: the last own none
    with pytest.raises(ValueError, match="rise from 0 to 7"):
        RowPartition(7, 2, [0, 5, 4])
    assert torch.equal(pad_order(torch.tensor([9, 8, 7]), 5), torch.tensor([9, 8, 7, 9, 8]))
    assert torch.equal(pad_order(torch.tensor([9, 8]), 2), torch.tensor([9, 8]))


def test_registry_registers_each_read_once_and_deregisters_it_once() -> None:
    reg, clock = Registry(), VersionClock()
    rv_a, a = reg.open_read(clock, torch.tensor([1, 2]))
    _, b = reg.open_read(clock, torch.tensor([3]))
    _, c = reg.open_read(clock, torch.tensor([4]))
    reg.release(b)  # released before any step: owners never hear of it
    added, gone = reg.take(0, committing=[c])  # c is committed by this very step: owners never hear of it either
    reg.done()
    assert rv_a == -1 and torch.equal(added, torch.tensor([1, 2])) and gone.numel() == 0
    reg.release(c)  # the step's release of c: already ended
    reg.release(a)
    reg.release(a)
    _, d = reg.open_read(clock, torch.tensor([5]))
    added, gone = reg.take(1, committing=[d])
    reg.done()
    assert added.numel() == 0 and torch.equal(gone, torch.tensor([1, 2]))
    _, e = reg.open_read(clock, torch.tensor([6]))
    reg.take(2)
    reg.done()
    added, gone = reg.take(3, committing=[e])  # registered at the last step: deregistered once, by this one
    reg.done()
    assert added.numel() == 0 and torch.equal(gone, torch.tensor([6]))


def test_a_read_opened_during_a_step_reads_its_version_and_registers_at_the_next() -> None:
    """Issue 24: a sharded table's reads never wait for a step. One opened while step 4 runs is at version 4 (it
    is registered at step 5 only, so it must see step 4's writes: its owners serve it once 4 is applied) and
    keeps the log from dropping what it may miss; a replicated table's registry makes reads wait instead."""
    reg, clock = Registry(blocking=False), VersionClock()
    for step in range(4):
        clock.publish(step)
    reg.take(4)
    rv, late = reg.open_read(clock, torch.tensor([7, 8]))  # the step is running: no wait
    assert rv == 4 and reg.opened_during_steps == 1 and clock.horizon() == 3
    clock.publish(4)
    reg.done()
    added, _ = reg.take(5)
    assert torch.equal(added, torch.tensor([7, 8]))  # registered with the step after
    reg.done()
    blocking = Registry(blocking=True)
    blocking.take(0)
    with pytest.raises(TimeoutError):
        with unittest.mock.patch("dgl_oac.distributed.inflight.STEP_WAIT_S", 0.05):
            blocking.open_read(VersionClock(), torch.tensor([1]))


def test_owner_book_counts_reads_per_trainer() -> None:
    book = OwnerBook(RowPartition(10, 2), rank=1)  # owns rows 5..9
    book.apply(0, torch.tensor([6, 8, 8]), +1)
    book.apply(1, torch.tensor([9]), +1)
    book.apply(0, torch.tensor([8]), -1)
    owned = torch.tensor([6, 8, 9, 7])
    assert book.held_by(0, owned).tolist() == [True, True, False, False]
    assert book.held_by(1, owned).tolist() == [False, False, True, False]
    try:
        book.apply(0, torch.tensor([2]), +1)
    except RuntimeError as exc:
        assert "does not own" in str(exc)
    else:
        raise AssertionError("an id owned by another rank was accepted")


def test_rows_computed_on_the_host_are_written_without_a_device_round_trip(make_emb, monkeypatch) -> None:
    """Issue 23 item 6: a distributed owner's kernel runs on the host; the step's ``new_host`` rows are what the
    table gets, with no device -> host copy (``Transfer.to_host`` is never called), through the write-back and
    through write-through alike; ``new`` (the device copy) is what the write log keeps."""
    from dgl_oac.engine.transfer import Transfer

    def no_copy(*_a, **_k):
        raise AssertionError("a device -> host copy of rows the host computed")

    monkeypatch.setattr(Transfer, "to_host", no_copy)
    emb = make_emb(10, 2)
    table = emb.pipeline
    table.prepare(torch.device("cpu"), False, "sync")
    ids = torch.tensor([1, 4])
    host = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    table.commit([], ids, ids, host.clone(), new_host=host)  # write-through: no write-back running
    assert torch.equal(emb.weight[ids], host)
    table.lease("oac", 2, "normal", 0)
    try:
        host2 = host + 10
        table.commit([], ids, ids, host2.clone(), new_host=host2)
        table.flush()
        assert torch.equal(emb.weight[ids], host2)
        logged = table.log.ring[table.log.entries[-1][1] % table.log.capacity:][:2]
        assert torch.equal(logged, host2)
    finally:
        table.end_lease()
