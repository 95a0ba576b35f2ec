"""dgl_oac.engine.table.WriteBack on its own (a RowStore and a VersionClock, no loader): steps applied in step
order and published; an out-of-order submit is refused; a failure of the thread surfaces at the next
check/flush/submit and at every later one; close() applies what is queued and is idempotent."""
from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest
import torch

from dgl_oac.engine.table import RowStore, VersionClock, WriteBack

pytestmark = pytest.mark.hang_timeout(60)

N, W = 20, 3


class Boom(RuntimeError):
    pass


@pytest.fixture
def parts():
    """``(store, clock, make)``; ``make(**kw)`` builds a WriteBack, every one made is closed at teardown."""
    store, clock, made = RowStore(N, W), VersionClock(), []

    def make(maxsize=4, **kw):
        wb = WriteBack(store, clock, maxsize, "test", **kw)
        made.append(wb)
        return wb

    yield store, clock, make
    for wb in made:
        wb.close()


def item(step, ids, value):
    """Rows ``float32[len(ids), W]`` all equal to ``value`` (the step that wrote a row can be read back)."""
    ids = torch.tensor(ids)
    return step, ids, torch.full((len(ids), W), float(value)), None


def thread_of(wb):
    return wb._worker._thread


def test_steps_are_applied_in_order_and_published(parts):
    store, clock, make = parts
    published = []
    real_publish = clock.publish

    def publish(step):
        assert torch.equal(store.table[step % N], torch.full((W,), float(step))), "published before applied"
        published.append(step)
        real_publish(step)

    clock.publish = publish
    wb = make(maxsize=3)
    expect = torch.zeros(N, W)
    for step in range(30):  # row 0 is written by every step: the table keeps the last one
        ids = sorted({0, step % N})
        wb.submit(*item(step, ids, step), "write")
        expect[ids] = float(step)
    wb.flush()
    assert published == list(range(30)) and clock.applied == 29
    assert torch.equal(store.table, expect)


def test_add_steps_accumulate(parts):
    store, clock, make = parts
    wb = make()
    for step in range(10):
        wb.submit(*item(step, [1, 4], 1.0), "add")
    wb.flush()
    assert torch.equal(store.table[[1, 4]], torch.full((2, W), 10.0))
    assert float(store.table.abs().sum()) == 2 * W * 10.0


def test_rows_are_recycled_once_in_the_table(parts):
    store, clock, make = parts
    recycled = []
    wb = make(recycle=lambda rows: recycled.append((rows, clock.applied)))
    items = [item(s, [s], s) for s in range(5)]
    for it in items:
        wb.submit(*it, "write")
    wb.flush()
    assert [r is it[2] for (r, _), it in zip(recycled, items)] == [True] * 5
    assert [applied for _, applied in recycled] == list(range(5))  # after its step was published


@pytest.mark.parametrize("step", [2, 0, -1])
def test_out_of_order_submit_raises_runtime_error(parts, step):
    store, clock, make = parts
    wb = make()
    wb.submit(*item(0, [1], 1), "write")
    with pytest.raises(RuntimeError, match=f"commit out of order: step {step} submitted after step 0"):
        wb.submit(*item(step, [2], 2), "write")
    wb.submit(*item(1, [2], 2), "write")  # the refused submit changed nothing
    wb.flush()
    assert clock.applied == 1


def test_out_of_order_is_not_an_assertion():
    """``python -O`` strips asserts: the order check must be a real exception, raised under -O too."""
    code = ("import torch\n"
            "from dgl_oac.engine.table import VersionClock\n"
            "from dgl_oac.engine.table import RowStore\n"
            "from dgl_oac.engine.table import WriteBack\n"
            "wb = WriteBack(RowStore(4, 2), VersionClock(), 2, 'no-assert')\n"
            "try:\n"
            "    wb.submit(3, torch.tensor([1]), torch.ones(1, 2), None, 'write')\n"
            "except RuntimeError as exc:\n"
            "    print('raised:', exc)\n"
            "finally:\n"
            "    wb.close()\n")
    run = subprocess.run([sys.executable, "-O", "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and "raised: commit out of order: step 3" in run.stdout, run.stdout + run.stderr


def failing_store(store, at, gate=None):
    """Make ``store.write`` raise Boom on its ``at``-th call (0-based), once ``gate`` (an Event) is set if
    given; returns the list of calls."""
    calls = []
    real = store.write

    def write(ids, rows):
        calls.append(len(calls))
        if len(calls) - 1 == at:
            if gate is not None:
                assert gate.wait(10)
            raise Boom(f"write {at} failed")
        real(ids, rows)

    store.write = write
    return calls


def every_call_raises(wb):
    with pytest.raises(Boom, match="write 2 failed"):
        wb.check()
    with pytest.raises(Boom, match="write 2 failed"):
        wb.flush()
    with pytest.raises(Boom, match="write 2 failed"):
        wb.submit(*item(wb.last_submitted + 1, [0], 9), "write")
    assert wb.failed()


@pytest.mark.parametrize("first", ["check", "flush", "submit"])
def test_failure_surfaces_at_the_next_call_and_every_later_one(parts, first):
    store, clock, make = parts
    gate = threading.Event()
    failing_store(store, at=2, gate=gate)
    wb = make()
    for step in range(4):  # all submitted before step 2 fails
        wb.submit(*item(step, [step], step), "write")
    gate.set()
    thread_of(wb).join(10)  # the failed thread ends (its failure waits in the outbox)
    assert not thread_of(wb).is_alive()
    with pytest.raises(Boom, match="write 2 failed"):
        if first == "check":
            wb.check()
        elif first == "flush":
            wb.flush()
        else:
            wb.submit(*item(4, [4], 4), "write")
    every_call_raises(wb)
    every_call_raises(wb)  # again: the table misses the steps queued behind the failure
    assert clock.applied == 1  # steps 0 and 1 are in; 2 failed; 3 was never applied
    assert torch.equal(store.table[[0, 1]], torch.tensor([[0.0] * W, [1.0] * W]))
    assert float(store.table[2:].abs().sum()) == 0.0
    wb.close()  # close after a failure does not raise, and does not hide it
    with pytest.raises(Boom):
        wb.check()


def test_flush_raises_a_failure_instead_of_waiting(parts):
    store, clock, make = parts
    failing_store(store, at=2)
    wb = make(maxsize=8)
    t0 = time.monotonic()
    with pytest.raises(Boom):  # at a later submit or at the flush, whichever comes first after the failure
        for step in range(6):
            wb.submit(*item(step, [step], step), "write")
        wb.flush(timeout=30)
    assert time.monotonic() - t0 < 5


def test_close_applies_what_is_queued(parts):
    store, clock, make = parts
    gate = threading.Event()
    real = store.write

    def slow_write(ids, rows):
        gate.wait(10)
        real(ids, rows)

    store.write = slow_write
    wb = make(maxsize=16)
    for step in range(10):
        wb.submit(*item(step, [step], step + 1), "write")
    assert clock.applied == -1  # all queued behind the gate
    threading.Timer(0.1, gate.set).start()
    wb.close()
    assert clock.applied == 9
    assert torch.equal(store.table[:10], torch.arange(1, 11).float().unsqueeze(1).expand(10, W))
    assert not thread_of(wb).is_alive()


def test_close_is_idempotent(parts):
    store, clock, make = parts
    wb = make()
    wb.submit(*item(0, [3], 7), "write")
    wb.close()
    wb.close()
    assert clock.applied == 0 and torch.equal(store.table[3], torch.full((W,), 7.0))
    assert not thread_of(wb).is_alive()
    wb.check()  # no failure to report
