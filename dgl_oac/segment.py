"""The built-in models' row gathers and message passing over index tensors, deterministic on every device.

``index_select``'s and advanced indexing's backward add a repeated row's gradients with atomics on CUDA (the sum's
order, so its bits, vary from run to run); ``F.embedding``'s backward sums them in a fixed order, and a segment
reduce over sorted destinations has no atomics. On the CPU both are bitwise what they replace.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import Tensor


def aggregate(block: Any, x_src: Tensor, how: str = "mean") -> Tensor:
    """``block``: an :class:`~dgl_oac.dgl_frontend.blocks.IndexBlock`. ``x_src: float[num_src, D]`` ->
    ``float[num_dst, D]``: each destination's ``how`` ("mean" or "sum") over its in-edges' sources, 0 for none.
    A segment reduce over ``dst``'s runs: deterministic, no host sync."""
    if how not in ("mean", "sum"):
        raise ValueError(f"IndexBlock aggregates with 'mean' or 'sum', got {how!r} (other SAGE aggregators "
                         f"need DGL's blocks on the device)")
    if x_src.shape[0] != block.num_src:
        raise ValueError(f"x_src has {x_src.shape[0]} rows for a block of {block.num_src} source nodes")
    return torch.segment_reduce(gather_rows(x_src, block.src), how, lengths=block.in_deg, unsafe=True, initial=0)


def gather_rows(x: Tensor, index: Tensor) -> Tensor:
    """``x.index_select(0, index)`` (``x: float[n, D]``, ``index: int64[m]``, one device) with ``F.embedding``'s
    backward, which sums a row's gradients in a fixed order on every device, where ``index_select``'s and
    ``x[index]``'s add them with atomics on CUDA. On the CPU it is bitwise ``index_select``'s (both add in occurrence
    order); CPU float16/bfloat16, which ``F.embedding`` sums otherwise, keep ``index_select`` (serial there)."""
    cpu_half = x.device.type == "cpu" and x.dtype in (torch.float16, torch.bfloat16)
    return x.index_select(0, index) if cpu_half else torch.embedding(x, index)  # F.embedding's op


__all__ = ["aggregate", "gather_rows"]
