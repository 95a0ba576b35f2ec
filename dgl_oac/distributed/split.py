"""``DataLoader(..., use_ddp=True)``: each rank's share of the indices, as DGL 1.1.3's ``use_ddp`` splits them.

DGL (``DDPTensorizedDataset``) gives rank r the contiguous block ``[r * m, (r + 1) * m)`` of the indices, with
``m = ceil(n / world)`` (``floor`` with ``drop_last``): disjoint blocks of one length, so every rank takes
the same number of steps, which the collective ``step()`` needs. A block that runs past the end (the last
ranks, without ``drop_last``) is padded, after each epoch's shuffle, with the first indices of its own shuffled
order. Each epoch reshuffles the block (here from the loader's ``seed`` and the epoch, so a run is
reproducible; DGL draws from numpy's global RNG).
"""
from __future__ import annotations

import math
from typing import Tuple

import torch
import torch.distributed as dist


def rank_block(indices: torch.Tensor, drop_last: bool) -> Tuple[torch.Tensor, int]:
    """``(this rank's real indices: int64[k], the length every rank's epoch has)``. Needs an initialised
    ``torch.distributed`` (a world of one keeps every index)."""
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError("DataLoader(use_ddp=True) needs torch.distributed.init_process_group() first")
    rank, world = dist.get_rank(), dist.get_world_size()
    n = indices.numel()
    per_rank = n // world if drop_last else math.ceil(n / world)
    if per_rank == 0:
        raise ValueError(f"use_ddp: {n} indices cannot give each of {world} ranks at least one (drop_last="
                         f"{drop_last})")
    return indices[rank * per_rank:(rank + 1) * per_rank], per_rank


def pad_order(order: torch.Tensor, length: int) -> torch.Tensor:
    """``order`` (an epoch's shuffled block) padded to ``length`` with its own first entries."""
    missing = length - order.numel()
    return order if missing <= 0 else torch.cat([order, order[:missing]])
