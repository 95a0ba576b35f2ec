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

Batches in flight (sampled, not yet handed out) never exceed k. Each batch is sampled under its own seed with
one OpenMP thread (:func:`dgl_oac.sampling.sample_batch`): on the caller's thread, or with ``num_workers > 0``
in worker processes forked at the epoch's start (:mod:`dgl_oac.sampling.workers`; "sample i+k" above then
takes the workers' result in order). The batch stream is a function of ``seed`` alone, identical in every
mode, at every depth and for any ``num_workers``.

Lifetimes. An epoch (one ``iter(loader)``) owns its gather thread, the reads of batches gathered but not handed
out, and a lease on each table's write-back thread. All of them end when the epoch ends: at its last batch,
``loader.close()``, an exception in ``next()``, a new ``iter(loader)``, or when the epoch is garbage (a
``break`` and the loader dropped); the last lease applies every queued step before its thread stops. Batches
already handed out belong to their tables (:mod:`dgl_oac.engine.pipeline`), not to the epoch: a ``step()`` after the
epoch ended still commits them (``list(loader)``), written through.
"""
from __future__ import annotations

import functools
import math
import time
import warnings
import weakref
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Optional, Union

import dgl
import torch

from .engine.batch import TableRows
from .engine.depth import DepthController
from .distributed.split import pad_order, rank_block
from .config import (check_mode, check_positive_int, check_priority, check_staleness, optional_seed, resolve_device,
                     resolve_pin, table_mode)
from .embedding import ITERATING
from .engine.epoch_resources import EpochResources
from .engine.gather import gather_rows, release_all
from .engine.handout import hand_out
from .hetero import bind_inputs
from .inputs import Embeddings
from .sampling import batch_seeds, epoch_generator, sample_batch
from .sampling.workers import SampleWorkers, check_num_workers
from .baselines.staleness import make_rule
from .engine.stats import LoaderStats
from .engine.structure import StructureCopy, dgl_has_cuda, dgl_stream_options, resolve_structure

AUTO_MAX_PREFETCH = 4  # the deepest pipeline prefetch="auto" tries
_IGNORED_DGL_KWARGS = ("ddp_seed", "use_uva", "persistent_workers", "use_prefetch_thread", "gpu_cache",
                       "prefetch_factor")


class DataLoader:
    """``DataLoader(graph, indices, graph_sampler, embeddings=[emb, ...], mode="oac", device=None, ...)``.

    Yields exactly what ``dgl.dataloading.DataLoader`` yields for ``graph_sampler`` and, for each embedding,
    its rows for the batch's input nodes as ``blocks[0].srcdata[emb.name]`` (float32[n, D], ``device``,
    requires grad); with no blocks (a zero-layer sampler) as ``ndata[emb.name]`` of the pair graphs.
    The sparse optimizer's ``step()`` commits exactly those rows. Heterographs (:mod:`dgl_oac.hetero`):
    ``indices={type: ids}``, ``embeddings={ntype: emb}``, rows at ``blocks[0].srcdata[emb.name][ntype]``.

    ``graph`` may be a ``dgl.distributed.DistGraph``: its servers sample each batch, on the caller's thread
    (:mod:`dgl_oac.distributed.distgraph`).

    ``use_ddp=True`` (after ``torch.distributed.init_process_group``): this rank iterates only its block of
    ``indices``, split as DGL's ``use_ddp`` does (:mod:`dgl_oac.distributed.split`); every rank takes the same
    number of steps.

    ``staleness`` (``mode="async"`` only): ``None`` (naive async), ``"gap"`` (Gap-Aware) or ``"lookahead"``
    (DANA-style), rules for stale rows that are not exact either (:mod:`dgl_oac.baselines.staleness`).

    ``background_priority``: ``"idle"`` (Linux ``SCHED_IDLE``, why: :func:`dgl_oac.engine.stage.set_thread_priority`)
    or ``"normal"``; the time the caller spends waiting for the gather shows in ``stats.seconds["wait"]``.
    ``num_workers``: processes that sample the batches (:mod:`dgl_oac.sampling.workers`; the graph must be on the
    CPU); the batches are the same for any number, 0 samples on the caller's thread.

    On a CUDA ``device`` a batch's graphs, seeds and input nodes are pinned and copied on a side stream by the
    gather thread (:mod:`dgl_oac.engine.structure`). ``structure``: ``"auto"`` hands out DGL's graphs where DGL can
    hold them on the device (a CUDA build of DGL) and otherwise ``"index"``:
    :class:`~dgl_oac.blocks.IndexBlock` / ``IndexGraph`` (index tensors, which the built-in models take).
    DGL's ``pin_prefetcher`` is ``pin``; ``use_alternate_streams=True`` is what dgl_oac does anyway, ``False``
    is refused.
    """

    def __init__(self, graph: Union[dgl.DGLGraph, dgl.distributed.DistGraph], indices: torch.Tensor, graph_sampler: Any,
                 embeddings: Embeddings = (), mode: str = "oac", device: Any = None,
                 batch_size: int = 1, shuffle: bool = False, drop_last: bool = False, num_workers: int = 0,
                 seed: Optional[int] = None, prefetch: Union[int, str] = "auto",
                 writeback_depth: Optional[int] = None,
                 pin: Any = "auto", check_finite: bool = True, background_priority: str = "idle",
                 staleness: Optional[str] = None, use_ddp: bool = False, structure: str = "auto",
                 **kwargs: Any) -> None:
        pin = dgl_stream_options(pin, kwargs)
        for key in list(kwargs):
            if key in _IGNORED_DGL_KWARGS:
                warnings.warn(f"DataLoader({key}=...) is a dgl.dataloading option that dgl_oac ignores",
                              stacklevel=2)
                kwargs.pop(key)
        if kwargs:
            raise TypeError(f"unknown DataLoader option(s): {', '.join(sorted(kwargs))}")
        if not isinstance(graph, (dgl.DGLGraph, dgl.distributed.DistGraph)):
            raise TypeError(f"graph must be a dgl.DGLGraph or a dgl.distributed.DistGraph, got "
                            f"{type(graph).__name__}")
        if graph.idtype != torch.int64:
            raise TypeError(f"graph has idtype {graph.idtype}; dgl_oac uses int64 node ids throughout: pass "
                            f"graph.long()")
        self.graph, self.graph_sampler = graph, graph_sampler
        self.num_workers = check_num_workers(num_workers, graph)
        self.mode = check_mode(mode)
        self.staleness = check_staleness(staleness, self.mode)
        self.table_mode = table_mode(self.mode, self.staleness)  # what the tables are told (log or deltas)
        self.device = resolve_device("cpu" if device is None else device)
        self.pin = resolve_pin(pin, self.device)
        # how batches' graphs reach the device (dgl_oac.engine.structure): DGL's graphs, or index tensors without CUDA DGL
        self.structure = resolve_structure(structure, self.device,
                                           self.device.type == "cuda" and dgl_has_cuda())
        self._structure: Optional[StructureCopy] = None  # made by the first epoch on a device
        self.batch_size = check_positive_int("batch_size", batch_size)
        self.auto_depth = prefetch == "auto"  # depth chosen online in 0..AUTO_MAX_PREFETCH (dgl_oac.engine.depth)
        self.prefetch = AUTO_MAX_PREFETCH if self.auto_depth else check_positive_int("prefetch", prefetch)
        self._depth = DepthController([0, self.prefetch]) if self.auto_depth else None
        self.writeback_depth = check_positive_int(
            "writeback_depth", max(2, self.prefetch) if writeback_depth is None else writeback_depth)
        self.shuffle, self.drop_last, self.check_finite = bool(shuffle), bool(drop_last), bool(check_finite)
        self.background_priority = check_priority(background_priority)
        self.seed = optional_seed(seed)
        self.inputs = bind_inputs(graph, indices, graph_sampler, embeddings)  # heterographs: dgl_oac.hetero
        self.indices, self.embeddings = self.inputs.indices, self.inputs.embeddings
        for emb in self.embeddings:
            if emb.group is not None and self.mode == "async":
                raise ValueError(f"NodeEmbedding {emb.name!r} is trained by {emb.world_size} ranks: mode='async' "
                                 f"is single-process only (use 'oac' or 'sync')")
        # use_ddp: this rank's block of the indices; every rank's epoch has `_epoch_len` of them (padded)
        self.indices, self._epoch_len = rank_block(self.indices, self.drop_last) if use_ddp \
            else (self.indices, self.indices.numel())
        # each table's hook (dgl_oac.engine.hooks): async's staleness rule, the public name made into the hook here
        self._rules = [make_rule(self.staleness, e) for e in self.embeddings] if self.staleness else []
        self._stats = LoaderStats()
        self._epoch, self._start = 0, 0
        # the current epoch, weakly: a loop left without close() frees it at once (refcount, no cycle), and
        # its finalizer stops its threads; its progress outlives it for state_dict() and the next iter()
        self._iter: "Optional[weakref.ref[_Epoch]]" = None
        self._progress: Optional[_Progress] = None

    def _structure_copy(self) -> Optional[StructureCopy]:
        """The batches' structure copy (one side stream, made once), None on the CPU."""
        if self.device.type == "cpu":
            return None
        if self._structure is None:
            self._structure = StructureCopy(self.device, self.structure, self.pin, bool(self.embeddings))
        return self._structure

    @property
    def stats(self) -> LoaderStats:
        """Counters and per-stage seconds (``writeback``: busy time of the embeddings' write-back threads)."""
        self._stats.seconds["writeback"] = sum(e.pipeline.writeback_seconds() for e in self.embeddings)
        if self._depth is not None:
            self._stats.depths = dict(self._depth.chosen)
        return self._stats

    def __len__(self) -> int:
        n = self._epoch_len
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
            # a batch's on_commit is on one table's rows only (the first with rows): each is counted once
            waiting = sum(1 for e in self.embeddings for b in e.pipeline.pending() if b.on_commit is p.on_commit)
            return {"seed": self.seed, "epoch": p.epoch, "position": p.handed - waiting}
        return {"seed": self.seed, "epoch": self._epoch, "position": self._start}

    def load_state_dict(self, state: Dict[str, int]) -> None:
        """Resume at ``state`` (from :meth:`state_dict`): the next ``iter(loader)`` starts at its epoch and
        position, with its seed. Ends the current epoch first."""
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


class _Epoch:
    """One pass over the indices: the caller-side half of the schedule in the module docstring."""

    def __init__(self, loader: DataLoader, epoch: int, start: int) -> None:
        self.loader, self.epoch = loader, epoch
        n = loader.indices.numel()
        order = torch.randperm(n, generator=epoch_generator(loader.seed, epoch)) if loader.shuffle else None
        self.order = pad_order(loader.indices if order is None else loader.indices[order], loader._epoch_len)
        # batch b's seeds; a partial of the loader's inputs, not a method of the epoch (workers must not hold it)
        self.seeds_of = functools.partial(batch_seeds, self.order, loader.batch_size, loader.inputs.seeds)
        self.num_batches = len(loader)
        self.next_sample = self.handed = self.start = start
        self.finished = False
        self.closed = False  # a closed epoch (loader.close(), an error, the end) hands out nothing more
        self.embeddings = loader.embeddings
        self.tables = [e.pipeline for e in loader.embeddings]
        self.on_commit = functools.partial(_count_commit, loader._stats)  # one object per epoch (its tag)
        self.progress = _Progress(epoch, start, start, self.on_commit)
        self.res = EpochResources(self.tables, loader.inputs.table_ids, loader._structure_copy())
        self._finalizer = weakref.finalize(self, self.res.close)
        self._sample_error: Optional[BaseException] = None  # raised when its batch is due, not when sampled ahead
        self.last_input_nodes: Optional["weakref.ref[torch.Tensor]"] = None  # of the batch handed out last
        self._last_handout: Optional[float] = None
        self.depth = 0
        if loader.num_workers:  # forked before this epoch's threads start (dgl_oac.sampling.workers)
            self.res.sampling = SampleWorkers(loader.graph, loader.graph_sampler, self.seeds_of, loader.seed, epoch,
                                              start, self.num_batches, loader.num_workers, 2 * loader.num_workers)
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
        loader = self.loader
        with torch.profiler.record_function("dgl_oac.sample"):
            if self.res.sampling is not None:
                result = self.res.sampling.get(b)
            else:
                result = sample_batch(loader.graph, loader.graph_sampler, self.seeds_of, loader.seed, self.epoch, b)
        loader._stats.seconds["sample"] += time.perf_counter() - t0
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
                rows = gather_rows(self.tables, loader.inputs.table_ids(result), loader._stats.seconds) \
                    if self.tables else []
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
            out = hand_out(result, rows, self.tables, loader.mode, loader.device, loader.check_finite,
                           loader._stats, self.on_commit, loader.inputs.ntypes, loader._rules, self.res.structure)
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

