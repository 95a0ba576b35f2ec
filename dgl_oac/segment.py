"""The built-in models' row gathers and message passing over index tensors, deterministic on every device.

``index_select``'s and advanced indexing's backward add a repeated row's gradients with atomics on CUDA (the sum's
order, so its bits, vary from run to run); :func:`gather_rows` (:mod:`dgl_oac.device.rows`: ``F.embedding``'s
backward) sums them in a fixed order, and a segment reduce over sorted destinations has no atomics. On the CPU
both are bitwise what they replace.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from .device.rows import gather_rows


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


__all__ = ["aggregate", "gather_rows"]
