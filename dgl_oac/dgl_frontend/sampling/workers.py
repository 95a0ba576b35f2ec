"""Sampling in worker processes (``DataLoader(num_workers=n)``), with the batch stream of ``num_workers=0``.

Each batch ``b`` of an epoch is sampled by worker ``b % n`` with :func:`dgl_oac.dgl_frontend.sampling.sample_batch`:
under its own seed ``batch_seed(seed, epoch, b)``, with one OpenMP thread, exactly the call the caller makes itself
when ``num_workers=0``. So the batch stream is the same for any ``num_workers`` (and any prefetch depth);
``tests/dgl_frontend/test_sample_workers.py`` checks it bit for bit.

Why ``fork`` (as DGL's own loader does, through torch's on Linux), not ``spawn``/``forkserver``:
  - DGL 1.1.3 gives each thread its own RNG stream, numbered in the order threads first seed it
    (:func:`dgl_oac.dgl_frontend.sampling._claim_dgl_stream`). A child forked from the caller's thread carries that
    thread's stream, so a batch sampled there equals the batch the caller would sample. A spawned child starts a fresh
    process whose stream numbering need not match.
  - The graph, the sampler and the epoch's seed order are inherited, not pickled (``spawn`` would copy the graph
    into every worker, or need it moved to shared memory first); no import of torch and DGL per worker.
  - The risk of ``fork`` is a lock held by another thread of the parent at the fork. The workers are forked when
    the epoch starts, before its gather thread and write-back leases exist (the previous epoch's are stopped),
    and a child runs only the sampler (DGL and torch CPU ops on one thread) and its queues, as a DGL worker does.
    The graph's sparse formats are built before the fork (``create_formats_``, as DGL does), so no worker
    rebuilds them in its copy-on-write memory every epoch.

Results travel in order: worker ``w`` takes its batch indices in increasing order from its own index queue and
puts ``(b, result)`` into its own result queue, so the caller's ``get(b)`` reads queue ``b % n``. At most
``in_flight`` batches are requested ahead of the one the caller takes next. Tensors and DGL graphs cross in
shared memory (torch's and DGL's ``ForkingPickler`` reductions).

Every way the pool ends (keep this list true when changing the code):
  - :meth:`SampleWorkers.close` (idempotent): from the epoch's close (its last batch, ``loader.close()``, a new
    ``iter(loader)``, an exception in ``next()``), and from the epoch's finalizer (a ``break``, the loader
    dropped). Each worker gets a stop message, is joined with a timeout, then terminated; queues are closed
    without waiting for their feeder threads.
  - A worker's exception: sent with its batch index and traceback; :meth:`get` raises it when that batch is
    due, naming the batch, the epoch and the worker.
  - A worker that dies (killed, crashed): :meth:`get` sees the process gone while waiting for its batch and
    raises, naming the batch and the exit code.
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

import dgl
import torch

POLL_S = 0.05  # how often a blocked get re-checks that the other side is alive
JOIN_S = 2.0  # close(): how long a worker may take to leave after its stop message before it is terminated


def check_num_workers(num_workers: Any, graph: Any) -> int:
    """``DataLoader(num_workers=...)``: an int >= 0; workers need the graph in CPU memory (as DGL's do)."""
    if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 0:
        raise ValueError(f"num_workers must be an integer >= 0, got {num_workers!r}")
    if num_workers and isinstance(graph, dgl.distributed.DistGraph):
        raise ValueError("num_workers > 0 with a dgl.distributed.DistGraph: its sampling is DGL's RPC, whose client "
                         "lives in this process and is not fork-safe; use num_workers=0 (batches are sampled on the "
                         "servers)")
    if num_workers and graph.device.type != "cpu":
        raise ValueError(f"num_workers > 0 samples in worker processes and needs the graph on the CPU; it is on "
                         f"{graph.device}: use num_workers=0")
    return num_workers


class SampleWorkers:
    """Worker processes sampling an epoch's batches ``start .. num_batches - 1`` in order.

    graph: DGLGraph on the CPU; ``seeds_of(b)``: batch ``b``'s seeds (:func:`dgl_oac.sampling.batch_seeds`).
    """

    def __init__(self, graph: Any, sampler: Any, seeds_of: Callable[[int], Any], seed: int, epoch: int,
                 start: int, num_batches: int, num_workers: int, in_flight: int) -> None:
        if num_workers < 1 or in_flight < 1:
            raise ValueError(f"need num_workers >= 1 and in_flight >= 1, got {num_workers}, {in_flight}")
        graph.create_formats_()
        ctx = multiprocessing.get_context("fork")
        self.epoch, self.num_batches, self.in_flight = epoch, num_batches, in_flight
        self.cores = num_workers  # busy while sampling ahead (dgl_oac.engine.runtime sizes the caller's team)
        self._next_request = self._next_get = start
        self._closed = False
        self._index = [ctx.Queue() for _ in range(num_workers)]
        self._results = [ctx.Queue() for _ in range(num_workers)]
        self._procs = []
        try:
            for w in range(num_workers):
                p = ctx.Process(target=_worker_loop, name=f"dgl-oac-sampler-e{epoch}-w{w}", daemon=True,
                                args=(graph, sampler, seeds_of, seed, epoch, self._index[w],
                                      self._results[w], os.getpid()))
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
        """Batch ``b``'s sampler output (``b`` = the next batch in order); raises the worker's exception for it."""
        if self._closed:
            raise RuntimeError("the sampling workers are closed")
        if b != self._next_get:
            raise RuntimeError(f"sampling workers asked for batch {b}, expected batch {self._next_get}")
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
            raise RuntimeError(f"sampling worker {w} (pid {proc.pid}) died with exit code {code} while "
                               f"sampling batch {b} of epoch {self.epoch}") from cause
        if got != b:
            self.close()
            raise RuntimeError(f"sampling worker {w} sent batch {got} in place of batch {b}")
        self._next_get += 1
        self._request()
        if not ok:
            exc, tb = payload
            if hasattr(exc, "add_note"):
                exc.add_note(f"(raised while sampling batch {b} of epoch {self.epoch} in sampling worker {w}; "
                             f"its traceback:\n{tb})")
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


def _worker_loop(graph: Any, sampler: Any, seeds_of: Callable[[int], Any], seed: int, epoch: int,
                 index: "multiprocessing.Queue", results: "multiprocessing.Queue", parent: int) -> None:
    """A worker process: sample the batches ``index`` names until a ``None`` or the parent is gone."""
    from . import sample_batch

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
            out: Any = (b, True, sample_batch(graph, sampler, seeds_of, seed, epoch, b))
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


__all__ = ["SampleWorkers", "check_num_workers"]
