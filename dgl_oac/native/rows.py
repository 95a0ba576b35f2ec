"""The Python side of ``rowops.c``: each function runs its native op and returns what it produced, or None,
touching nothing, where the op does not apply (not CPU float32 rows of unit inner stride, no native build) or
its ids are out of range; the caller then runs its torch op."""
from __future__ import annotations

import functools
import threading
from typing import Optional, Sequence

import torch

from .loader import load

#: the library (or None), looked up once: a row op's call then runs no Python of the loader
_library = functools.cache(load)

#: the row update's kinds (``rowops.c``'s enum)
KINDS = {"adagrad": 1, "adam": 2}
#: per thread, the row update's scratch ``float32[n, D]``, kept between calls (the largest so far): a fresh one
#: per step is mapped and page-faulted in anew (8 MB at 16k rows of 128), which costs more than its use
_scratch = threading.local()


def _tmp(n: int, d: int) -> torch.Tensor:
    buf = getattr(_scratch, "buf", None)
    if buf is None or buf.numel() < n * d:
        buf = _scratch.buf = torch.empty(n * d + n * d // 4)
    return buf[: n * d].view(n, d)


def _rows(*tensors: torch.Tensor) -> bool:
    return all(t.device.type == "cpu" and t.dtype == torch.float32 and t.dim() == 2 and t.stride(1) == 1
               for t in tensors)


def _ids(ids: torch.Tensor) -> bool:
    return ids.device.type == "cpu" and ids.dtype == torch.int64 and ids.dim() == 1 and ids.is_contiguous()


def gather(table: torch.Tensor, ids: torch.Tensor, out: Optional[torch.Tensor] = None) -> Optional[torch.Tensor]:
    """``table.index_select(0, ids)`` (``table: float32[N, W]``, ``ids: int64[n]``, CPU) into ``out: float32[n,
    W]`` (None: allocated), or None."""
    if out is None:
        out = torch.empty(ids.numel(), table.shape[1]) if _rows(table) else None
    if out is None or not (_ids(ids) and _rows(table, out) and out.shape == (ids.numel(), table.shape[1])):
        return None
    lib = _library()
    if lib is None or lib.dgloac_gather(ids.numel(), table.shape[1], table.data_ptr(), table.shape[0],
                                        table.stride(0), ids.data_ptr(), out.data_ptr(), out.stride(0)) != 0:
        return None
    return out


def scatter(table: torch.Tensor, ids: torch.Tensor, rows: torch.Tensor) -> bool:
    """``table.index_copy_(0, ids, rows)`` for unique ``ids: int64[n]`` and ``rows: float32[n, W]`` (CPU);
    False where it did not run."""
    if not (_ids(ids) and _rows(table, rows) and rows.shape == (ids.numel(), table.shape[1])):
        return False
    lib = _library()
    return lib is not None and lib.dgloac_scatter(ids.numel(), table.shape[1], table.data_ptr(), table.shape[0],
                                                  table.stride(0), ids.data_ptr(), rows.data_ptr(),
                                                  rows.stride(0)) == 0


def update(kind: str, rows: torch.Tensor, grad: torch.Tensor, dim: int, out: torch.Tensor,
           hyper: Sequence[float], corr: Optional[torch.Tensor] = None) -> Optional[bool]:
    """Row update ``kind``: ``out: float32[n, W]`` (CPU) from ``rows: float32[n, W]`` and ``grad: float32[n,
    D]``; ``hyper``: the kernel's scalars in ``rowops.c``'s order; ``corr: float32[n, 2]`` (Adam's bias
    corrections). Returns whether every new value is finite, or None where it did not run."""
    if not _rows(rows, grad, out) or grad.shape[1] != dim or out.shape != rows.shape:
        return None
    lib = _library()
    if lib is None:
        return None
    h = torch.tensor(hyper, dtype=torch.float32)
    c = None if corr is None else corr.contiguous()
    tmp = _tmp(rows.shape[0], dim)
    args = (rows.shape[0], dim, rows.data_ptr(), rows.stride(0), grad.data_ptr(), grad.stride(0), out.data_ptr(),
            out.stride(0), tmp.data_ptr(), h.data_ptr(), None if c is None else c.data_ptr())
    lib.dgloac_pass(KINDS[kind], 1, *args)
    tmp.sqrt_()  # torch's own square root (see rowops.c): the torch path's results, bitwise
    return lib.dgloac_pass(KINDS[kind], 2, *args) == 0
