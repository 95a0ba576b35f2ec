"""One pass of a loader over its batches: the caller-side half of the schedule, shared by every batch source.

The schedule, with ``prefetch = k`` (at the moment the caller asks for batch i)::

    caller thread   : pull i+k ─► [submit] ··· wait ─► validate i ─► yield i ─► fwd/bwd i ─► opt.step(): commit i
    gather thread   :              gather+copy i+1 .. i+k (each opens a read at version `applied`)
    write-back thread (one per table):  table[ids_j] = rows_j for committed j < i, in step order; applied = j
    (both background threads at idle priority by default: they run on what the caller's compute leaves free)

    sync : no gather thread; batch i is gathered at hand-out, after every committed step is in the table.
    async: as above without validation; write-back adds (new - old).
    oac  : as above; validate = patch rows whose last write is newer than the batch's read version from the
           device write log (values and optimizer state), so batch i sees exactly what sync would have.

"pull" is the loader's, through the epoch's :class:`~dgl_oac.loading.source.BatchSource` (the one interface
between a loader and its epoch): :class:`dgl_oac.DataLoader` samples batch b of its graph under b's own seed
(:mod:`dgl_oac.dgl_frontend.loader`), :class:`dgl_oac.BatchLoader` takes the next item of its source
(:mod:`dgl_oac.loading.batch_loader`).
Either way the epoch takes the batches in batch order, so the batch stream is the same in every mode and at every
depth: pulled on the caller's thread, or made ahead in order elsewhere (the sampling processes of
``DataLoader(num_workers > 0)``, the source's thread of ``BatchLoader(pull_thread=True)``: the epoch's
``sampling``, which it closes however it ends). Batches in flight (pulled, not yet handed out) never exceed k.

Lifetimes. An epoch (one ``iter(loader)``) owns its sampling processes or source thread, its gather thread, the
reads of batches gathered but not handed out, a lease on each table's write-back thread, and the mark on the input
nodes it handed out last (:mod:`dgl_oac.unpipelined`). All of them end when the epoch ends: at its last batch,
``loader.close()``, an exception in ``next()``, a new ``iter(loader)``, or when the epoch is garbage (a ``break``
and the loader dropped); the last lease applies every queued step before its thread stops. Batches already handed
out belong to their tables (:mod:`dgl_oac.engine.pipeline`), not to the epoch: a ``step()`` after the epoch ended
still commits them (``list(loader)``), written through.

What an epoch owns is :class:`EpochResources`: its sampling workers (``num_workers > 0``), its gather thread,
the reads of batches gathered but not handed out, and its leases on the tables' write-back threads;
:func:`gather_batch` is the gather thread's work on one batch. Both are shared by every way an epoch can
end, which is why they hold no reference to the epoch.
"""
from __future__ import annotations

import functools
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Protocol, Sequence, Union

import torch

from ..device import rows as device_rows
from ..engine.pipeline import TablePipeline, TableRows, gather_batch_rows, release_all
from ..engine.runtime import CallerCores, Worker, background_team, busy_at, finalizer
from ..unpipelined import HandOutMark
from .settings import LoaderSettings
from .source import BatchSource, END
from .stats import CommitCounter, LoaderStats, RowCount


class StructureCarrier(Protocol):
    """What a loader's frontend gives the gather thread to move a batch's structure (its graphs, seeds) to the
    device: the DGL frontend's :class:`~dgl_oac.dgl_frontend.structure.StructureCopy`. The engine never looks
    inside a batch: ``start`` returns what the frontend's hand-out finishes."""

    def start(self, result: Any) -> Any:
        """Gather thread: start moving ``result`` (a sampler's output) to the device; returns what hand-out
        finishes."""


class Closeable(Protocol):
    """Something an epoch owns and closes however it ends (the DGL frontend's sampling processes)."""

    def close(self) -> None:
        """Idempotent."""


class EpochResources:
    """What an epoch gives back however it ends: its gather thread, the reads of batches gathered but not
    handed out, its write-back leases. Holds no reference to the epoch (the epoch's finalizer closes it)."""

    def __init__(self, tables: List[TablePipeline], table_ids: Callable[[Any], List[torch.Tensor]],
                 structure: Optional[StructureCarrier] = None) -> None:
        self.tables, self.table_ids = tables, table_ids
        self.structure = structure  # a device loader's: the gather thread starts each batch's structure copy
        self.sampling: Optional[Closeable] = None  # a frontend's sampling processes (num_workers > 0)
        self.worker: Optional[Worker] = None
        self.leased: List[TablePipeline] = []
        self._open: Dict[int, List[TableRows]] = {}  # batch index -> its gathered rows, not handed out
        self._lock = threading.Lock()  # the gather thread adds reads while close() may run on the caller
        self.closed = False
        self.queued = 0  # batches submitted to the gather thread whose result the epoch has not taken
        self.register = True  # distributed: reads registered with owners (not async ones: never patched)

    def queue(self, n: int) -> None:
        """``n`` batches submitted to the gather thread (``n < 0``: results taken): the tables count them."""
        self.queued += n
        for t in self.tables:
            t.queue_reads(n)

    def start(self, name: str, depth: int, priority: str, seconds: Dict[str, float], threads: int = 1) -> None:
        """The gather thread (``threads``: its OpenMP team, :func:`~dgl_oac.engine.runtime.background_team`)."""
        self.worker = Worker(name, functools.partial(gather_batch, self, seconds), depth, depth, priority=priority,
                             threads=threads)

    def lease(self, mode: str, writeback_depth: int, priority: str, steps_in_flight: int, threads: int = 1) -> None:
        """Reading ahead: the tables' write-back threads (and oac write logs) run."""
        self.register = mode != "async"
        if not self.leased:
            for t in self.tables:
                t.lease(mode, writeback_depth, priority, steps_in_flight, threads)
                self.leased.append(t)

    def go_idle(self) -> None:
        """``"auto"`` priority, once the cores are ours: the gather and write-back threads idle from now on."""
        if self.worker is not None:
            self.worker.go_idle()
        for t in self.leased:
            t.go_idle()

    def end_leases(self) -> None:
        """Depth 0 with nothing in flight (sync's code path): queued steps applied, threads stopped."""
        leased, self.leased = self.leased, []
        for t in leased:
            t.end_lease()

    def hold(self, b: int, rows: List[TableRows]) -> bool:
        """Keep batch ``b``'s open reads until hand-out; False once closed (the caller releases them)."""
        with self._lock:
            if not self.closed:
                self._open[b] = rows
            return not self.closed

    def take(self, b: int) -> None:
        with self._lock:
            self._open.pop(b, None)

    def close(self) -> None:
        """Idempotent; a gather finishing after this (a join timed out) finds ``closed`` and releases its own."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
            queued, self.queued = self.queued, 0
            worker, self.worker = self.worker, None
            sampling, self.sampling = self.sampling, None
            held, self._open = list(self._open.values()), {}
        try:
            if sampling is not None:
                sampling.close()
            if worker is not None:
                worker.close()
            for rows in held:
                release_all(self.tables, rows)
        finally:
            for t in self.tables:
                t.queue_reads(-queued)
            self.end_leases()


def gather_batch(res: EpochResources, seconds: Dict[str, float], item: Any) -> Any:
    """Gather thread: ``(b, sampler output)`` -> ``(b, sampler output, rows per table)``; on a device the
    output's structure copy is started too (``res.structure``, the frontend's)."""
    b, result = item
    rows = gather_batch_rows(res.tables, res.table_ids(result), seconds, read_ahead=True, register=res.register)
    if res.structure is not None:
        try:
            with torch.profiler.record_function("dgl_oac.copy_structure"):
                result = res.structure.start(result)
        except BaseException:
            release_all(res.tables, rows)
            raise
    if not res.hold(b, rows):
        release_all(res.tables, rows)
        return None
    return b, result, rows

def _release(res: EpochResources, cores: CallerCores, mark: HandOutMark) -> None:
    """What an epoch dropped without :meth:`Epoch.close` gives back (it holds no reference to the epoch)."""
    res.close()
    cores.restore()
    mark.close()


@dataclass
class Progress:
    """An epoch's position, kept by its loader beyond the epoch's life; ``finished``: it ran to its end (the
    loader's next epoch is the one after it)."""

    epoch: int
    start: int
    handed: int
    listener: CommitCounter  # its batches' commit listener: tells its pending batches apart
    finished: bool = False


class Epoch:
    """One pass of a loader (module docstring): its batches from ``source`` (batch ``start`` onwards, at most
    ``num_batches``), their rows from the tables of ``embeddings``, run as ``settings`` say, counted in ``stats``
    and ``repatched``. ``structure``: a device loader's structure copy (started on the gather thread);
    ``sampling``: what makes the batches ahead (sampling processes, a source thread), closed with the epoch."""

    def __init__(self, settings: LoaderSettings, source: BatchSource, stats: LoaderStats, repatched: RowCount,
                 embeddings: Sequence[Any], epoch: int, start: int, num_batches: Union[int, float],
                 structure: Optional[StructureCarrier] = None, sampling: Optional[Closeable] = None) -> None:
        self.settings, self.source, self.stats, self.epoch = settings, source, stats, epoch
        self.num_batches = num_batches  # math.inf for a source of unknown length, until it ends
        self.next_sample = self.handed = self.start = start
        self.finished = False
        self.closed = False  # a closed epoch (loader.close(), an error, the end) hands out nothing more
        self.tables = [e.pipeline for e in embeddings]
        # one object per epoch (its tag)
        self.listener = CommitCounter(stats, repatched)
        self.progress = Progress(epoch, start, start, self.listener)
        self.res = EpochResources(self.tables, source.table_ids, structure)
        self.res.sampling = sampling  # with ``cores``: the cores its processes or thread keep busy
        # the caller's team, sized to what the background leaves, and its wait policy (engine/runtime.py); the
        # sampling processes' CPU time counts as ours
        self.cores = CallerCores(lambda: getattr(sampling, "pids", []))
        self.mark = HandOutMark(embeddings)  # on the input nodes handed out: dgl_oac.unpipelined's warnings
        self._finalizer = finalizer(self, _release, self.res, self.cores, self.mark)
        self._sample_error: Optional[BaseException] = None  # raised when its batch is due, not when pulled ahead
        self._last_handout: Optional[float] = None
        self.depth = 0
        self.background_threads = self._share_cores()
        if settings.mode != "sync" and self.tables:
            try:
                self.res.start(f"dgl-oac-gather-e{epoch}", settings.prefetch + 1, settings.background_priority,
                               stats.seconds, self.background_threads)
                self._set_depth(settings.first_depth())
            except BaseException:
                self.res.close()
                self.cores.restore()
                raise
        # a CPU batch the gather thread has not started is gathered here (Worker.result); a device copy keeps to
        # its thread and streams
        self._gather_here = structure is None and not any(device_rows.on_device(t.transfer.device)
                                                          for t in self.tables)

    def _gather_due(self, item: Any) -> bool:
        """Whether the gather thread's queued ``item`` is the batch due (Worker.result then gathers it here)."""
        due = item[0] == self.handed
        self.stats.gathered_by_caller += due
        return due

    def _share_cores(self) -> int:
        """Size the caller's team to the cores left by the sampling processes and, at normal background priority,
        the threads an async/oac epoch of these tables reads ahead with: :mod:`dgl_oac.engine.runtime`. Returns
        the team of each of those threads (:func:`~dgl_oac.engine.runtime.background_team`: what is left).

        The same caller's team in every mode and at every depth, for the whole epoch: a reduction's bits depend
        on its team (torch's sum of 100k floats differs between 1 and 2 threads), and oac's must be sync's. The
        background threads only copy rows, whose bits no team changes."""
        sampling = self.res.sampling
        sampling_cores = sampling.cores if sampling is not None else 0
        threads = 1 + len(self.tables) if self.tables else 0  # a gather thread, a write-back thread per table
        self.cores.share(sampling_cores + threads * busy_at(self.settings.background_priority))
        on_device = any(device_rows.on_device(t.transfer.device) for t in self.tables)
        team = background_team(threads, torch.get_num_threads(), sampling_cores, device=on_device) if threads else 0
        self.stats.background_threads = team
        return team

    def _set_depth(self, depth: int) -> None:
        """Reading ahead leases the tables' write-back threads and logs; depth 0 gives them back once the
        batches read ahead are handed out (see ``__next__``)."""
        self.depth = depth
        if depth > 0:
            s = self.settings
            self.res.lease(s.table_mode, s.writeback_depth, s.background_priority,
                           s.prefetch + s.writeback_depth + 2, self.background_threads)

    def _pull(self, b: int) -> Any:
        t0 = time.perf_counter()
        with torch.profiler.record_function("dgl_oac.sample"):
            result = self.source.pull(b)
        self.stats.seconds["sample"] += time.perf_counter() - t0
        if result is END:
            self.num_batches = min(self.num_batches, b)
        return b, result

    def __iter__(self) -> "Epoch":
        return self

    def __next__(self) -> Any:
        if self.finished or self.closed:
            raise StopIteration
        if self.handed >= self.num_batches:
            self._finish()
            raise StopIteration
        rows: List[TableRows] = []
        self.source.retire()  # the batch handed out last is done with (its rows no longer held)
        try:
            worker = self.res.worker
            if worker is not None and self.next_sample == self.handed and self.depth == 0:
                worker = None  # nothing in flight and depth 0: sync's code path (no write-back thread, no log)
                self.res.end_leases()
            if worker is None:
                b, result = self._pull(self.handed)
                if result is END:
                    self._finish()
                    raise StopIteration
                self.next_sample = max(self.next_sample, self.handed + 1)
                for t in self.tables:
                    t.flush()  # read after every committed step is in the table
                rows = gather_batch_rows(self.tables, self.source.table_ids(result), self.stats.seconds) \
                    if self.tables else []
            else:
                result = self._pull_ahead(worker)
                if result is END:
                    self._finish()
                    raise StopIteration
                b, result, rows = result
            if b != self.handed:
                raise RuntimeError(f"batch {b} arrived in place of batch {self.handed}")
            out = self.source.hand_out(result, rows, self.listener)
        except StopIteration:
            raise
        except BaseException:
            release_all(self.tables, rows)  # a batch that was not handed out (idempotent for registered ones)
            self.close()
            raise
        self.handed += 1
        self.progress.handed = self.handed
        self.stats.batches += 1
        if self.cores.update():  # no other process busy on our cores: "auto" threads go idle
            self.res.go_idle()
        self._pace()
        self.mark.stamp(self.source.handed_ids(out))
        return out

    def _pull_ahead(self, worker: Any) -> Any:
        """Pull batches up to ``depth`` ahead into the gather thread, then wait for the one due:
        ``(b, result, rows)``, or :data:`END`."""
        last = min(self.handed + self.depth, self.num_batches - 1)
        while self.next_sample <= last and self._sample_error is None:
            try:
                b, item = self._pull(self.next_sample)
            except Exception as exc:  # noqa: BLE001 - the batches before it are handed out first
                self._sample_error = exc
                break
            if item is END:
                break
            worker.submit((b, item))
            self.res.queue(1)
            self.next_sample += 1
        if self.next_sample == self.handed:
            if self._sample_error is not None:
                raise self._sample_error
            return END  # the source ended with nothing in flight
        in_flight = self.next_sample - self.handed
        if in_flight > self.settings.prefetch + 1:
            raise RuntimeError(f"{in_flight} batches in flight with prefetch={self.settings.prefetch}")
        self.stats.max_in_flight = max(self.stats.max_in_flight, in_flight - 1)
        t0 = time.perf_counter()
        with torch.profiler.record_function("dgl_oac.wait"):
            out = worker.result(self._gather_due if self._gather_here else None)
        self.stats.seconds["wait"] += time.perf_counter() - t0
        self.res.queue(-1)
        self.res.take(out[0])
        return out

    def _pace(self) -> None:
        """prefetch="auto": feed the caller's seconds per batch to the depth controller, apply its choice."""
        ctl = self.settings.depth_controller
        if ctl is None or self.res.worker is None:
            return
        now = time.perf_counter()
        if self._last_handout is not None:
            ctl.record(now - self._last_handout)
        self._last_handout = now
        depth = ctl.depth()
        if depth != self.depth:
            self._set_depth(depth)

    def _finish(self) -> None:
        self.finished = self.progress.finished = True
        self.close()

    def close(self) -> None:
        """End the epoch (see the module docstring). Idempotent."""
        if not self.closed:
            self.closed = True
            self.source.retire()
        self.mark.close()
        self.res.close()
        self.cores.restore()
