"""Who owns a row: rank ``id % world`` (DGL's rule), its single writer.

The owner holds the row's value and optimizer state (in the shared table on one machine) and is the only rank
that runs the optimizer on it, so each row's updates happen in one place, in step order.
"""
from __future__ import annotations

from typing import List, Tuple

import torch


def owner_of(ids: torch.Tensor, world: int) -> torch.Tensor:
    """``int64[n]``: the owning rank of each of ``ids: int64[n]``."""
    return torch.remainder(ids, world)


def by_owner(ids: torch.Tensor, world: int) -> Tuple[torch.Tensor, List[int]]:
    """``(order: int64[n], counts)``: ``ids[order]`` lists the rows of rank 0, then rank 1, ... (stable: each
    owner's rows keep their order), ``counts[r]`` of them for rank ``r``."""
    owner = owner_of(ids, world)
    order = torch.argsort(owner, stable=True)
    return order, torch.bincount(owner, minlength=world).tolist()
