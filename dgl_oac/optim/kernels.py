"""The row optimizers. Each is a pure kernel over ``rows = value ‖ state`` (see :mod:`.base`).

The arithmetic follows ``dgl.optim.SparseAdagrad`` / ``SparseAdam`` operation by operation, so results agree
with DGL's to float rounding (where one op does the work of several, such as ``addcdiv``, it rounds as they do:
no fused multiply-add). Kernels write into ``out`` (allocated by the caller: the OAC write log's ring, so
the new rows are logged without a copy) with in-place ops: on CPU every temporary of ``[n, D]`` floats costs a
pass over memory, which is what these kernels are bound by.

Alignment (bitwise on CUDA in every mode): ``out`` is a fresh allocation in sync and a slice of the write log's
ring in oac, each starting at a :data:`~dgl_oac.engine.table.ROW_ALIGN`-byte boundary, but a row of width ``W``
starts where ``W`` puts it. Elementwise ops give the same bits at any alignment; a reduction along a row does
not (CUDA's vectorised reduction starts a misaligned row with its elements up to the next boundary), so a row
reduction reads rows computed into :func:`aligned_rows`, each at a boundary in every mode.
"""
from __future__ import annotations

import threading
import warnings
from typing import Any, Optional, Tuple

import torch

from .. import native
from ..engine.table import ROW_ALIGN
from .base import SparseOptimizer

#: per thread, the CPU buffer :func:`aligned_rows` hands out (the largest so far): a fresh one per step would be
#: mapped and page-faulted in anew
_cpu_rows = threading.local()


def _out(rows: torch.Tensor, out: Optional[torch.Tensor]) -> torch.Tensor:
    return torch.empty_like(rows) if out is None else out


def aligned_rows(n: int, d: int, device: torch.device) -> torch.Tensor:
    """Scratch ``float32[n, d]`` on ``device`` whose every row starts at a multiple of
    :data:`~dgl_oac.engine.table.ROW_ALIGN` bytes (the row stride padded to it), whatever buffer the kernel's
    ``out`` is: a row reduction over it sums each row in the same order in every mode. CUDA: a fresh tensor from the
    caching allocator (ordered on the current stream); CPU: this thread's buffer, valid until its next call."""
    stride = -(-d * 4 // ROW_ALIGN) * ROW_ALIGN // 4
    if device.type == "cpu":
        buf = getattr(_cpu_rows, "buf", None)
        if buf is None or buf.numel() < n * stride:
            buf = _cpu_rows.buf = torch.empty(n * stride + n * stride // 4)
        rows = buf[: n * stride].view(n, stride)
    else:
        rows = torch.empty(n, stride, dtype=torch.float32, device=device)
    if rows.data_ptr() % ROW_ALIGN:
        raise RuntimeError(f"aligned_rows: the {device} allocator gave a buffer {rows.data_ptr() % ROW_ALIGN} bytes "
                           f"past a {ROW_ALIGN}-byte boundary")
    return rows[:, :d]


def _checked(kernel: Any, cls: type, table: Any, rows: torch.Tensor, grad: torch.Tensor,
             out: Optional[torch.Tensor]) -> Tuple[torch.Tensor, Optional[bool]]:
    """``update_checked`` of built-in ``cls``: its ``_update`` (which learns the finite flag where it runs
    natively), unless its math was replaced (by a subclass, or on the instance): then that ``update_rows`` /
    ``update_table`` must run, and the committer checks the rows."""
    if any(getattr(getattr(kernel, name), "__func__", None) is not getattr(cls, name)
           for name in ("update_rows", "update_table")):
        return SparseOptimizer.update_checked(kernel, table, rows, grad, out)
    return kernel._update(rows, grad, table.store.dim, out)


class SparseSGD(SparseOptimizer):
    """``w -= lr * g``. No state."""

    state_names = ()
    propagates_nonfinite = True

    def __init__(self, params, lr: float) -> None:
        super().__init__(params, lr)

    def state_width(self, dim: int) -> int:
        return 0

    def update_rows(self, rows: torch.Tensor, grad: torch.Tensor, dim: int,
                    out: Optional[torch.Tensor] = None) -> torch.Tensor:
        return torch.add(rows, grad, alpha=-self.lr, out=_out(rows, out))


class SparseAdagrad(SparseOptimizer):
    """Row layout ``[w (D) | sum of squared grads (D)]``; ``w -= lr * g / sqrt(sum + eps)`` as in DGL."""

    state_names = ("sum",)
    propagates_nonfinite = True

    def __init__(self, params, lr: float, eps: float = 1e-10) -> None:
        super().__init__(params, lr, eps=eps)

    def _check_hyper(self) -> None:
        if not self.defaults["eps"] > 0:
            raise ValueError(f"eps must be > 0, got {self.defaults['eps']!r}")

    def state_width(self, dim: int) -> int:
        return dim

    def update_rows(self, rows: torch.Tensor, grad: torch.Tensor, dim: int,
                    out: Optional[torch.Tensor] = None) -> torch.Tensor:
        return self._update(rows, grad, dim, out)[0]

    def update_checked(self, table: Any, rows: torch.Tensor, grad: torch.Tensor,
                       out: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, Optional[bool]]:
        return _checked(self, SparseAdagrad, table, rows, grad, out)

    def _update(self, rows: torch.Tensor, grad: torch.Tensor, dim: int,
                out: Optional[torch.Tensor]) -> Tuple[torch.Tensor, Optional[bool]]:
        out = _out(rows, out)
        finite = native.update("adagrad", rows, grad, dim, out, (-self.lr, self.defaults["eps"]))
        if finite is not None:
            return out, finite
        w, s = rows[:, :dim], rows[:, dim:]
        new_w, new_s = out[:, :dim], out[:, dim:]
        torch.mul(grad, grad, out=new_s).add_(s)                     # s + g * g (unfused, as DGL rounds)
        std = torch.add(new_s, self.defaults["eps"], out=new_w).sqrt_()  # sqrt(s + eps), in new_w's columns
        # w + (-lr * g) / std: the same roundings as DGL's w - lr * g / std, in one pass instead of four
        torch.addcdiv(w, grad, std, value=-self.lr, out=new_w)
        return out, None


class SparseRowWiseAdagrad(SparseOptimizer):
    """Adagrad with ONE state float per row, FBGEMM's ``EXACT_ROWWISE_ADAGRAD`` (TorchRec's choice for its largest
    tables): row layout ``[w (D) | sum (1)]``; ``sum += mean(g ** 2)`` over the row, then
    ``w -= lr * g / (sqrt(sum) + eps)`` (eps outside the square root, as FBGEMM's kernels put it; its default
    1e-8). The state costs 4 bytes a row instead of ``SparseAdagrad``'s 4 D, in the table and in every row that
    crosses to the device and back."""

    state_names = ("sum",)
    propagates_nonfinite = True

    def __init__(self, params, lr: float, eps: float = 1e-8) -> None:
        super().__init__(params, lr, eps=eps)

    def _check_hyper(self) -> None:
        if not self.defaults["eps"] > 0:
            raise ValueError(f"eps must be > 0, got {self.defaults['eps']!r}")

    def state_width(self, dim: int) -> int:
        return 1

    def update_rows(self, rows: torch.Tensor, grad: torch.Tensor, dim: int,
                    out: Optional[torch.Tensor] = None) -> torch.Tensor:
        out = _out(rows, out)
        w, s = rows[:, :dim], rows[:, dim:]
        new_w, new_s = out[:, :dim], out[:, dim:]
        sq = torch.mul(grad, grad, out=aligned_rows(grad.shape[0], dim, grad.device))  # rows aligned: module docs
        torch.mean(sq, 1, keepdim=True, out=new_s).add_(s)                              # s + mean(g * g)
        denom = torch.sqrt(new_s).add_(self.defaults["eps"])                            # [n, 1]
        step = torch.full_like(denom, self.lr).div_(denom)                              # lr / (sqrt(s) + eps)
        torch.mul(grad, step, out=new_w).neg_().add_(w)                                 # w - g * step
        return out


class SparseAdam(SparseOptimizer):
    """Adam with per-row step counts, as ``dgl.optim.SparseAdam``.

    Row layout ``[w (D) | m (D) | v (D) | step (1)]`` in float32. With ``dtype=torch.float16`` (DGL's option
    for a smaller optimizer state) the moments are kept in half precision, packed two to a float32 column:
    ``[w (D) | m, v as float16 (D) | step (1)]``, so the state takes D + 1 columns instead of 2D + 1. As in DGL,
    each step computes the moments in float32, updates ``w`` from those, and stores them rounded to float16.
    ``use_uva`` is accepted for DGL compatibility and ignored (rows reach the device through dgl-oac's own
    pinned staging buffers).
    """

    state_names = ("exp_avg", "exp_avg_sq", "step")
    propagates_nonfinite = True

    def __init__(self, params, lr: float, betas: Tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 use_uva: Optional[bool] = None, dtype: torch.dtype = torch.float32) -> None:
        if use_uva is not None:
            warnings.warn("SparseAdam(use_uva=...) is a dgl.optim option that dgl_oac ignores: rows reach the "
                          "device through its own pinned staging buffers", stacklevel=2)
        if dtype not in (torch.float32, torch.float16):
            raise ValueError(f"SparseAdam keeps its state in torch.float32 or torch.float16, not {dtype}")
        self.dtype = dtype
        super().__init__(params, lr, betas=tuple(betas), eps=eps)

    def _check_hyper(self) -> None:
        b1, b2 = self.defaults["betas"]
        if not (0.0 <= b1 < 1.0 and 0.0 <= b2 < 1.0):
            raise ValueError(f"betas must lie in [0, 1), got {self.defaults['betas']!r}")
        if not self.defaults["eps"] > 0:
            raise ValueError(f"eps must be > 0, got {self.defaults['eps']!r}")

    def state_width(self, dim: int) -> int:
        return (dim if self.dtype == torch.float16 else 2 * dim) + 1

    def _moments(self, block: torch.Tensor, dim: int) -> Tuple[torch.Tensor, torch.Tensor]:
        """Views of ``m`` and ``v`` in a row block: float32 columns, or float16 halves packed in them."""
        if self.dtype == torch.float16:
            packed = block[:, dim:2 * dim].view(torch.float16)  # [n, 2D] halves in D float32 columns
            return packed[:, :dim], packed[:, dim:]
        return block[:, dim:2 * dim], block[:, 2 * dim:3 * dim]

    def update_rows(self, rows: torch.Tensor, grad: torch.Tensor, dim: int,
                    out: Optional[torch.Tensor] = None) -> torch.Tensor:
        return self._update(rows, grad, dim, out)[0]

    def update_checked(self, table: Any, rows: torch.Tensor, grad: torch.Tensor,
                       out: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, Optional[bool]]:
        return _checked(self, SparseAdam, table, rows, grad, out)

    def _update(self, rows: torch.Tensor, grad: torch.Tensor, dim: int,
                out: Optional[torch.Tensor]) -> Tuple[torch.Tensor, Optional[bool]]:
        b1, b2 = self.defaults["betas"]
        out = _out(rows, out)
        half = self.dtype == torch.float16
        w, step = rows[:, :dim], rows[:, -1:]
        new_w, new_step = out[:, :dim], out[:, -1:]
        torch.add(step, 1, out=new_step)  # float32 counts exactly up to 2**24 updates of one row
        # [n, 1]: 1 - b**step, from the strided column (torch's CPU pow rounds contiguous input differently)
        corr1 = torch.pow(b1, new_step).neg_().add_(1.0)
        corr2 = torch.pow(b2, new_step).neg_().add_(1.0)
        if not half and rows.device.type == "cpu":
            finite = native.update("adam", rows, grad, dim, out,
                                   (self.lr, b1, b2, self.defaults["eps"], 1.0 - b1, 1.0 - b2),
                                   torch.cat([corr1, corr2], 1))
            if finite is not None:
                return out, finite
        m, v = self._moments(rows, dim)
        new_m, new_v = (torch.empty_like(grad), torch.empty_like(grad)) if half else self._moments(out, dim)
        m, v = (m.float(), v.float()) if half else (m, v)
        # products rounded one at a time, as DGL does (fused multiply-adds would round differently)
        scratch = torch.mul(grad, 1.0 - b1, out=new_w)
        torch.mul(m, b1, out=new_m).add_(scratch)
        torch.mul(grad, grad, out=scratch).mul_(1.0 - b2)
        torch.mul(v, b2, out=new_v).add_(scratch)
        denom = torch.div(new_v, corr2).sqrt_().add_(self.defaults["eps"])  # sqrt(v_hat) + eps
        torch.div(new_m, corr1, out=new_w).mul_(self.lr)                 # lr * m_hat
        torch.addcdiv(w, new_w, denom, value=-1.0, out=new_w)            # w - lr * m_hat / denom, DGL's roundings
        if half:  # stored rounded, after w was updated from the float32 moments (DGL's order)
            out_m, out_v = self._moments(out, dim)
            out_m.copy_(new_m)
            out_v.copy_(new_v)
        return out, None
