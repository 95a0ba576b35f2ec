"""Reproducible sampling.

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
import numpy as np
import torch
from dgl.utils import get_num_threads, set_num_threads

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


def batch_seed(seed: int, epoch: int, index: int) -> int:
    """A well-mixed 31-bit seed for batch ``index`` (-1: the epoch's shuffle) of ``epoch``."""
    words = [seed & 0xFFFFFFFF, epoch & 0xFFFFFFFF, (index + 1) & 0xFFFFFFFF]
    return int(np.random.SeedSequence(words).generate_state(1)[0] >> 1)


def epoch_generator(seed: int, epoch: int) -> torch.Generator:
    """The generator that shuffles ``epoch``'s indices."""
    return torch.Generator().manual_seed(batch_seed(seed, epoch, -1))


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
    cpu_gen = torch.default_generator
    saved = cpu_gen.get_state()
    resume = int(dgl.random.choice(_SEEDS, 1))  # from the caller's stream, before dgl.seed replaces it
    set_num_threads(1)
    dgl.seed(seed)
    cpu_gen.manual_seed(seed)  # CPU only: torch.manual_seed would also reseed CUDA generators
    try:
        yield
    finally:
        cpu_gen.set_state(saved)
        set_num_threads(threads)
        dgl.seed(resume)  # after restoring the thread count: dgl.seed reseeds one engine per OpenMP thread


def batch_seeds(order: torch.Tensor, batch_size: int, to_seeds: Callable[[torch.Tensor], Any], index: int) -> Any:
    """Batch ``index``'s seeds: ``to_seeds(order[index * batch_size:(index + 1) * batch_size])`` (``order``:
    int64[N], CPU, the epoch's shuffled indices; ``to_seeds`` makes a heterograph's ``{type: ids}``)."""
    return to_seeds(order[index * batch_size:(index + 1) * batch_size])


def sample_batch(graph: dgl.DGLGraph, sampler: Any, seeds_of: Callable[[int], Any], seed: int, epoch: int,
                 index: int) -> Any:
    """Batch ``index`` of ``epoch``: ``sampler.sample(graph, seeds_of(index))`` under :func:`reproducible` with
    its :func:`batch_seed`. The only place dgl-oac samples (the calling thread, or a worker process:
    :mod:`dgl_oac.sampling.workers`)."""
    seeds = seeds_of(index)
    with reproducible(batch_seed(seed, epoch, index)):
        return sampler.sample(graph, seeds)
