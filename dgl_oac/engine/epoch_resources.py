"""What an epoch of the loader owns and gives back however it ends (see :mod:`dgl_oac.dgl_frontend.loader`'s lifetimes).

:class:`EpochResources`: the epoch's sampling workers (``num_workers > 0``), its gather thread, the reads of
batches gathered but not handed out, and its leases on the tables' write-back threads. :func:`gather_batch` is the gather thread's work on one batch. Both
are shared by every way an epoch can end (its last batch, ``loader.close()``, an exception, the epoch
garbage-collected), which is why they hold no reference to the epoch.
"""
from __future__ import annotations

import functools
import threading
from typing import Any, Callable, Dict, List, Optional, Protocol

import torch

from .pipeline import TableRows
from .pipeline import gather_rows, release_all
from .pipeline import TablePipeline
from .runtime import Worker


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

    def settle(self) -> None:
        """``"auto"`` priority, once the cores are ours: the gather and write-back threads idle from now on."""
        if self.worker is not None:
            self.worker.settle()
        for t in self.leased:
            if t.writer is not None:
                t.writer.settle()

    def give_back(self) -> None:
        """Depth 0 with nothing in flight (sync's code path): queued steps applied, threads stopped."""
        leased, self.leased = self.leased, []
        for t in leased:
            t.give_back()

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
            self.give_back()


def gather_batch(res: EpochResources, seconds: Dict[str, float], item: Any) -> Any:
    """Gather thread: ``(b, sampler output)`` -> ``(b, sampler output, rows per table)``; on a device the
    output's structure copy is started too (``res.structure``, the frontend's)."""
    b, result = item
    rows = gather_rows(res.tables, res.table_ids(result), seconds, read_ahead=True, register=res.register)
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


