"""dgl_oac.engine.runtime: the background-thread contract (bounded queues, stop event, timeouts, names, errors through
the same queue, idempotent close), in the style of torchdata's test/nodes."""
import queue
import sys
import threading
import time
import traceback
import warnings

import pytest

from dgl_oac.engine.runtime import END, Failure, StopEvent, Stopped, Worker, get, put

from conftest import oac_threads

pytestmark = pytest.mark.hang_timeout(20)


def worker_fn_that_fails(item):
    if item == 3:
        raise KeyError(f"bad item {item}")
    return item * 10


def test_results_in_order_then_end():
    w = Worker("dgl-oac-test-order", lambda x: x * x, inbox_size=2, outbox_size=2)
    try:
        assert w.alive() and "dgl-oac-test-order" in oac_threads()
        out = []
        for i in range(20):  # more items than both queues hold: submit and result interleave
            w.submit(i)
            out.append(w.result())
        w.submit(END)
        assert w.result() is END
        assert out == [i * i for i in range(20)]
    finally:
        w.close()
    assert not w.alive()


def test_pipelined_submits_keep_order():
    w = Worker("dgl-oac-test-fifo", lambda x: (time.sleep(0.001 * (x % 3)), x)[1], inbox_size=4, outbox_size=4)
    try:
        for i in range(4):
            w.submit(i)
        got = [w.result() for _ in range(4)]
        assert got == [0, 1, 2, 3]
    finally:
        w.close()


def test_exception_reraised_with_type_and_traceback():
    w = Worker("dgl-oac-test-fail", worker_fn_that_fails, inbox_size=4, outbox_size=4)
    for i in range(5):
        w.submit(i)
    assert [w.result() for _ in range(3)] == [0, 10, 20]
    with pytest.raises(KeyError, match="bad item 3") as err:
        w.result()
    frames = [f.name for f in traceback.extract_tb(err.value.__traceback__)]
    assert "worker_fn_that_fails" in frames and "_run" in frames  # the original frames, from the thread
    if sys.version_info >= (3, 11):  # exceptions carry notes from 3.11 on
        assert "(raised in dgl-oac background stage 'dgl-oac-test-fail')" in err.value.__notes__
    assert not w.alive()  # result() closed the failed stage
    w.close()  # idempotent


@pytest.mark.skipif(sys.version_info < (3, 11), reason="exception notes need Python 3.11")
def test_failure_note_added_once():
    f = Failure(ValueError("x"), "stage-a")
    for _ in range(3):
        with pytest.raises(ValueError) as err:
            f.reraise()
    assert err.value.__notes__ == ["(raised in dgl-oac background stage 'stage-a')"]


def test_sink_drops_results_but_passes_end_and_failures():
    seen = []
    w = Worker("dgl-oac-test-sink", lambda x: seen.append(x) or (1 / x), inbox_size=2, outbox_size=2, sink=True)
    try:
        for i in (1, 2, 4):
            w.submit(i)
        w.submit(END)
        assert w.result() is END
        assert seen == [1, 2, 4]
    finally:
        w.close()
    w2 = Worker("dgl-oac-test-sink2", lambda x: 1 / x, inbox_size=2, outbox_size=2, sink=True)
    w2.submit(0)
    with pytest.raises(ZeroDivisionError):
        w2.result()
    w2.close()


def test_close_is_idempotent_and_joins_blocked_worker():
    release = threading.Event()
    w = Worker("dgl-oac-test-close", lambda x: release.wait(5) and x, inbox_size=1, outbox_size=1)
    w.submit(1)  # being processed
    w.submit(2)  # will block on the full outbox (size 1) after item 1's result
    release.set()
    t0 = time.monotonic()
    w.close()
    assert time.monotonic() - t0 < 1.0
    assert not w.alive() and "dgl-oac-test-close" not in oac_threads()
    w.close()
    w.close()
    with pytest.raises(Stopped):
        w.submit(3)  # a closed stage refuses work instead of blocking


def test_close_while_idle_and_while_producer_blocks_on_full_outbox():
    w = Worker("dgl-oac-test-full", lambda x: x, inbox_size=8, outbox_size=1)
    for i in range(5):
        w.submit(i)
    time.sleep(0.15)  # worker is now blocked putting item 1 into the full outbox
    w.close()
    assert not w.alive()


def test_result_after_close_raises_stopped_not_hangs():
    w = Worker("dgl-oac-test-stopped", lambda x: x, inbox_size=1, outbox_size=1)
    w.close()
    with pytest.raises(Stopped):
        w.result()


def test_get_notices_dead_producer():
    q = queue.Queue()
    stop = StopEvent(q)
    with pytest.raises(RuntimeError, match="producer thread ended without a result"):
        get(q, stop, alive=lambda: False, what="x")
    q.put(7)
    assert get(q, stop, alive=lambda: False) == 7  # drains what a dying producer left first


def test_put_gives_up_when_stopped():
    q = queue.Queue(maxsize=1)
    stop = StopEvent(q)
    put(q, 1, stop)
    threading.Timer(0.1, stop.set).start()
    t0 = time.monotonic()
    with pytest.raises(Stopped):
        put(q, 2, stop)
    assert time.monotonic() - t0 < 0.5  # woken by the stop, not by a poll


def test_threads_are_named_daemons():
    w = Worker("dgl-oac-test-daemon", lambda x: x, 1, 1)
    try:
        t = next(t for t in threading.enumerate() if t.name == "dgl-oac-test-daemon")
        assert t.daemon
    finally:
        w.close()


def test_close_of_a_stuck_item_warns_and_keeps_the_callers_exception():
    """A thread stuck inside one item (a slow page fault, say) cannot be interrupted: close() gives up after
    its timeout with a warning instead of an AssertionError that would replace the exception in flight."""
    release = threading.Event()
    w = Worker("dgl-oac-test-stuck", lambda x: release.wait(5), inbox_size=1, outbox_size=1)
    w.submit(1)
    time.sleep(0.05)  # the item is running
    with pytest.raises(KeyboardInterrupt), pytest.warns(RuntimeWarning, match="dgl-oac-test-stuck did not stop"):
        try:
            raise KeyboardInterrupt
        finally:
            w.close(timeout=0.1)
    release.set()
    w._thread.join(2)
    assert not w.alive()


def test_close_wakes_an_idle_thread_instead_of_waiting_for_its_poll(monkeypatch):
    """An idle stage (blocked on its empty inbox) stops as soon as close() asks, not at its wait's timeout: a
    loop of short epochs would otherwise pay up to one timeout per epoch."""
    from dgl_oac.engine import runtime

    monkeypatch.setattr(runtime, "WAIT_S", 30.0)  # without the wake-up, close() would give up after 2 s, warning
    w = Worker("dgl-oac-test-idle", lambda x: x, inbox_size=2, outbox_size=2)
    w.submit(1)
    assert w.result() == 1  # the thread is now blocked in get(inbox)
    t0 = time.monotonic()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        w.close(timeout=2.0)
    assert not w.alive() and time.monotonic() - t0 < 2.0


def test_background_stages_run_torch_ops_on_their_own_thread_only():
    """A stage's ops stay on its thread (no OpenMP team of its own, which would make libgomp throttle the
    spinning of the caller's team too); the caller's thread count and the process default are unchanged."""
    import os

    import torch

    from dgl_oac.engine.runtime import _openmp_library
    from dgl_oac.engine.runtime import Worker

    if _openmp_library() is None:
        pytest.skip("no OpenMP runtime found in this process")
    main_threads = torch.get_num_threads()
    seen = []

    def work(x):
        big = torch.randn(2000, 300)
        big.index_select(0, torch.randperm(2000))  # parallel in a thread with a team
        seen.append((torch.get_num_threads(), set(os.listdir("/proc/self/task"))))
        return x

    before = set(os.listdir("/proc/self/task"))
    w = Worker("dgl-oac-test-omp", work, 2, 2)
    w.submit(1)
    assert w.result() == 1
    w.close()
    # the worker thread itself is the only new thread, no team threads (compared as sets of thread ids: a thread
    # an earlier test left may end meanwhile, which made a count comparison fail now and then)
    assert seen[0][0] == 1 and len(seen[0][1] - before) == 1
    assert torch.get_num_threads() == main_threads


def test_get_is_woken_by_the_stop_event_and_by_an_item():
    """Blocked waits, not polls: a get returns as soon as an item arrives or the stop is set."""
    from dgl_oac.engine import runtime

    q = queue.Queue(maxsize=1)
    stop = StopEvent(q)
    threading.Timer(0.1, q.put, (5,)).start()
    t0 = time.monotonic()
    assert get(q, stop) == 5 and time.monotonic() - t0 < runtime.WAIT_S / 2
    threading.Timer(0.1, stop.set).start()
    t0 = time.monotonic()
    with pytest.raises(Stopped):
        get(q, stop)
    assert time.monotonic() - t0 < runtime.WAIT_S / 2


def test_put_and_get_refuse_a_stop_event_that_cannot_wake_them():
    q = queue.Queue()
    with pytest.raises(ValueError, match="StopEvent does not wake"):
        get(q, StopEvent())


def test_a_due_item_the_thread_has_not_taken_runs_on_the_caller_and_alone():
    """result(due): the next item, still queued because the thread is busy (or starved), runs on the calling
    thread; the items behind it are held back meanwhile (never two at once) and run on the thread after."""
    gate, ran = threading.Event(), []

    def fn(item):
        ran.append((item, threading.current_thread().name, w.inbox.qsize()))
        if item == "x":
            gate.wait(10)
        return item.upper()

    w = Worker("dgl-oac-test-due", fn, inbox_size=4, outbox_size=4)
    try:
        w.submit("x")
        deadline = time.monotonic() + 10
        while not ran and time.monotonic() < deadline:  # until the thread is inside x
            time.sleep(0.01)
        w.submit("a")
        w.submit("b")
        assert w.result(due=lambda item: item == "a") == "A"
        assert ran[-1] == ("a", threading.current_thread().name, 0)  # here, with b held back
        assert list(w.inbox.queue) == ["b"]
        gate.set()
        assert w.result(due=lambda item: item == "x") == "X"  # taken by the thread: waited for
        assert w.result(due=lambda item: item == "b") == "B"
        assert [(item, name) for item, name, _ in ran[:2]] == [("x", "dgl-oac-test-due"), ("a", "MainThread")]
        assert ran[2][0] == "b" and len(ran) == 3  # on whichever thread got to it first: once
    finally:
        gate.set()
        w.close()


def test_a_due_item_that_fails_on_the_caller_raises_there_says_where_and_closes_the_stage():
    gate, inside = threading.Event(), threading.Event()

    def fn(item):
        if item == "x":
            inside.set()
            gate.wait(10)
        if item == "a":
            gate.set()  # x may end: close() joins the thread
            raise ValueError("bad a")
        return item

    w = Worker("dgl-oac-test-due-fail", fn, inbox_size=4, outbox_size=4)
    try:
        w.submit("x")
        assert inside.wait(10)
        w.submit("a")
        w.submit("b")
        with pytest.raises(ValueError, match="bad a") as err:
            w.result(due=lambda item: item == "a")
        assert err.value.__notes__ == ["(raised in dgl-oac background stage 'dgl-oac-test-due-fail, run on the "
                                       "caller's thread')"]
        assert w.stop.is_set() and not list(w.inbox.queue)  # closed, as after a failure on its thread
    finally:
        gate.set()
        w.close()
