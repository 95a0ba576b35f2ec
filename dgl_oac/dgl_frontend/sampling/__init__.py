"""Reproducible sampling with DGL's samplers (the seeds themselves: :mod:`dgl_oac.sampling`, no DGL).

Measured with DGL 1.1.3: ``dgl.seed`` does not make ``NeighborSampler`` reproducible when DGL's OpenMP pool has
more than one thread, nor in any thread but the one that seeded; DGL's negative samplers draw from torch's
global CPU generator, which other threads may also draw from. So the loader samples every batch on the
calling thread, inside :func:`reproducible`, which (1) seeds DGL's RNG and torch's CPU generator with a seed
derived from ``(seed, epoch, batch)``, (2) runs DGL's OpenMP with one thread, (3) restores the caller's torch
RNG state and thread count afterwards, so the user's own randomness (dropout, init) is untouched, and leaves
DGL's RNG reseeded from its own stream (it has no state getter: see :func:`reproducible`). Importing this module
fixes the importing thread's DGL RNG stream before user code can race for it (:func:`_claim_dgl_stream`). The
batch stream is then a pure function of ``seed``, whatever the other threads do, in every process, and any
batch can be re-made alone (which is what mid-epoch resume uses).
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

import dgl
from dgl.utils import get_num_threads, set_num_threads

from ...sampling import batch_seed, batch_seeds, epoch_generator, torch_seeded

_SEEDS = 1 << 31  # dgl.seed takes a C int


def _claim_dgl_stream() -> None:
    """Give the calling thread its DGL RNG stream now, alone (DGL's RNG is reseeded from itself).

    DGL 1.1.3 seeds each thread's engine with stream number k, k counting the threads in the order of their
    first ``dgl.seed``. When the first ``dgl.seed`` of a process runs on DGL's OpenMP pool (a user's
    ``dgl.seed(0)`` with the default 2 threads, as DGL's examples start), which thread becomes k = 0 is a race,
    and in some processes the thread that later samples under :func:`reproducible` draws another stream: every
    batch differs (measured: 3 of 8 fresh processes, ``scripts/repro_nondeterminism.py --user-dgl-seed 0``).
    Run at import, before user code seeds DGL, this fixes the importing thread's number. (A process that ran
    ``dgl.seed`` on several threads before importing dgl_oac has already raced: import dgl_oac first.)
    """
    threads = get_num_threads()
    set_num_threads(1)
    try:
        dgl.seed(int(dgl.random.choice(_SEEDS, 1)))
    finally:
        set_num_threads(threads)


_claim_dgl_stream()


@contextlib.contextmanager
def reproducible(seed: int) -> Iterator[None]:
    """Run DGL sampling deterministically for ``seed`` without disturbing the caller's torch RNG or threads.

    torch's CPU generator and DGL's thread count are restored on exit. DGL's RNG cannot be: DGL 1.1.3 has no
    getter for its state. Left seeded with ``seed``, the caller's own DGL random calls (``dgl.rand_graph``,
    ``dgl.sampling.random_walk``) would be a function of the loader's batch seed. So on exit it is reseeded
    (every OpenMP thread's engine) with a number drawn from it on entry: a different stream from the one DGL
    would have continued, but a function of DGL's state before the block (reproducible from the caller's
    ``dgl.seed``), never of ``seed``, and a new one after every block.
    """
    threads = get_num_threads()
    resume = int(dgl.random.choice(_SEEDS, 1))  # from the caller's stream, before dgl.seed replaces it
    set_num_threads(1)
    dgl.seed(seed)
    try:
        with torch_seeded(seed):
            yield
    finally:
        set_num_threads(threads)
        dgl.seed(resume)  # after restoring the thread count: dgl.seed reseeds one engine per OpenMP thread


def sample_batch(graph: dgl.DGLGraph, sampler: Any, seeds_of: Callable[[int], Any], seed: int, epoch: int,
                 index: int) -> Any:
    """Batch ``index`` of ``epoch``: ``sampler.sample(graph, seeds_of(index))`` under :func:`reproducible` with
    its :func:`batch_seed`. The only place dgl-oac samples (the calling thread, or a worker process:
    :mod:`dgl_oac.dgl_frontend.sampling.workers`)."""
    seeds = seeds_of(index)
    with reproducible(batch_seed(seed, epoch, index)):
        return sampler.sample(graph, seeds)


__all__ = ["reproducible", "sample_batch", "batch_seed", "batch_seeds", "epoch_generator"]
