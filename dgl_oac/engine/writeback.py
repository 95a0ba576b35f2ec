"""The write-back: apply committed rows to the CPU table in step order, on one background thread per embedding.

Each item is ``(step, ids: int64[n] CPU, rows: float32[n, D+S] host, event, op)``; ``op`` is ``"write"``
(sync, oac: overwrite) or ``"add"`` (async: add the delta new - old). After a step's rows are in the table the
thread publishes ``clock.publish(step)``, which is what lets later gathers read them as fresh.

An out-of-core table's rows are read ahead again before they are written (:meth:`WriteBack._apply` says why),
and its dirty pages' write-out started after each step (:meth:`~dgl_oac.engine.store.RowStore.start_writeback`).
"""
from __future__ import annotations

import queue
import time
from typing import Callable, Optional

import torch

from .oac import VersionClock
from .runtime import POLL_S, Failure, Worker
from .store import RowStore
from .transfer import wait_host


_FLUSH_CLOSE_S = 60.0


def _start_writeback(store: RowStore) -> Callable[[int], None]:
    def start(step: int) -> None:
        with torch.profiler.record_function("dgl_oac.flush_dirty"):
            store.start_writeback()
    return start


class WriteBack:
    """Bounded queue of committed steps -> table. Errors surface at the next ``submit``/``flush``/``check``."""

    def __init__(self, store: RowStore, clock: VersionClock, maxsize: int, name: str,
                 priority: str = "normal", recycle: Optional[Callable[[torch.Tensor], None]] = None,
                 threads: int = 1) -> None:
        self.store, self.clock = store, clock
        self.recycle = recycle  # gets each item's rows once they are in the table (a CPU buffer pool)
        self.busy_s = 0.0
        self.last_submitted = clock.applied
        self._error: Optional[Failure] = None
        # Out-of-core tables: a second thread starts the write-out of the pages each step dirtied
        # (RowStore.start_writeback says why), so this thread never waits for the disk to take the writes.
        self._flusher: Optional[Worker] = None
        if store.out_of_core:
            self._flusher = Worker(f"dgl-oac-flush-{name}", _start_writeback(store), inbox_size=1, outbox_size=2,
                                   sink=True, priority=priority)
        self._worker = Worker(f"dgl-oac-writeback-{name}", self._apply, inbox_size=maxsize, outbox_size=2,
                              sink=True, priority=priority, threads=threads)

    def _apply(self, item) -> None:
        step, ids, rows, event, op = item
        t0 = time.perf_counter()
        with torch.profiler.record_function("dgl_oac.engine.writeback"):
            wait_host(event)
            if self.store.out_of_core:
                # A 512-byte store into a page the page cache dropped since the gather faults the whole page in
                # first, synchronously, one page at a time (read-before-write), behind the disk's queue of
                # write-outs. Asking for the step's pages together first turns those into one round of reads
                # at depth: 4.6x the rows/s of a plain store, 2.2x a pool of 8 storing threads
                # (benchmarks/studies/writeback_choice.py: oac, 3.8 GiB table, 1.6 GB cgroup). A page just
                # gathered can be evicted already: on Linux >= 6.3 accesses through a MADV_RANDOM mapping do
                # not count as recent use (vma_has_recency), so the gather does not move it back in the LRU.
                with torch.profiler.record_function("dgl_oac.writeback_read_ahead"):
                    self.store.read_ahead(ids)
            if op == "add":
                self.store.add(ids, rows)
            else:
                self.store.write(ids, rows)
        self.clock.publish(step)
        if self._flusher is not None:
            try:  # a request already queued covers this step's pages too
                self._flusher.inbox.put_nowait(step)
            except queue.Full:
                pass
        if self.recycle is not None:
            self.recycle(rows)
        self.busy_s += time.perf_counter() - t0

    def settle(self) -> None:
        """``"auto"`` priority: its threads idle from now on (:meth:`Worker.settle`)."""
        for worker in (self._worker, self._flusher):
            if worker is not None:
                worker.settle()

    def check(self) -> None:
        """Raise a failure of the write-back (or flush) thread in the caller."""
        for worker in (self._worker, self._flusher):
            if self._error is None and worker is not None:
                try:
                    out = worker.outbox.get_nowait()
                except Exception:  # queue.Empty
                    out = None
                if isinstance(out, Failure):
                    self._error = out
        if self._error is not None:
            self._error.reraise()

    def failed(self) -> bool:
        try:
            self.check()
        except BaseException:  # noqa: BLE001 - only whether it failed matters here
            return True
        return False

    def submit(self, step: int, ids: torch.Tensor, rows: torch.Tensor, event, op: str) -> None:
        self.check()
        if step != self.last_submitted + 1:
            raise RuntimeError(f"commit out of order: step {step} submitted after step {self.last_submitted}")
        item = (step, ids, rows, event, op)
        while True:  # not Worker.submit: a full queue whose thread died must raise, not wait forever
            try:
                self._worker.inbox.put(item, timeout=POLL_S)
                break
            except queue.Full:
                self.check()
                if not self._worker.alive():
                    self.check()
                    raise RuntimeError(f"write-back thread ended with steps still pending (step {step})") from None
        self.last_submitted = step

    def flush(self, timeout: float = 600.0) -> None:
        """Block until every submitted step is in the table (raising a write-back failure, never hanging)."""
        deadline = time.monotonic() + timeout
        while not self.clock.wait_applied(self.last_submitted, 0.05):
            self.check()
            if not self._worker.alive():
                self.check()
                raise RuntimeError("write-back thread ended with steps still pending")
            if time.monotonic() > deadline:
                raise TimeoutError(f"write-back did not reach step {self.last_submitted} within {timeout}s")
        self.check()

    def close(self) -> None:
        """Apply what is queued (unless the thread failed), then stop the thread. Idempotent. Called on the
        write-back thread itself (a finalizer the garbage collector ran there), it lets the thread apply its
        queue and end on its own."""
        if self._worker.on_own_thread():
            self._worker.close(drain=True)
            if self._flusher is not None:
                self._flusher.close()
            return
        try:
            if self._error is None and self._worker.alive():
                try:
                    self.flush()
                finally:
                    self._worker.close()
            self._worker.close()
        finally:
            if self._flusher is not None:  # (sync_to_disk() makes the rows durable; this only starts write-outs)
                # A write-out request waits in the block layer's write throttling while the disk takes the
                # dirty pages, which under a tight memory limit (bench_disk's 1.6 GB cgroup) takes longer than
                # Worker.close's default 5 s; the request ends on its own, so waiting for it is bounded.
                self._flusher.close(timeout=_FLUSH_CLOSE_S)
