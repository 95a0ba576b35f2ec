"""Batch seeds and negatives, graph-agnostic (no DGL): what a loader derives from ``(seed, epoch, batch)``, and
the negative samplers (:mod:`.negative`) that DGL's samplers (:mod:`dgl_oac.dgl_frontend.sampling`) and the KG
task's edge batches (:mod:`dgl_oac.sampling.edge_batch`) share.

Every batch's randomness is a pure function of ``(seed, epoch, batch)``: :func:`batch_seed` mixes the three,
:func:`epoch_generator` shuffles an epoch, :func:`torch_seeded` draws from torch's CPU generator under a batch's
seed and restores the caller's state (DGL's own RNG as well: :func:`dgl_oac.dgl_frontend.sampling.reproducible`).
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

import numpy as np
import torch


def batch_seed(seed: int, epoch: int, index: int) -> int:
    """A well-mixed 31-bit seed for batch ``index`` (-1: the epoch's shuffle) of ``epoch``."""
    words = [seed & 0xFFFFFFFF, epoch & 0xFFFFFFFF, (index + 1) & 0xFFFFFFFF]
    return int(np.random.SeedSequence(words).generate_state(1)[0] >> 1)


def epoch_generator(seed: int, epoch: int) -> torch.Generator:
    """The generator that shuffles ``epoch``'s indices."""
    return torch.Generator().manual_seed(batch_seed(seed, epoch, -1))


@contextlib.contextmanager
def torch_seeded(seed: int) -> Iterator[None]:
    """Run a block with torch's CPU generator seeded with ``seed``; the caller's state is restored on exit (CPU
    only: ``torch.manual_seed`` would also reseed CUDA generators)."""
    cpu_gen = torch.default_generator
    saved = cpu_gen.get_state()
    cpu_gen.manual_seed(seed)
    try:
        yield
    finally:
        cpu_gen.set_state(saved)


def batch_seeds(order: torch.Tensor, batch_size: int, to_seeds: Callable[[torch.Tensor], Any], index: int) -> Any:
    """Batch ``index``'s seeds: ``to_seeds(order[index * batch_size:(index + 1) * batch_size])`` (``order``:
    int64[N], CPU, the epoch's shuffled indices; ``to_seeds`` makes a heterograph's ``{type: ids}``)."""
    return to_seeds(order[index * batch_size:(index + 1) * batch_size])
