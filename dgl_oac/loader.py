"""``dgl_oac.DataLoader``: DGL's loader, plus the rows of learnable embeddings, pipelined.

The schedule, with ``prefetch = k`` (at the moment the caller asks for batch i)::

    caller thread   : sample i+k ─► [submit] ··· wait ─► validate i ─► yield i ─► fwd/bwd i ─► opt.step(): commit i
    gather thread   :                gather+copy i+1 .. i+k (each opens a read at version `applied`)
    write-back thread (one per table):  table[ids_j] = rows_j for committed j < i, in step order; applied = j
    (both background threads at idle priority by default: they run on what the caller's compute leaves free)

    sync : no gather thread; batch i is gathered at hand-out, after every committed step is in the table.
    async: as above without validation; write-back adds (new - old).
    oac  : as above; validate = patch rows whose last write is newer than the batch's read version from the
           device write log (values and optimizer state), so batch i sees exactly what sync would have.

Batches in flight (sampled, not yet handed out) never exceed k. Sampling stays on the caller's thread because
that is the only place DGL's RNG is reproducible (:mod:`dgl_oac.sampling`); the batch stream is a function of
``seed`` alone, identical in every mode.

Lifetimes. An epoch (one ``iter(loader)``) owns its gather thread, the reads of batches gathered but not handed
out, and a lease on each table's write-back thread. All of them end when the epoch ends: at its last batch,
``loader.close()``, an exception in ``next()``, a new ``iter(loader)``, or when the epoch is garbage (a
``break`` and the loader dropped); the last lease applies every queued step before its thread stops. Batches
already handed out belong to their tables (:mod:`dgl_oac.pipeline`), not to the epoch: a ``step()`` after the
epoch ended still commits them (``list(loader)``), written through.
"""
from __future__ import annotations

import functools
import math
import threading
import time
import warnings
import weakref
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Optional, Sequence, Union

import dgl
import torch

from .batch import TableRows
from .depth import DepthController
from .config import (check_mode, check_positive_int, check_priority, check_staleness, optional_seed, resolve_device,
                     resolve_pin, table_mode)
from .embedding import ITERATING, NodeEmbedding
from .gather import gather_rows, release_all
from .handout import hand_out
from .pipeline import TablePipeline
from .sampling import batch_seed, epoch_generator, reproducible
from .stage import Worker
from .staleness import make_rule
from .stats import LoaderStats
from .store import check_ids

AUTO_MAX_PREFETCH = 4  # the deepest pipeline prefetch="auto" tries
_IGNORED_DGL_KWARGS = ("use_uva", "persistent_workers", "pin_prefetcher", "use_prefetch_thread",
                       "use_alternate_streams", "gpu_cache", "prefetch_factor")


class DataLoader:
    """``DataLoader(graph, indices, graph_sampler, embeddings=[emb, ...], mode="oac", device=None, ...)``.

    Yields exactly what ``dgl.dataloading.DataLoader`` yields for ``graph_sampler`` and, for each embedding,
    its rows for the batch's input nodes as ``blocks[0].srcdata[emb.name]`` (float32[n, D], ``device``,
    requires grad); with no blocks (a zero-layer sampler) as ``ndata[emb.name]`` of the pair graphs.
    The sparse optimizer's ``step()`` commits exactly those rows.

    ``staleness`` (``mode="async"`` only): ``None`` (naive async), ``"gap"`` (Gap-Aware) or ``"lookahead"``
    (DANA-style), rules for stale rows that are not exact either (:mod:`dgl_oac.staleness`).

    ``background_priority``: ``"idle"`` (Linux ``SCHED_IDLE``, why: :func:`dgl_oac.stage.set_thread_priority`)
    or ``"normal"``; the time the caller spends waiting for the gather shows in ``stats.seconds["wait"]``.
    """

    def __init__(self, graph: dgl.DGLGraph, indices: torch.Tensor, graph_sampler: Any,
                 embeddings: Sequence[NodeEmbedding] = (), mode: str = "oac", device: Any = None,
                 batch_size: int = 1, shuffle: bool = False, drop_last: bool = False, num_workers: int = 0,
                 seed: Optional[int] = None, prefetch: Union[int, str] = "auto",
                 writeback_depth: Optional[int] = None,
                 pin: Any = "auto", check_finite: bool = True, background_priority: str = "idle",
                 staleness: Optional[str] = None, **kwargs: Any) -> None:
        for key in list(kwargs):
            if key in _IGNORED_DGL_KWARGS:
                warnings.warn(f"DataLoader({key}=...) is a dgl.dataloading option that dgl_oac ignores",
                              stacklevel=2)
                kwargs.pop(key)
        if kwargs:
            raise TypeError(f"unknown DataLoader option(s): {', '.join(sorted(kwargs))}")
        if num_workers:
            raise ValueError("num_workers > 0 is not supported: dgl_oac samples on the calling thread, the only "
                             "place DGL's sampling is reproducible; gather, copy and write-back already run on "
                             "background threads")
        if not isinstance(graph, dgl.DGLGraph):
            raise TypeError(f"graph must be a dgl.DGLGraph, got {type(graph).__name__}")
        if graph.idtype != torch.int64:
            raise TypeError(f"graph has idtype {graph.idtype}; dgl_oac uses int64 node ids throughout: pass "
                            f"graph.long()")
        if isinstance(indices, dict):
            raise TypeError("heterogeneous indices (a dict) are not supported yet; pass an int64 tensor")
        self.graph, self.graph_sampler = graph, graph_sampler
        self.mode = check_mode(mode)
        self.staleness = check_staleness(staleness, self.mode)
        self.table_mode = table_mode(self.mode, self.staleness)  # what the tables are told (log or deltas)
        self.device = resolve_device("cpu" if device is None else device)
        self.pin = resolve_pin(pin, self.device)
        self.batch_size = check_positive_int("batch_size", batch_size)
        self.auto_depth = prefetch == "auto"  # depth chosen online in 0..AUTO_MAX_PREFETCH (dgl_oac.depth)
        self.prefetch = AUTO_MAX_PREFETCH if self.auto_depth else check_positive_int("prefetch", prefetch)
        self._depth = DepthController([0, self.prefetch]) if self.auto_depth else None
        self.writeback_depth = check_positive_int(
            "writeback_depth", max(2, self.prefetch) if writeback_depth is None else writeback_depth)
        self.shuffle, self.drop_last, self.check_finite = bool(shuffle), bool(drop_last), bool(check_finite)
        self.background_priority = check_priority(background_priority)
        self.seed = optional_seed(seed)
        self.indices = torch.as_tensor(indices)
        self.embeddings = list(embeddings)
        self._check_inputs()
        self._rules = [make_rule(self.staleness, e) for e in self.embeddings] if self.staleness else []
        self._stats = LoaderStats()
        self._epoch, self._start = 0, 0
        # the current epoch, weakly: a loop left without close() frees it at once (refcount, no cycle), and
        # its finalizer stops its threads; its progress outlives it for state_dict() and the next iter()
        self._iter: "Optional[weakref.ref[_Epoch]]" = None
        self._progress: Optional[_Progress] = None

    def _check_inputs(self) -> None:
        is_edge = hasattr(self.graph_sampler, "negative_sampler") or getattr(
            self.graph_sampler, "samples_edges", False)
        bound = self.graph.num_edges() if is_edge else self.graph.num_nodes()
        check_ids(self.indices, bound, "indices (" + ("edge" if is_edge else "node") + " ids)")
        names = [e.name for e in self.embeddings]
        if len(set(names)) != len(names):
            raise ValueError(f"embedding names must be unique, got {names}")
        for emb in self.embeddings:
            if not isinstance(emb, NodeEmbedding):
                raise TypeError(f"embeddings must be dgl_oac.NodeEmbedding, got {type(emb).__name__}")
            if emb.num_embeddings != self.graph.num_nodes():
                raise ValueError(f"NodeEmbedding {emb.name!r} has {emb.num_embeddings} rows but the graph has "
                                 f"{self.graph.num_nodes()} nodes")

    @property
    def stats(self) -> LoaderStats:
        """Counters and per-stage seconds (``writeback``: busy time of the embeddings' write-back threads)."""
        self._stats.seconds["writeback"] = sum(e.pipeline.writeback_seconds() for e in self.embeddings)
        if self._depth is not None:
            self._stats.depths = dict(self._depth.chosen)
        return self._stats

    def __len__(self) -> int:
        n = self.indices.numel()
        return n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)

    def __iter__(self) -> Iterator[Any]:
        p = self._progress
        if p is not None and not p.finished:
            if p.handed > p.start:  # an abandoned epoch counts as done, as in torch
                self._epoch, self._start = p.epoch + 1, 0
            else:  # iter() again before any next() (tqdm.auto does this) starts the same epoch, same place
                self._epoch, self._start = p.epoch, p.start
        self.close()
        for emb in self.embeddings:
            emb.pipeline.prepare(self.device, self.pin, self.table_mode)
        epoch, start = self._epoch, self._start
        self._start = 0
        it = _Epoch(self, epoch, start)
        self._iter, self._progress = weakref.ref(it), it.progress
        return it

    # --- resume ---------------------------------------------------------------------------------------------
    def state_dict(self) -> Dict[str, int]:
        """Where the next run resumes: ``{"seed", "epoch", "position"}``. ``position`` counts the epoch's batches
        that are done: committed, skipped by a failed ``step()`` (non-finite), or released without a gradient
        (their leaf died); a batch handed out and still held but not yet stepped is not done (a resumed run
        hands it out again)."""
        p = self._progress
        if p is not None and not p.finished:  # with no embeddings nothing is committed: handed out is done
            waiting = sum(1 for b in self.embeddings[0].pipeline.pending() if b.on_commit is p.on_commit) \
                if self.embeddings else 0
            return {"seed": self.seed, "epoch": p.epoch, "position": p.handed - waiting}
        return {"seed": self.seed, "epoch": self._epoch, "position": self._start}

    def load_state_dict(self, state: Dict[str, int]) -> None:
        self.close()
        self.seed, self._epoch, self._start = int(state["seed"]), int(state["epoch"]), int(state["position"])

    def close(self) -> None:
        """End the current epoch: stop its threads (queued write-backs applied first). Idempotent. Batches
        already handed out stay with their tables: a later ``step()`` still commits them."""
        it = None if self._iter is None else self._iter()
        if it is not None:
            it.close()
        self._iter, self._progress = None, None

    def __enter__(self) -> "DataLoader":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _count_commit(stats: LoaderStats, batch: TableRows, seconds: float, repatched: int) -> None:
    """The hook a loader's batches carry: counts their commits, also after the epoch ended (``list(loader)``)."""
    stats.committed += 1
    stats.seconds["commit"] += seconds
    stats.rows_repatched_at_commit += repatched


@dataclass
class _Progress:
    """An epoch's position, kept by its loader beyond the epoch's life."""

    epoch: int
    start: int
    handed: int
    on_commit: Any  # the hook its batches carry: tells its pending batches apart
    finished: bool = False


class _EpochResources:
    """What an epoch gives back however it ends: its gather thread, the reads of batches gathered but not
    handed out, its write-back leases. Holds no reference to the epoch (the epoch's finalizer closes it)."""

    def __init__(self, tables: List[TablePipeline]) -> None:
        self.tables = tables
        self.worker: Optional[Worker] = None
        self.leased: List[TablePipeline] = []
        self._open: Dict[int, List[TableRows]] = {}  # batch index -> its gathered rows, not handed out
        self._lock = threading.Lock()  # the gather thread adds reads while close() may run on the caller
        self.closed = False

    def start(self, name: str, depth: int, priority: str, seconds: Dict[str, float]) -> None:
        self.worker = Worker(name, functools.partial(_gather_batch, self, seconds), depth, depth, priority=priority)

    def lease(self, mode: str, writeback_depth: int, priority: str, steps_in_flight: int) -> None:
        """Reading ahead: the tables' write-back threads (and oac write logs) run."""
        if not self.leased:
            for t in self.tables:
                t.lease(mode, writeback_depth, priority, steps_in_flight)
                self.leased.append(t)

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
            worker, self.worker = self.worker, None
            held, self._open = list(self._open.values()), {}
        try:
            if worker is not None:
                worker.close()
            for rows in held:
                release_all(self.tables, rows)
        finally:
            self.give_back()


def _gather_batch(res: _EpochResources, seconds: Dict[str, float], item: Any) -> Any:
    """Gather thread: ``(b, sampler output)`` -> ``(b, sampler output, rows per table)``."""
    b, result = item
    rows = gather_rows(res.tables, input_nodes_of(result), seconds)
    if not res.hold(b, rows):
        release_all(res.tables, rows)
        return None
    return b, result, rows


class _Epoch:
    """One pass over the indices: the caller-side half of the schedule in the module docstring."""

    def __init__(self, loader: DataLoader, epoch: int, start: int) -> None:
        self.loader, self.epoch = loader, epoch
        n = loader.indices.numel()
        order = torch.randperm(n, generator=epoch_generator(loader.seed, epoch)) if loader.shuffle else None
        self.order = loader.indices if order is None else loader.indices[order]
        self.num_batches = len(loader)
        self.next_sample = self.handed = self.start = start
        self.finished = False
        self.closed = False  # a closed epoch (loader.close(), an error, the end) hands out nothing more
        self.embeddings = loader.embeddings
        self.tables = [e.pipeline for e in loader.embeddings]
        self.on_commit = functools.partial(_count_commit, loader._stats)  # one object per epoch (its tag)
        self.progress = _Progress(epoch, start, start, self.on_commit)
        self.res = _EpochResources(self.tables)
        self._finalizer = weakref.finalize(self, self.res.close)
        self._sample_error: Optional[BaseException] = None  # raised when its batch is due, not when sampled ahead
        self.last_input_nodes: Optional["weakref.ref[torch.Tensor]"] = None  # of the batch handed out last
        self._last_handout: Optional[float] = None
        self.depth = 0
        if loader.mode != "sync" and self.tables:
            try:
                self.res.start(f"dgl-oac-gather-e{epoch}", loader.prefetch + 1, loader.background_priority,
                               loader._stats.seconds)
                self._set_depth(self._next_depth())
            except BaseException:
                self.res.close()
                raise
        ITERATING.add(self)

    def _next_depth(self) -> int:
        ctl = self.loader._depth
        return self.loader.prefetch if ctl is None else ctl.depth()

    def _set_depth(self, depth: int) -> None:
        """Reading ahead leases the tables' write-back threads and logs; depth 0 gives them back once the
        batches read ahead are handed out (see ``__next__``)."""
        self.depth = depth
        if depth > 0:
            loader = self.loader
            self.res.lease(loader.table_mode, loader.writeback_depth, loader.background_priority,
                           loader.prefetch + loader.writeback_depth + 2)

    def _sample(self, b: int) -> Any:
        t0 = time.perf_counter()
        seeds = self.order[b * self.loader.batch_size:(b + 1) * self.loader.batch_size]
        with torch.profiler.record_function("dgl_oac.sample"), reproducible(batch_seed(self.loader.seed,
                                                                                      self.epoch, b)):
            result = self.loader.graph_sampler.sample(self.loader.graph, seeds)
        self.loader._stats.seconds["sample"] += time.perf_counter() - t0
        return b, result

    def __iter__(self) -> "_Epoch":
        return self

    def __next__(self) -> Any:
        if self.finished or self.closed:
            raise StopIteration
        if self.handed >= self.num_batches:
            self._finish()
            raise StopIteration
        rows: List[TableRows] = []
        loader = self.loader
        try:
            worker = self.res.worker
            if worker is not None and self.next_sample == self.handed and self.depth == 0:
                worker = None  # nothing in flight and depth 0: sync's code path (no write-back thread, no log)
                self.res.give_back()
            if worker is None:
                b, result = self._sample(self.handed)
                self.next_sample = max(self.next_sample, self.handed + 1)
                for t in self.tables:
                    t.flush()  # read after every committed step is in the table
                rows = gather_rows(self.tables, input_nodes_of(result), loader._stats.seconds) if self.tables else []
            else:
                last = min(self.handed + self.depth, self.num_batches - 1)
                while self.next_sample <= last and self._sample_error is None:
                    try:
                        item = self._sample(self.next_sample)
                    except Exception as exc:  # noqa: BLE001 - the batches before it are handed out first
                        self._sample_error = exc
                        break
                    worker.submit(item)
                    self.next_sample += 1
                if self._sample_error is not None and self.next_sample == self.handed:
                    raise self._sample_error
                in_flight = self.next_sample - self.handed
                if in_flight > loader.prefetch + 1:
                    raise RuntimeError(f"{in_flight} batches in flight with prefetch={loader.prefetch}")
                loader._stats.max_in_flight = max(loader._stats.max_in_flight, in_flight - 1)
                t0 = time.perf_counter()
                with torch.profiler.record_function("dgl_oac.wait"):
                    b, result, rows = worker.result()
                loader._stats.seconds["wait"] += time.perf_counter() - t0
                self.res.take(b)
            if b != self.handed:
                raise RuntimeError(f"batch {b} arrived in place of batch {self.handed}")
            out = hand_out(result, rows, self.embeddings, loader.mode, loader.device, loader.check_finite,
                           loader._stats, self.on_commit, loader._rules)
        except BaseException:
            release_all(self.tables, rows)  # a batch that was not handed out (idempotent for registered ones)
            self.close()
            raise
        self.handed += 1
        self.progress.handed = self.handed
        loader._stats.batches += 1
        self._pace()
        first = out[0] if isinstance(out, tuple) and out else None
        self.last_input_nodes = weakref.ref(first) if isinstance(first, torch.Tensor) else None
        return out

    def _pace(self) -> None:
        """prefetch="auto": feed the caller's seconds per batch to the depth controller, apply its choice."""
        ctl = self.loader._depth
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
        self.loader._epoch, self.loader._start = self.epoch + 1, 0

    def close(self) -> None:
        """End the epoch (see the module docstring). Idempotent."""
        self.closed = True
        ITERATING.discard(self)
        self.res.close()


def input_nodes_of(result: Any) -> torch.Tensor:
    """A DGL sampler's ``input_nodes`` (first element of its tuple), homogeneous graphs only."""
    ids = result[0]
    if isinstance(ids, dict):
        raise TypeError("heterogeneous batches are not supported yet (input_nodes is a dict)")
    return ids
