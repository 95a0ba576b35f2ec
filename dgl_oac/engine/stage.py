"""The contract every background thread of dgl-oac follows, in one helper.

A :class:`Worker` is a named daemon thread that takes items from a bounded inbox, runs ``fn(item)`` and puts
the result, end-of-data or the exception (with its traceback) into a bounded outbox. Every blocking call has
a timeout, so nothing hangs and ``close()`` (idempotent) always returns.

Waits block; they do not poll. A :func:`put` or :func:`get` sleeps on its queue's condition until an item or
a free slot arrives, or until its :class:`StopEvent` is set, which wakes it at once. The timeout
(:data:`WAIT_S`) only bounds how late a producer that died without a word is noticed.

Why block rather than poll (``q.get(timeout=0.05)`` in a loop): on the hot path both wake on the same thing,
the queue's condition notified by the put, so a batch is handed over no sooner and no later; polling would
only add 20 wake-ups a second per blocked thread, and make a ``close()`` or a stop wait for the next poll
(``benchmarks/before_after.py`` measures no difference in step time between the two).
"""
from __future__ import annotations

import atexit
import queue
import threading
import warnings
import weakref
from typing import Any, Callable, List, Optional

from .cores import set_thread_priority, thread_team

WAIT_S = 1.0  # longest sleep of a blocked put/get between checks that its producer is alive (a safety net:
# the stop event and the queue wake them at once)
POLL_S = 0.05  # re-check interval of the write-back's waits on a thread that may die (engine/writeback.py)

_LIVE: "weakref.WeakSet[Worker]" = weakref.WeakSet()  # every started Worker, for the exit hook below


@atexit.register
def _close_all_at_exit() -> None:
    """Stop every background stage before the interpreter finalizes.

    A daemon thread still inside a torch or DGL call while the interpreter tears down its C++ runtime aborts
    the process (``terminate called without an active exception``, exit 134). Owners close their threads
    when they close or die; this hook covers what is still referenced at exit (a loader left in a module-level
    variable after a ``break``). Sinks (write-backs) apply what they hold first: committed steps are kept.
    """
    workers = list(_LIVE)
    for w in sorted(workers, key=lambda w: w.sink):  # gathers first, then the write-backs they feed
        w.close(drain=w.sink)


class End:
    """End-of-data marker travelling through a queue."""


END = End()


class Failure:
    """An exception raised in a background thread, carried to the caller with its original traceback."""

    def __init__(self, exc: BaseException, where: str) -> None:
        self.exc = exc
        self.where = where
        if hasattr(exc, "add_note"):  # Python >= 3.11: say where (once, however often it is re-raised)
            exc.add_note(f"(raised in dgl-oac background stage '{where}')")

    def reraise(self) -> None:
        raise self.exc  # the original exception object: its type and traceback frames are kept


class Stopped(RuntimeError):
    """A put or get gave up because its stage is closing."""


class StopEvent(threading.Event):
    """A stop event that wakes every :func:`put` and :func:`get` blocked on ``queues`` when it is set."""

    def __init__(self, *queues: "queue.Queue[Any]") -> None:
        super().__init__()
        self._queues = queues

    def set(self) -> None:
        super().set()
        for q in self._queues:
            with q.mutex:
                q.not_empty.notify_all()
                q.not_full.notify_all()


def _check_stop(q: "queue.Queue[Any]", stop: StopEvent) -> None:
    if q not in stop._queues:
        raise ValueError("put/get on a queue its StopEvent does not wake: build it as StopEvent(queue, ...)")


def put(q: "queue.Queue[Any]", item: Any, stop: StopEvent) -> None:
    """Put into a bounded queue; blocks until a slot is free, or gives up with :class:`Stopped` once ``stop`` is
    set (it wakes this call)."""
    _check_stop(q, stop)
    with q.not_full:
        while True:
            if stop.is_set():
                raise Stopped("stage stopped")
            if q.maxsize <= 0 or q._qsize() < q.maxsize:
                break
            q.not_full.wait(WAIT_S)
        q._put(item)
        q.unfinished_tasks += 1
        q.not_empty.notify()


def get(q: "queue.Queue[Any]", stop: StopEvent, alive: Optional[Callable[[], bool]] = None,
        what: str = "queue") -> Any:
    """Get from a queue; blocks until an item arrives, or gives up once ``stop`` is set (it wakes this call) or
    the producer died without saying so (noticed within :data:`WAIT_S`; a producer that fails puts a Failure
    first, which is returned)."""
    _check_stop(q, stop)
    with q.not_empty:
        while not q._qsize():
            if stop.is_set():
                raise Stopped(f"{what}: stage stopped")
            if alive is not None and not alive():
                raise RuntimeError(f"{what}: producer thread ended without a result")
            q.not_empty.wait(WAIT_S)
        item = q._get()
        q.not_full.notify()
        return item


class Worker:
    """One background stage: inbox -> fn -> outbox, on a named daemon thread (``priority``: see
    :func:`set_thread_priority`; ``threads``: the OpenMP team of its torch ops, :func:`thread_team`)."""

    def __init__(self, name: str, fn: Callable[[Any], Any], inbox_size: int, outbox_size: int,
                 sink: bool = False, priority: str = "normal", threads: int = 1) -> None:
        self.name = name
        self.priority = priority
        self.threads = threads
        self.sink = sink  # a sink's results are dropped; only END and failures reach the outbox
        self._fn = fn
        self.inbox: "queue.Queue[Any]" = queue.Queue(maxsize=inbox_size)
        self.outbox: "queue.Queue[Any]" = queue.Queue(maxsize=outbox_size)
        self.stop = StopEvent(self.inbox, self.outbox)
        self._drain = False  # close(drain=True) from the thread itself: stop once the inbox is empty
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()
        _LIVE.add(self)

    def _run(self) -> None:
        set_thread_priority(self.priority)
        thread_team(self.threads)
        try:
            while True:
                item = get(self.inbox, self.stop, what=self.name)
                if self.stop.is_set():
                    return
                if item is END:
                    put(self.outbox, END, self.stop)
                    return
                out = self._fn(item)
                if not self.sink:
                    put(self.outbox, out, self.stop)
                if self._drain and self.inbox.empty():
                    return
        except Stopped:
            return
        except BaseException as exc:  # noqa: BLE001 - everything travels to the caller
            try:
                put(self.outbox, Failure(exc, self.name), self.stop)
            except Stopped:
                pass

    def submit(self, item: Any) -> None:
        put(self.inbox, item, self.stop)

    def result(self, due: Optional[Callable[[Any], bool]] = None) -> Any:
        """Next output; re-raises a stage failure in the caller; END at end of data.

        ``due(item)``: whether ``item`` is the one whose output is next. When it still waits in the inbox (the
        thread has not taken it), it runs on the calling thread instead: at idle priority beside a busy process
        the stage's thread gets a core only while its caller waits, so waiting for it would leave the caller's
        core idle until the scheduler hands it over. The output is the same (the stage's function, in order);
        the items behind it are held back meanwhile, so the function never runs on two threads at once."""
        if due is not None:
            ahead = self._take_due(due)
            if ahead is not None:
                try:
                    out = self._fn(ahead[0])
                except BaseException as exc:
                    Failure(exc, f"{self.name}, run on the caller's thread")  # as from the thread: says where
                    self.close()
                    raise
                with self.inbox.mutex:
                    self.inbox.queue.extendleft(reversed(ahead[1:]))
                    if ahead[1:]:
                        self.inbox.not_empty.notify()
                return out
        out = get(self.outbox, self.stop, alive=self._thread.is_alive, what=self.name)
        if isinstance(out, Failure):
            self.close()
            out.reraise()
        return out

    def _take_due(self, due: Callable[[Any], bool]) -> Optional[List[Any]]:
        """Every queued item, when the first is due and the thread has not taken it (else None, nothing taken)."""
        if self.sink or self.stop.is_set() or not self.outbox.empty():
            return None
        with self.inbox.mutex:
            queued = self.inbox.queue
            if not queued or queued[0] is END or not due(queued[0]):
                return None
            items = list(queued)
            queued.clear()
            self.inbox.not_full.notify_all()
        return items

    def alive(self) -> bool:
        return self._thread.is_alive()

    def settle(self) -> None:
        """An ``"auto"`` priority thread: idle from now on (:func:`~dgl_oac.engine.cores.set_thread_priority`).
        On the owner's thread; once."""
        if self.priority == "auto" and self._thread.is_alive():
            self.priority = "idle"
            set_thread_priority("idle", self._thread.native_id)

    def on_own_thread(self) -> bool:
        return self._thread is threading.current_thread()

    def close(self, timeout: float = 5.0, drain: bool = False) -> None:
        """Stop the thread and drop queued items (with ``drain``, run them first). Idempotent."""
        if drain and self._thread.is_alive() and not self.stop.is_set():
            if self._thread is threading.current_thread():  # a finalizer running on this thread: end later
                self._drain = True
                return
            while self._thread.is_alive():  # END after the queued items: they run first
                try:
                    self.inbox.put(END, timeout=WAIT_S)
                    break
                except queue.Full:
                    continue
            self._thread.join(timeout)
        self.stop.set()  # wakes the thread if it waits on either queue
        for q in (self.inbox, self.outbox):
            while True:
                try:
                    q.get_nowait()
                except queue.Empty:
                    break
        if self._thread is not threading.current_thread():
            self._thread.join(timeout)
            if self._thread.is_alive():
                # A warning, not an error: close() often runs while another exception (Ctrl-C, a failed step)
                # propagates, which must not be replaced. The daemon thread exits once its current item ends.
                warnings.warn(f"background stage {self.name} did not stop within {timeout}s (still inside "
                              f"{getattr(self._fn, '__qualname__', 'its function')}); it exits after that item",
                              RuntimeWarning, stacklevel=2)
