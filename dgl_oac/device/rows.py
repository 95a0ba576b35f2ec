"""The device paths of a step's row sums and of a deterministic row gather, and the functions that choose them.

Each ``sorted_*`` function is a device path: it returns None, touching nothing, where it does not apply (not
:func:`on_device`). Each function the engine calls runs the device path where it applies and the CPU's torch op
otherwise; both sum in occurrence order, so on whole numbers (exact sums) they agree bitwise
(``tests/device/test_device_rows.py``).
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F


def on_device(device: torch.device) -> bool:
    """Whether work on ``device`` takes its device path: every device but the CPU. Row sums take their sorted
    segment sums; a loader's read-ahead keeps its gather on the gather thread (a CPU loader's caller gathers a
    batch that thread has not started: :class:`dgl_oac.engine.runtime.Worker`). The seam through which tests run
    the device paths on the CPU (the sync audit; their equality with the CPU paths)."""
    return device.type != "cpu"


def occurrences(pos: torch.Tensor, n: int, dtype: torch.dtype = torch.int64) -> torch.Tensor:
    """``dtype[n]`` on ``pos``'s device: how often each of ``n`` rows occurs in ``pos: int64[m]`` (whole numbers
    added with ``index_add_``: exact in any order, and no host sync, unlike a device ``bincount``)."""
    return torch.zeros(n, dtype=dtype, device=pos.device).index_add_(
        0, pos, torch.ones(pos.shape, dtype=dtype, device=pos.device))


def _segments(grad: torch.Tensor, order: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    # unsafe: the lengths are occurrence counts (>= 0, summing to grad's rows), so ATen's checks (syncs) are skipped
    return torch.segment_reduce(grad.index_select(0, order), "sum", lengths=lengths, unsafe=True)


def sorted_segment_add_(acc: torch.Tensor, pos: torch.Tensor, grad: torch.Tensor) -> Optional[torch.Tensor]:
    """Device path of :func:`segment_add_`: the occurrences sorted (stably) and summed per segment over EVERY
    row of ``acc`` (an empty segment sums to 0), so no size depends on the data; None on the CPU."""
    if not on_device(acc.device):
        return None
    return acc.add_(_segments(grad, torch.argsort(pos, stable=True), occurrences(pos, acc.shape[0])))


def segment_add_(acc: torch.Tensor, pos: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    """``acc[pos[i]] += grad[i]`` for ``acc: float32[n, D]``, ``pos: int64[m]`` (repeats allowed), ``grad:
    float32[m, D]``, all on one device; deterministic on every device. CPU: ``index_add_`` (a serial loop in
    occurrence order)."""
    out = sorted_segment_add_(acc, pos, grad)
    return acc.index_add_(0, pos, grad) if out is None else out


def sorted_segment_sums(grad: torch.Tensor, order: torch.Tensor, counts: torch.Tensor) -> Optional[torch.Tensor]:
    """Device path of :func:`segment_sums`: one unchecked ``segment_reduce`` (no host sync); None on the CPU."""
    return _segments(grad, order, counts) if on_device(grad.device) else None


def segment_sums(grad: torch.Tensor, order: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """``float32[n, D]``: row ``i`` sums the ``counts[i]`` rows of ``grad: float32[m, D]`` that ``order: int64[m]``
    lists for it (a stable argsort of their positions: occurrence order), all on one device. CPU: one
    ``embedding_bag`` (3-4x faster than ``index_add_``'s serial loop, the same sums in the same order, bitwise)."""
    out = sorted_segment_sums(grad, order, counts)
    if out is not None:
        return out
    offsets = torch.cumsum(counts, 0).sub_(counts)
    return F.embedding_bag(order, grad.contiguous(), offsets, mode="sum")


def read_counts(pos: torch.Tensor, host_counts: torch.Tensor, n: int) -> torch.Tensor:
    """``int64[n]`` on ``pos``'s device: occurrences of each of ``n`` batch rows in one read, whose counts the
    read kept on the host (``host_counts: int64[n]``, CPU); counted again on a device, where a copy would cost
    more than the ``index_add_``."""
    return occurrences(pos, n) if on_device(pos.device) else host_counts


def gather_rows(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``x.index_select(0, index)`` (``x: float[n, D]``, ``index: int64[m]``, one device) with ``F.embedding``'s
    backward, which sums a row's gradients in a fixed order on every device, where ``index_select``'s and
    ``x[index]``'s add them with atomics on CUDA. On the CPU it is bitwise ``index_select``'s (both add in
    occurrence order); CPU float16/bfloat16, which ``F.embedding`` sums otherwise, keep ``index_select``."""
    cpu_half = x.device.type == "cpu" and x.dtype in (torch.float16, torch.bfloat16)
    return x.index_select(0, index) if cpu_half else torch.embedding(x, index)  # F.embedding's op
