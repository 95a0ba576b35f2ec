"""Combine one table's reads of a step into one gradient per row: DGL's per-occurrence mean.

``dgl.nn.NodeEmbedding`` records one trace per ``emb(ids)`` call, and ``dgl.optim`` gives each row the mean of
its gradient over EVERY occurrence of it in the step, across and within calls (``unique`` + ``index_add_`` +
divide by the counts). Here the rows of a step live in :class:`~dgl_oac.engine.batch.TableRows` (unique ids, value ‖
state), and each read of them is a leaf with its own gradient (:meth:`TableRows.contributions`): the hand-out
leaf (every row once) or an ``emb(ids)`` call's leaf (positions into the batch, repeats allowed). A row's
gradient is the sum over its occurrences divided by their number; rows no read with a gradient touched are not
updated (as in DGL, whose traces never name them).

Cost: nothing is copied when one leaf covers a batch (a loader step); otherwise one pass over the gradients.
Full-width rows (value ‖ state) are gathered only for unique rows, and only when several batches meet in a
step (gradient accumulation) or a batch was read in part.

Deterministic: sums are accumulated in occurrence order. On CPU ``index_add_`` does that (a serial loop over the
index); on CUDA, where ``index_add_`` with repeated indices uses atomics, the occurrences are sorted (stably)
and summed per segment (``segment_reduce``), then added at unique indices (the segment count costs a host
sync there; the commit's finite check syncs once per step anyway).
"""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F

from .batch import TableRows


def segment_add_(acc: torch.Tensor, pos: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    """``acc[pos[i]] += grad[i]`` for ``acc: float32[n, D]``, ``pos: int64[m]`` (repeats allowed), ``grad:
    float32[m, D]``, all on one device; deterministic on every device (see the module docstring)."""
    if acc.device.type == "cpu":
        return acc.index_add_(0, pos, grad)
    order = torch.argsort(pos, stable=True)
    at, counts = torch.unique_consecutive(pos.index_select(0, order), return_counts=True)
    return acc.index_add_(0, at, torch.segment_reduce(grad.index_select(0, order), "sum", lengths=counts))


def segment_sums(grad: torch.Tensor, order: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """``float32[n, D]``: row ``i`` sums the ``counts[i]`` rows of ``grad: float32[m, D]`` that ``order: int64[m]``
    lists for it (a stable argsort of their positions: occurrence order), all on one device. On CPU one
    ``embedding_bag`` (3-4x faster than ``index_add_``'s serial loop, the same sums in the same order, bitwise)."""
    if grad.device.type == "cpu":
        offsets = torch.cumsum(counts, 0).sub_(counts)
        return F.embedding_bag(order, grad.contiguous(), offsets, mode="sum")
    return torch.segment_reduce(grad.index_select(0, order), "sum", lengths=counts)


def _batch_sums(b: TableRows, dim: int) -> Tuple[torch.Tensor, Optional[torch.Tensor], Optional[torch.Tensor]]:
    """``(sums, counts, keep)`` over ``b``'s leaves with a gradient: ``sums: float32[k, D]`` and ``counts:
    float32[k]`` (None: every row once, ``sums`` is the gradient itself) for the rows ``keep: int64[k]`` of the
    batch (None: all of them, in order)."""
    parts = b.contributions()
    if len(parts) == 1 and parts[0][0] is None:
        return parts[0][1], None, None  # one leaf over the whole batch: its gradient as is (no copy)
    if len(parts) == 1 and parts[0][3] is not None and parts[0][2]:  # one emb(ids) of fresh ids: sums by segment
        order, counts = parts[0][3]
        return segment_sums(parts[0][1], order, counts), counts.to(parts[0][1].dtype), None
    n = b.rows.shape[0]
    sums = torch.zeros(n, dim, dtype=parts[0][1].dtype, device=parts[0][1].device)
    counts = torch.zeros(n, dtype=sums.dtype, device=sums.device)
    covered = False
    for pos, grad, whole, segments in parts:
        if pos is None:
            sums.add_(grad)
            counts.add_(1.0)
        elif segments is not None:
            sums.add_(segment_sums(grad, *segments))
            counts.add_(segments[1].to(counts.dtype))
        else:
            segment_add_(sums, pos, grad)
            counts.add_(torch.bincount(pos, minlength=n).to(counts.dtype))
        covered = covered or whole
    if covered:
        return sums, counts, None
    keep = counts.nonzero().squeeze(1)  # rows some read touched (a host sync: only for batches read in part)
    return sums.index_select(0, keep), counts.index_select(0, keep), keep


def combine(batches: Sequence[TableRows], dim: int
            ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
    """``(ids_cpu[u], ids_dev[u], rows[u, W], sums[u, D], counts[u] or None)`` over a step's ready ``batches``
    (read order): each row read with a gradient once, its rows from the first batch that has it, its gradient
    summed over its occurrences (``counts``: how many; None: one each). The mean is ``sums / counts``."""
    per: List[Tuple[TableRows, torch.Tensor, Optional[torch.Tensor], Optional[torch.Tensor]]] = [
        (b, *_batch_sums(b, dim)) for b in batches]
    if len(per) == 1:
        b, sums, counts, keep = per[0]
        if keep is None:
            return b.ids, b.ids_dev, b.rows, sums, counts
        return b.ids[keep.cpu()], b.ids_dev.index_select(0, keep), b.rows.index_select(0, keep), sums, counts
    ids_dev = torch.cat([b.ids_dev if k is None else b.ids_dev.index_select(0, k) for b, _, _, k in per])
    rows = torch.cat([b.rows if k is None else b.rows.index_select(0, k) for b, _, _, k in per])
    sums = torch.cat([s for _, s, _, _ in per])
    counts = torch.cat([torch.ones(s.shape[0], dtype=s.dtype, device=s.device) if c is None else c
                        for _, s, c, _ in per])
    uniq, inverse = torch.unique(ids_dev, return_inverse=True)
    total = segment_add_(torch.zeros(uniq.numel(), dim, dtype=sums.dtype, device=sums.device), inverse, sums)
    # whole numbers: exact in any order, so index_add_ is deterministic here even with atomics
    reads = torch.zeros(uniq.numel(), dtype=sums.dtype, device=sums.device).index_add_(0, inverse, counts)
    at = torch.arange(inverse.numel(), device=inverse.device)
    first = torch.full((uniq.numel(),), inverse.numel(), dtype=torch.int64, device=inverse.device)
    first.scatter_reduce_(0, inverse, at, "amin")  # the first batch's copy of each row (a min: order-free)
    return uniq.cpu(), uniq, rows.index_select(0, first), total, reads


def mean_(sums: torch.Tensor, counts: Optional[torch.Tensor]) -> torch.Tensor:
    """``sums / counts`` per row, in place (``counts`` None: already a mean)."""
    return sums if counts is None else sums.div_(counts.unsqueeze(1))
