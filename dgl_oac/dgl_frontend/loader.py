"""``dgl_oac.DataLoader``: DGL's loader, plus the rows of learnable embeddings, pipelined.

The schedule and the lifetimes are :mod:`dgl_oac.loading.epoch`'s; here "pull batch b" samples it
(:class:`~dgl_oac.dgl_frontend.graph_source.GraphSource`, the epoch's source). Each batch is
sampled under its own seed with one OpenMP thread (:func:`dgl_oac.dgl_frontend.sampling.sample_batch`): on the caller's
thread, or with ``num_workers > 0`` in worker processes forked at the epoch's start
(:mod:`dgl_oac.dgl_frontend.sampling.workers`, over :class:`dgl_oac.loading.workers.BatchWorkers`; the pull then
takes the workers' result in order). The batch stream is a
function of ``seed`` alone, identical in every mode, at every depth and for any ``num_workers``.
"""
from __future__ import annotations

import functools
import math
import warnings
from typing import Any, Iterator, Optional, Union

import dgl
import torch

from ..config import check_positive_int, optional_seed
from ..distributed.split import pad_order, rank_block
from ..loading.stats import LoaderStats
from ..tables import Embeddings
from ..loading.base import LoaderBase
from ..loading.settings import LoaderSettings
from .graph_source import GraphSource
from .hetero import bind_inputs
from .sampling import batch_seeds, epoch_generator
from .sampling.workers import check_num_workers, sample_workers
from .structure import StructureCopy, dgl_has_cuda, dgl_stream_options, resolve_structure

_IGNORED_DGL_KWARGS = ("ddp_seed", "use_uva", "persistent_workers", "use_prefetch_thread", "gpu_cache",
                       "prefetch_factor")


#: Where the hazard of sampling workers beside a CUDA device is measured (resolve_num_workers).
CUDA_WORKERS_EVIDENCE = "benchmarks/results/gpu/2026-11-28-h200/README.md"


def resolve_num_workers(num_workers: Optional[int], device: torch.device, graph: Any) -> int:
    """``DataLoader(num_workers=...)``: a count is checked
    (:func:`~dgl_oac.dgl_frontend.sampling.workers.check_num_workers`);
    ``None`` is 0: the caller's thread samples, on every device, as DGL's and torch's loaders do by default.

    Why not worker processes on a CUDA device, where they would take the sampling off the thread that queues
    the device's work: on an H200, workers forked once the process held CUDA pinned memory (any epoch after
    the first, any loader after the first) crashed in DGL's sampler (SIGSEGV, SIGABRT on a corrupt CSR read)
    or sampled different batches, in sync and oac alike: 3 of 24 runs; 0 of 12 with ``num_workers=0``
    (:data:`CUDA_WORKERS_EVIDENCE`). Asked for explicitly on a CUDA device, workers run, with a warning."""
    if num_workers is None:
        return 0
    n = check_num_workers(num_workers, graph)
    if n and device.type == "cuda":
        warnings.warn(f"num_workers={n} on {device}: sampling workers forked after this process holds CUDA "
                      f"pinned memory were seen to crash and to sample wrong batches ({CUDA_WORKERS_EVIDENCE}); "
                      f"num_workers=0 (the default) trains exactly", RuntimeWarning, stacklevel=3)
    return n


class DataLoader(LoaderBase):
    """``DataLoader(graph, indices, graph_sampler, embeddings=[emb, ...], mode="oac", device=None, ...)``.

    Yields exactly what ``dgl.dataloading.DataLoader`` yields for ``graph_sampler`` and, for each embedding,
    its rows for the batch's input nodes as ``blocks[0].srcdata[emb.name]`` (float32[n, D], ``device``,
    requires grad); with no blocks (a zero-layer sampler) as ``ndata[emb.name]`` of the pair graphs.
    The sparse optimizer's ``step()`` commits exactly those rows. Heterographs (:mod:`dgl_oac.dgl_frontend.hetero`):
    ``indices={type: ids}``, ``embeddings={ntype: emb}``, rows at ``blocks[0].srcdata[emb.name][ntype]``.

    ``graph`` may be a ``dgl.distributed.DistGraph``: its servers sample each batch, on the caller's thread
    (:mod:`dgl_oac.dgl_frontend.distgraph`).

    ``use_ddp=True`` (after ``torch.distributed.init_process_group``): this rank iterates only its block of
    ``indices``, split as DGL's ``use_ddp`` does (:mod:`dgl_oac.distributed.split`); every rank takes the same
    number of steps.

    ``staleness`` (``mode="async"`` only): ``None`` (naive async), ``"gap"`` (Gap-Aware) or ``"lookahead"``
    (DANA-style), rules for stale rows that are not exact either (:mod:`dgl_oac.baselines.staleness`).

    ``background_priority``: ``"auto"`` (normal until a window shows no other process busy on our cores, then
    idle for the rest of the epoch), ``"idle"`` (Linux ``SCHED_IDLE``) or ``"normal"``, why:
    :func:`dgl_oac.engine.runtime.set_thread_priority`;
    the time the caller spends waiting for the gather shows in ``stats.seconds["wait"]``.
    ``num_workers``: processes that sample the batches (:mod:`dgl_oac.dgl_frontend.sampling.workers`; the graph must
    be on the CPU); the batches are the same for any number, 0 samples on the caller's thread. ``None`` (the default):
    :func:`resolve_num_workers`: 0, the caller's thread, on every device (on a CUDA device workers warn).

    On a CUDA ``device`` a batch's graphs, seeds and input nodes are pinned and copied on a side stream by the
    gather thread (:mod:`dgl_oac.dgl_frontend.structure`). ``structure``: ``"auto"`` hands out DGL's graphs where DGL
    can hold them on the device (a CUDA build of DGL) and otherwise ``"index"``:
    :class:`~dgl_oac.dgl_frontend.blocks.IndexBlock` / ``IndexGraph`` (index tensors, which the built-in models take).
    DGL's ``pin_prefetcher`` is ``pin``; ``use_alternate_streams=True`` is what dgl_oac does anyway, ``False``
    is refused.

    ``check_finite``: a ``step()`` that would write NaN/Inf raises ``FloatingPointError`` and skips the batch
    (every table as before it). ``None`` (default): on for the CPU, off on a CUDA device, where the check is a
    host sync in every step (:func:`dgl_oac.config.resolve_check_finite`); ``True`` or ``False`` to choose.

    ``attach=False``: the rows are not written into the batch's graphs (a model that iterates
    ``blocks[0].srcdata``, as PinSAGE's ``LinearProjector`` does, sees only the sampler's own data); read them
    with ``emb(input_nodes, device)``, which returns the prefetched rows until the next batch is asked for.
    """

    def __init__(self, graph: Union[dgl.DGLGraph, dgl.distributed.DistGraph], indices: torch.Tensor, graph_sampler: Any,
                 embeddings: Embeddings = (), mode: str = "oac", device: Any = None,
                 batch_size: int = 1, shuffle: bool = False, drop_last: bool = False,
                 num_workers: Optional[int] = None,
                 seed: Optional[int] = None, prefetch: Union[int, str] = "auto",
                 writeback_depth: Optional[int] = None,
                 pin: Any = "auto", check_finite: Optional[bool] = None, background_priority: str = "auto",
                 staleness: Optional[str] = None, use_ddp: bool = False, structure: str = "auto",
                 attach: bool = True, **kwargs: Any) -> None:
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
        settings = LoaderSettings.resolve(mode, device, prefetch, writeback_depth, pin, check_finite,
                                          background_priority, staleness)
        self.num_workers = resolve_num_workers(num_workers, settings.device, graph)
        # how batches' graphs reach the device (dgl_oac.dgl_frontend.structure): DGL's graphs, or index tensors
        # without a CUDA build of DGL
        self.structure = resolve_structure(structure, settings.device,
                                           settings.device.type == "cuda" and dgl_has_cuda())
        self._structure: Optional[StructureCopy] = None  # made by the first epoch on a device
        self.batch_size = check_positive_int("batch_size", batch_size)
        self.shuffle, self.drop_last = bool(shuffle), bool(drop_last)
        self.attach = bool(attach)
        # heterographs: dgl_oac.dgl_frontend.hetero
        self.inputs = bind_inputs(graph, indices, graph_sampler, embeddings)
        super().__init__(settings, self.inputs.embeddings, LoaderStats(mode=settings.mode), optional_seed(seed))
        self.indices = self.inputs.indices
        for emb in self.embeddings:
            if emb.group is not None and settings.mode == "async" and settings.staleness:
                raise ValueError(f"NodeEmbedding {emb.name!r} is trained by {emb.world_size} ranks: staleness="
                                 f"{settings.staleness!r} is single-process only (naive async, staleness=None, runs "
                                 f"with several trainers: stale reads, the N-trainer step on the owners' rows)")
        # use_ddp: this rank's block of the indices; every rank's epoch has `_epoch_len` of them (padded)
        self.indices, self._epoch_len = rank_block(self.indices, self.drop_last) if use_ddp \
            else (self.indices, self.indices.numel())

    def _structure_copy(self) -> Optional[StructureCopy]:
        """The batches' structure copy (one side stream, made once); None on the CPU unless ``structure="index"``
        (index blocks on the CPU: what a CUDA device without DGL's CUDA build gets, testable anywhere)."""
        if self.device.type == "cpu" and self.structure != "index":
            return None
        if self._structure is None:
            self._structure = StructureCopy(self.device, self.structure, self.pin, bool(self.embeddings))
        return self._structure

    def __len__(self) -> int:
        n = self._epoch_len
        return n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)

    def __iter__(self) -> Iterator[Any]:
        epoch, start = self.next_epoch()
        n = self.indices.numel()
        order = torch.randperm(n, generator=epoch_generator(self.seed, epoch)) if self.shuffle else None
        order = pad_order(self.indices if order is None else self.indices[order], self._epoch_len)
        # batch b's seeds; a partial of the loader's inputs, not a method of the epoch (workers must not hold it)
        seeds_of = functools.partial(batch_seeds, order, self.batch_size, self.inputs.seeds)
        sampling = None
        if self.num_workers:  # forked before this epoch's threads start (dgl_oac.dgl_frontend.sampling.workers)
            sampling = sample_workers(self.graph, self.graph_sampler, seeds_of, self.seed, epoch, start, len(self),
                                      self.num_workers, 2 * self.num_workers)
        structure = self._structure_copy()
        source = GraphSource(self, seeds_of, epoch, sampling, structure, self.rules, self._stats)
        return self.start_epoch(source, epoch, start, len(self), structure, sampling)
