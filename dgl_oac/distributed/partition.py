"""Who owns a row: contiguous ranges of rows, one per rank (DGL's range partition policy), its single writer.

Rank ``r`` owns rows ``[starts[r], starts[r + 1])``: by default ``ceil(N / world)`` rows each, in rank order (the
last ranks may own fewer, or none); a DistGraph's partition book may give other bounds. The owner holds the
row's value and optimizer state and is the only rank that runs the optimizer on it, so each row's updates happen
in one place, in step order. Which rank owns a row changes no result: an owner adds the trainers' gradients in
rank order, whoever it is (:meth:`dgl_oac.engine.step.StepPlan.combine`).

Why ranges and not ``id % world``: a rank's rows are one block, so a sharded table stores them as one tensor
(local row = ``id - starts[r]``), a checkpoint records them as one chunk (N trainers' chunks reshard to M with
``torch.distributed.checkpoint``), and a graph partitioned by ranges (DGL's DistGraph relabels nodes so) reads
its own nodes' rows locally.
"""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import torch


class RowPartition:
    """``world`` owners of ``num_rows`` rows; ``starts``: ``int64[world + 1]``, ``starts[0] = 0``,
    ``starts[world] = num_rows``, non-decreasing (default: even ranges)."""

    def __init__(self, num_rows: int, world: int, starts: Optional[Sequence[int]] = None) -> None:
        if world < 1:
            raise ValueError(f"a partition needs world >= 1, got {world}")
        if starts is None:
            per = -(-num_rows // world)
            starts = [min(r * per, num_rows) for r in range(world + 1)]
        bounds = torch.as_tensor(list(starts), dtype=torch.int64)
        if (bounds.numel() != world + 1 or int(bounds[0]) != 0 or int(bounds[-1]) != num_rows
                or bool((bounds[1:] < bounds[:-1]).any())):
            raise ValueError(f"row partition bounds must rise from 0 to {num_rows} in {world + 1} entries, got "
                             f"{bounds.tolist()}")
        self.num_rows, self.world, self.starts = int(num_rows), int(world), bounds

    def owner_of(self, ids: torch.Tensor) -> torch.Tensor:
        """``int64[n]``: the owning rank of each of ``ids: int64[n]``."""
        return torch.bucketize(ids, self.starts[1:], right=True)

    def range_of(self, rank: int) -> Tuple[int, int]:
        """``(lo, hi)``: ``rank`` owns rows ``lo <= id < hi``."""
        return int(self.starts[rank]), int(self.starts[rank + 1])

    def by_owner(self, ids: torch.Tensor, owner: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, List[int]]:
        """``(order: int64[n], counts)``: ``ids[order]`` lists the rows of rank 0, then rank 1, ... (stable: each
        owner's rows keep their order), ``counts[r]`` of them for rank ``r``. ``owner``: ``owner_of(ids)``, if the
        caller has it already."""
        owner = self.owner_of(ids) if owner is None else owner
        order = torch.argsort(owner, stable=True)
        return order, torch.bincount(owner, minlength=self.world).tolist()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RowPartition) and torch.equal(self.starts, other.starts)

    def __repr__(self) -> str:
        return f"RowPartition(num_rows={self.num_rows}, starts={self.starts.tolist()})"
