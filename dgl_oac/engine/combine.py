"""Combine one table's reads of a step into one gradient per row: DGL's per-occurrence mean.

``dgl.nn.NodeEmbedding`` records one trace per ``emb(ids)`` call, and ``dgl.optim`` gives each row the mean of
its gradient over EVERY occurrence of it in the step, across and within calls (``unique`` + ``index_add_`` +
divide by the counts). Here the rows of a step live in :class:`~dgl_oac.engine.pipeline.HandedOut` batches (unique ids,
value ‖ state), and each read of them is a leaf with its own gradient (:meth:`HandedOut.contributions`): the hand-out
leaf (every row once) or an ``emb(ids)`` call's leaf (positions into the batch, repeats allowed). A row's
gradient is the sum over its occurrences divided by their number; rows no read with a gradient touched are not
updated (as in DGL, whose traces never name them).

Cost: nothing is copied when one leaf covers a batch (a loader step); otherwise one pass over the gradients.
Full-width rows (value ‖ state) are gathered only for unique rows, and only when several batches meet in a
step (gradient accumulation) or a batch was read in part.

Deterministic, and no host sync on a device: the sums are :mod:`dgl_oac.device.rows`' (on CPU ``index_add_``
or ``embedding_bag`` in occurrence order; on a device, :func:`~dgl_oac.device.rows.on_device`, sorted segment
sums over EVERY destination row, so no size depends on the data). What does depend on the data is planned on the
HOST from the CPU ids, before anything is copied: which rows of a batch read in part the step writes (each read's occurrence counts, kept on the host by
:meth:`~dgl_oac.engine.pipeline.TablePipeline.read`), and the unique ids of several batches; their index tensors
reach the device through :func:`~dgl_oac.engine.transfer.to_device_now`. Counts are whole numbers: summed with
``index_add_``, they are exact in any order.
"""
from __future__ import annotations

from typing import List, NamedTuple, Optional, Sequence, Tuple

import torch

from ..device import rows as device_rows
from ..device.rows import occurrences, read_counts, segment_add_, segment_sums
from .pipeline import HandedOut
from .transfer import to_device_now


class _Sums(NamedTuple):
    """One batch's part of a step: ``sums: float32[k, D]`` and ``counts: float32[k]`` (None: every row once,
    ``sums`` is the gradient itself) on the device, for the rows ``keep: int64[k]`` of the batch (None: all of
    them, in order), on the host and as ``keep_dev`` on the device."""

    sums: torch.Tensor
    counts: Optional[torch.Tensor]
    keep: Optional[torch.Tensor] = None
    keep_dev: Optional[torch.Tensor] = None


def _touched(parts: list, counts: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(keep, keep_dev)``: the rows some read touched, ``int64[k]`` on the host and on the device. On a device
    from the reads' host counts; a read made without them (not through ``TablePipeline.read``) leaves only the
    device's counts, whose non-zeros are a host sync."""
    if device_rows.on_device(counts.device) and all(segments is not None for _, _, _, segments in parts):
        hit = torch.zeros(counts.shape[0], dtype=torch.bool)
        for _, _, _, (_, host_counts) in parts:
            hit |= host_counts > 0
        keep = hit.nonzero().squeeze(1)  # host
        return keep, to_device_now(counts.device, keep)[0]
    keep_dev = counts.nonzero().squeeze(1)  # a host sync on a device (see the docstring)
    return keep_dev.cpu(), keep_dev


def _batch_sums(b: HandedOut, dim: int) -> _Sums:
    """``b``'s part of the step over its leaves with a gradient (:class:`_Sums`)."""
    parts = b.contributions()
    if len(parts) == 1 and parts[0][0] is None:
        return _Sums(parts[0][1], None)  # one leaf over the whole batch: its gradient as is (no copy)
    n = b.rows.shape[0]
    if len(parts) == 1 and parts[0][3] is not None and parts[0][2]:  # one emb(ids) of every row: sums by segment
        pos, grad, _, (order, host_counts) = parts[0]
        counts = read_counts(pos, host_counts, n)
        return _Sums(segment_sums(grad, order, counts), counts.to(grad.dtype))
    sums = torch.zeros(n, dim, dtype=parts[0][1].dtype, device=parts[0][1].device)
    counts = torch.zeros(n, dtype=sums.dtype, device=sums.device)
    covered = False
    for pos, grad, whole, segments in parts:
        if pos is None:
            sums.add_(grad)
            counts.add_(1.0)
        elif segments is not None:
            c = read_counts(pos, segments[1], n)
            sums.add_(segment_sums(grad, segments[0], c))
            counts.add_(c.to(counts.dtype))
        else:
            segment_add_(sums, pos, grad)
            counts.add_(occurrences(pos, n, counts.dtype))
        covered = covered or whole
    if covered:
        return _Sums(sums, counts)
    keep, keep_dev = _touched(parts, counts)
    return _Sums(sums.index_select(0, keep_dev), counts.index_select(0, keep_dev), keep, keep_dev)


def combine(batches: Sequence[HandedOut], dim: int
            ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
    """``(ids_cpu[u], ids_dev[u], rows[u, W], sums[u, D], counts[u] or None)`` over a step's ready ``batches``
    (read order): each row read with a gradient once, its rows from the first batch that has it, its gradient
    summed over its occurrences (``counts``: how many; None: one each). The mean is ``sums / counts``."""
    per: List[Tuple[HandedOut, _Sums]] = [(b, _batch_sums(b, dim)) for b in batches]
    if len(per) == 1:
        b, s = per[0]
        if s.keep is None:
            return b.ids, b.ids_dev, b.rows, s.sums, s.counts
        return b.ids[s.keep], b.ids_dev.index_select(0, s.keep_dev), b.rows.index_select(0, s.keep_dev), \
            s.sums, s.counts
    rows = torch.cat([b.rows if s.keep is None else b.rows.index_select(0, s.keep_dev) for b, s in per])
    sums = torch.cat([s.sums for _, s in per])
    counts = torch.cat([torch.ones(s.sums.shape[0], dtype=sums.dtype, device=sums.device) if s.counts is None
                        else s.counts for _, s in per])
    # the step's rows, planned on the host from the CPU ids (on a device the number of unique ids is a sync)
    ids = torch.cat([b.ids if s.keep is None else b.ids[s.keep] for b, s in per])
    uniq, inverse = torch.unique(ids, return_inverse=True)
    first = torch.full((uniq.numel(),), inverse.numel(), dtype=torch.int64)
    first.scatter_reduce_(0, inverse, torch.arange(inverse.numel()), "amin")  # each row's first batch (order-free)
    uniq_dev, inverse, first = to_device_now(sums.device, uniq, inverse, first)
    total = segment_add_(torch.zeros(uniq.numel(), dim, dtype=sums.dtype, device=sums.device), inverse, sums)
    # whole numbers: exact in any order, so index_add_ is deterministic here even with atomics
    reads = torch.zeros(uniq.numel(), dtype=sums.dtype, device=sums.device).index_add_(0, inverse, counts)
    return uniq, uniq_dev, rows.index_select(0, first), total, reads


def mean_(sums: torch.Tensor, counts: Optional[torch.Tensor]) -> torch.Tensor:
    """``sums / counts`` per row, in place (``counts`` None: already a mean)."""
    return sums if counts is None else sums.div_(counts.unsqueeze(1))
