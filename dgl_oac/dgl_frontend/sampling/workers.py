"""Sampling in worker processes (``DataLoader(num_workers=n)``), with the batch stream of ``num_workers=0``.

Each batch ``b`` of an epoch is :func:`dgl_oac.dgl_frontend.sampling.sample_batch`, under its own seed
``batch_seed(seed, epoch, b)`` with one OpenMP thread: exactly the call the caller makes itself when
``num_workers=0``. The processes, their order and how they end are :class:`dgl_oac.loading.workers.BatchWorkers`';
here is what DGL needs of them: a graph on the CPU whose sparse formats are built before the fork (as DGL does,
so no worker rebuilds them in its copy-on-write memory every epoch), and no ``DistGraph`` (its RPC client lives
in this process and is not fork-safe).
"""
from __future__ import annotations

import functools
from typing import Any, Callable

import dgl

from ...loading.workers import BatchWorkers
from . import sample_batch


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


def sample_workers(graph: Any, sampler: Any, seeds_of: Callable[[int], Any], seed: int, epoch: int, start: int,
                   num_batches: int, num_workers: int, in_flight: int) -> BatchWorkers:
    """Worker processes sampling an epoch's batches ``start .. num_batches - 1`` in order. graph: DGLGraph on
    the CPU; ``seeds_of(b)``: batch ``b``'s seeds (:func:`dgl_oac.sampling.batch_seeds`)."""
    graph.create_formats_()
    return BatchWorkers(functools.partial(sample_batch, graph, sampler, seeds_of, seed, epoch), epoch, start,
                        num_batches, num_workers, in_flight)


__all__ = ["check_num_workers", "sample_workers"]
