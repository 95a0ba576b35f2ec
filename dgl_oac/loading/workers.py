"""Batches made in worker processes, in the order and with the stream of making them on the caller's thread.

:class:`BatchWorkers` runs ``make(b)`` for each batch ``b`` of an epoch in worker ``b % n``. A frontend whose
batches are a pure function of their index (the DGL frontend's ``DataLoader(num_workers=n)``: batch ``b`` is
sampled under its own seed, :func:`dgl_oac.dgl_frontend.sampling.sample_batch`) gets the stream of
``num_workers=0`` for any ``n``; ``tests/dgl_frontend/test_sample_workers.py`` checks it bit for bit.

Why ``fork`` (as DGL's own loader does, through torch's on Linux), not ``spawn``/``forkserver``:
  - What ``make`` closes over (a graph, a sampler, the epoch's seed order) is inherited, not pickled (``spawn``
    would copy a graph into every worker, or need it moved to shared memory first); no import of torch per
    worker. A child forked from the caller's thread also carries that thread's per-thread state, such as DGL
    1.1.3's RNG stream (:func:`dgl_oac.dgl_frontend.sampling._claim_dgl_stream`), so a batch made there equals
    the batch the caller would make.
  - The risk of ``fork`` is a lock held by another thread of the parent at the fork. The workers are forked when
    the epoch starts, before its gather thread and write-back leases exist (the previous epoch's are stopped),
    and a child runs only ``make`` (CPU ops on one thread) and its queues, as a DGL worker does.

Results travel in order: worker ``w`` takes its batch indices in increasing order from its own index queue and
puts ``(b, result)`` into its own result queue, so the caller's ``get(b)`` reads queue ``b % n``. At most
``in_flight`` batches are requested ahead of the one the caller takes next. Tensors (and DGL graphs) cross in
shared memory (torch's and DGL's ``ForkingPickler`` reductions).

Every way the pool ends (keep this list true when changing the code):
  - :meth:`BatchWorkers.close` (idempotent): from the epoch's close (its last batch, ``loader.close()``, a new
    ``iter(loader)``, an exception in ``next()``), and from the epoch's finalizer (a ``break``, the loader
    dropped). Each worker gets a stop message, is joined with a timeout, then terminated; queues are closed
    without waiting for their feeder threads.
  - A worker's exception: sent with its batch index and traceback; :meth:`BatchWorkers.get` raises it when that
    batch is due, naming the batch, the epoch and the worker.
  - A worker that dies (killed, crashed): :meth:`BatchWorkers.get` sees the process gone while waiting for its
    batch and raises, naming the batch and the exit code.
  - The caller's process exits: workers are daemon processes (``multiprocessing`` terminates them at exit), and
    a worker whose parent is gone (SIGKILL) exits at its next poll.
"""
from __future__ import annotations

import multiprocessing
import os
import queue
import signal
import traceback
from typing import Any, Callable, List, Optional

import torch

POLL_S = 0.05  # how often a blocked get re-checks that the other side is alive
JOIN_S = 2.0  # close(): how long a worker may take to leave after its stop message before it is terminated


class BatchWorkers:
    """Worker processes making an epoch's batches ``start .. num_batches - 1``, in order: batch ``b`` is
    ``make(b)``, run by worker ``b % num_workers``. ``make`` is inherited by the fork, never pickled (a partial
    over a graph and a sampler, say); it must be a pure function of ``b``, so that the stream is the same for
    any number of workers. ``activity`` names the work in errors ("sampling worker 1", "while sampling batch 3") and
    processes (``dgl-oac-sampling-e0-w1``)."""

    def __init__(self, make: Callable[[int], Any], epoch: int, start: int, num_batches: int, num_workers: int,
                 in_flight: int, activity: str = "sampling") -> None:
        if num_workers < 1 or in_flight < 1:
            raise ValueError(f"need num_workers >= 1 and in_flight >= 1, got {num_workers}, {in_flight}")
        ctx = multiprocessing.get_context("fork")
        self.epoch, self.num_batches, self.in_flight, self.activity = epoch, num_batches, in_flight, activity
        self.cores = num_workers  # busy while sampling ahead (dgl_oac.engine.runtime sizes the caller's team)
        self._next_request = self._next_get = start
        self._closed = False
        self._index = [ctx.Queue() for _ in range(num_workers)]
        self._results = [ctx.Queue() for _ in range(num_workers)]
        self._procs = []
        try:
            for w in range(num_workers):
                p = ctx.Process(target=_worker_loop, name=f"dgl-oac-{activity}-e{epoch}-w{w}", daemon=True,
                                args=(make, self._index[w], self._results[w], os.getpid()))
                p.start()
                self._procs.append(p)
            self._request()
        except BaseException:
            self.close()
            raise

    @property
    def pids(self) -> List[int]:
        return [p.pid for p in self._procs]

    def _request(self) -> None:
        last = min(self._next_get + self.in_flight, self.num_batches)
        while self._next_request < last:
            b = self._next_request
            self._index[b % len(self._procs)].put(b)
            self._next_request += 1

    def get(self, b: int) -> Any:
        """``make(b)`` (``b`` = the next batch in order); raises the worker's exception for it."""
        if self._closed:
            raise RuntimeError(f"the {self.activity} workers are closed")
        if b != self._next_get:
            raise RuntimeError(f"{self.activity} workers asked for batch {b}, expected batch {self._next_get}")
        w = b % len(self._procs)
        proc = self._procs[w]
        while True:
            try:
                got, ok, payload = self._results[w].get(timeout=POLL_S)
                break
            except queue.Empty:
                if proc.is_alive():
                    continue
                cause: Optional[BaseException] = None
            except Exception as exc:  # noqa: BLE001 - e.g. its tensors' shared memory went with a dead sender
                proc.join(POLL_S)
                if proc.is_alive():
                    self.close()
                    raise
                cause = exc
            code = proc.exitcode
            self.close()
            raise RuntimeError(f"{self.activity} worker {w} (pid {proc.pid}) died with exit code {code} while "
                               f"{self.activity} batch {b} of epoch {self.epoch}") from cause
        if got != b:
            self.close()
            raise RuntimeError(f"{self.activity} worker {w} sent batch {got} in place of batch {b}")
        self._next_get += 1
        self._request()
        if not ok:
            exc, tb = payload
            if hasattr(exc, "add_note"):
                exc.add_note(f"(raised while {self.activity} batch {b} of epoch {self.epoch} in {self.activity} "
                             f"worker {w}; its traceback:\n{tb})")
            raise exc
        return payload

    def close(self) -> None:
        """Stop and reap every worker. Idempotent."""
        if self._closed:
            return
        self._closed = True
        for q in self._index:
            try:
                q.put(None)
            except (ValueError, OSError):  # already closed
                pass
        for p in self._procs:
            p.join(JOIN_S)
            if p.is_alive():
                p.terminate()
                p.join(JOIN_S)
        for q in self._index + self._results:
            q.cancel_join_thread()  # never wait at exit for a feeder thread writing to a reader that is gone
            q.close()


def _worker_loop(make: Callable[[int], Any], index: "multiprocessing.Queue", results: "multiprocessing.Queue",
                 parent: int) -> None:
    """A worker process: make the batches ``index`` names until a ``None`` or the parent is gone."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the caller's to handle; it closes the workers
    torch.set_num_threads(1)
    results.cancel_join_thread()  # a stopped worker must not wait for the caller to read what it put last
    while True:
        try:
            b = index.get(timeout=POLL_S)
        except queue.Empty:
            if os.getppid() != parent:
                return
            continue
        if b is None:
            return
        try:
            out: Any = (b, True, make(b))
        except Exception as exc:  # noqa: BLE001 - travels to the caller with the batch index
            out = (b, False, (_picklable(exc), traceback.format_exc()))
        results.put(out)


def _picklable(exc: BaseException) -> BaseException:
    """``exc`` if it survives pickling, else a RuntimeError with its type and message."""
    import pickle

    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:  # noqa: BLE001 - any failure to round-trip
        return RuntimeError(f"{type(exc).__name__}: {exc}")


__all__ = ["BatchWorkers"]
