"""Rows of uneven length to every rank at once: ``all_to_all_single`` with uneven splits.

Uneven ``all_gather`` fails on gloo (torch 2.13); an all-to-all with splits works on gloo and NCCL. A message is
one ``float32[n, C]`` tensor per destination; int64 ids travel in it bit for bit, as two float32 columns
(:func:`pack_ids` / :func:`unpack_ids`): collectives that only move bytes never touch their bits.
"""
from __future__ import annotations

from typing import List, Sequence

import torch

from .group import Group


def pack_ids(ids: torch.Tensor) -> torch.Tensor:
    """``int64[n]`` -> ``float32[n, 2]`` holding the same bytes."""
    return ids.reshape(-1).view(torch.float32).view(-1, 2)


def unpack_ids(cols: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`pack_ids`: ``float32[n, 2]`` -> ``int64[n]``."""
    return cols.reshape(-1).clone().view(torch.int64)  # a fresh copy: a slice's offset may be odd


def pack_frame(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """Several 2-D ``float32`` tensors of any shapes as one ``float32[k, 1]`` message: a header (how many, then
    each one's rows and columns: int64s, bit for bit) and their elements. One message a destination carries
    every table's parts of a step, so a step costs one exchange, not one per table and purpose."""
    head = torch.tensor([len(tensors)] + [x for t in tensors for x in t.shape], dtype=torch.int64)
    return torch.cat([pack_ids(head).reshape(-1)] + [t.reshape(-1) for t in tensors]).view(-1, 1)


def unpack_frame(frame: torch.Tensor) -> List[torch.Tensor]:
    """Inverse of :func:`pack_frame` (views of ``frame``'s elements)."""
    flat = frame.reshape(-1)
    count = int(unpack_ids(flat[:2])[0])
    shape = unpack_ids(flat[2:2 + 4 * count]).tolist()
    out, pos = [], 2 + 4 * count
    for rows, cols in zip(shape[0::2], shape[1::2]):
        out.append(flat[pos:pos + rows * cols].view(rows, cols))
        pos += rows * cols
    return out


def exchange(group: Group, parts: Sequence[torch.Tensor], what: str, kind: str) -> List[torch.Tensor]:
    """Send ``parts[r]: float32[n_r, C]`` (CPU) to rank ``r``; returns what each rank sent here, in rank order
    (every rank passes the same ``C``). Two collectives: the row counts, then the rows (both counted as
    ``kind`` in :attr:`Group.sent`; ``kind=""``: not counted, the caller counts by purpose)."""
    if len(parts) != group.world:
        raise ValueError(f"exchange needs one part per rank ({group.world}), got {len(parts)}")
    width = parts[0].shape[1]
    sizes = torch.tensor([p.shape[0] for p in parts], dtype=torch.int64)
    got = torch.empty_like(sizes)
    group.all_to_all(got, sizes, what=f"{what} (sizes)", kind=kind)
    recv_sizes = got.tolist()
    out = torch.empty(sum(recv_sizes), width, dtype=torch.float32)
    group.all_to_all(out, torch.cat(list(parts)), recv_sizes, sizes.tolist(), what=what, kind=kind)
    return list(out.split(recv_sizes))


def exchange_frames(group: Group, frames: List[List[torch.Tensor]], kinds: Sequence[str], what: str
                    ) -> List[List[torch.Tensor]]:
    """Send ``frames[r]`` (a list of parts) to rank ``r`` as one frame; returns each rank's parts, rank order.
    The bytes sent to other ranks are counted by purpose: part ``i`` of a frame as ``kinds[i % len(kinds)]``,
    sizes and headers as ``"framing"``."""
    for r, parts in enumerate(frames):
        if r != group.rank:
            group._count("framing", 8 + 8 * (1 + 2 * len(parts)))  # the frame's size, then its header
            for i, part in enumerate(parts):
                group._count(kinds[i % len(kinds)], part.numel() * 4)
    got = exchange(group, [pack_frame(parts) for parts in frames], what=what, kind="")
    return [unpack_frame(frame) for frame in got]
