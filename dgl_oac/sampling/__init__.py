"""Stage S: reproducible sampling.

Measured with DGL 1.1.3: ``dgl.seed`` does not make ``NeighborSampler`` reproducible when DGL's OpenMP pool has
more than one thread, nor in any thread but the one that seeded; DGL's negative samplers draw from torch's
global CPU generator, which other threads may also draw from. So the loader samples every batch on the
calling thread, inside :func:`reproducible`, which (1) seeds DGL's RNG and torch's CPU generator with a seed
derived from ``(seed, epoch, batch)``, (2) runs DGL's OpenMP with one thread, (3) restores the caller's torch
RNG state and thread count afterwards, so the user's own randomness (dropout, init) is untouched. The batch
stream is then a pure function of ``seed``, whatever the other threads do, and any batch can be re-made alone
(which is what mid-epoch resume uses).
"""
from __future__ import annotations

import contextlib
from typing import Iterator

import dgl
import numpy as np
import torch
from dgl.utils import get_num_threads, set_num_threads


def batch_seed(seed: int, epoch: int, index: int) -> int:
    """A well-mixed 31-bit seed for batch ``index`` (-1: the epoch's shuffle) of ``epoch``."""
    words = [seed & 0xFFFFFFFF, epoch & 0xFFFFFFFF, (index + 1) & 0xFFFFFFFF]
    return int(np.random.SeedSequence(words).generate_state(1)[0] >> 1)


def epoch_generator(seed: int, epoch: int) -> torch.Generator:
    """The generator that shuffles ``epoch``'s indices."""
    return torch.Generator().manual_seed(batch_seed(seed, epoch, -1))


@contextlib.contextmanager
def reproducible(seed: int) -> Iterator[None]:
    """Run DGL sampling deterministically for ``seed`` without disturbing the caller's RNG or threads."""
    threads = get_num_threads()
    cpu_gen = torch.default_generator
    saved = cpu_gen.get_state()
    set_num_threads(1)
    dgl.seed(seed)
    cpu_gen.manual_seed(seed)  # CPU only: torch.manual_seed would also reseed CUDA generators
    try:
        yield
    finally:
        cpu_gen.set_state(saved)
        set_num_threads(threads)
