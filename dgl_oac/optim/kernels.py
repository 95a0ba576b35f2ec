"""The three row optimizers. Each is a pure kernel over ``rows = value ‖ state`` (see :mod:`.base`).

The arithmetic follows ``dgl.optim.SparseAdagrad`` / ``SparseAdam`` operation by operation, so results agree
with DGL's to float rounding. Kernels write into ``out`` (allocated by the caller: the OAC write log's ring, so
the new rows are logged without a copy) with in-place ops: on CPU every temporary of ``[n, D]`` floats costs a
pass over memory, which is what these kernels are bound by.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch

from .base import SparseOptimizer


def _out(rows: torch.Tensor, out: Optional[torch.Tensor]) -> torch.Tensor:
    return torch.empty_like(rows) if out is None else out


class SparseSGD(SparseOptimizer):
    """``w -= lr * g``. No state."""

    state_names = ()

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

    def __init__(self, params, lr: float, eps: float = 1e-10) -> None:
        super().__init__(params, lr, eps=eps)

    def _check_hyper(self) -> None:
        if not self.defaults["eps"] > 0:
            raise ValueError(f"eps must be > 0, got {self.defaults['eps']!r}")

    def state_width(self, dim: int) -> int:
        return dim

    def update_rows(self, rows: torch.Tensor, grad: torch.Tensor, dim: int,
                    out: Optional[torch.Tensor] = None) -> torch.Tensor:
        out = _out(rows, out)
        w, s = rows[:, :dim], rows[:, dim:]
        new_w, new_s = out[:, :dim], out[:, dim:]
        torch.mul(grad, grad, out=new_s).add_(s)                     # s + g * g (unfused, as DGL rounds)
        std = torch.add(new_s, self.defaults["eps"]).sqrt_()         # sqrt(s + eps)
        torch.mul(grad, self.lr, out=new_w).div_(std).neg_().add_(w)  # w - lr * g / std
        return out


class SparseAdam(SparseOptimizer):
    """Row layout ``[w (D) | m (D) | v (D) | step (1)]``; Adam with per-row step counts, as in DGL."""

    state_names = ("exp_avg", "exp_avg_sq", "step")

    def __init__(self, params, lr: float, betas: Tuple[float, float] = (0.9, 0.999), eps: float = 1e-8) -> None:
        super().__init__(params, lr, betas=tuple(betas), eps=eps)

    def _check_hyper(self) -> None:
        b1, b2 = self.defaults["betas"]
        if not (0.0 <= b1 < 1.0 and 0.0 <= b2 < 1.0):
            raise ValueError(f"betas must lie in [0, 1), got {self.defaults['betas']!r}")
        if not self.defaults["eps"] > 0:
            raise ValueError(f"eps must be > 0, got {self.defaults['eps']!r}")

    def state_width(self, dim: int) -> int:
        return 2 * dim + 1

    def update_rows(self, rows: torch.Tensor, grad: torch.Tensor, dim: int,
                    out: Optional[torch.Tensor] = None) -> torch.Tensor:
        b1, b2 = self.defaults["betas"]
        out = _out(rows, out)
        w, m, v, step = rows[:, :dim], rows[:, dim:2 * dim], rows[:, 2 * dim:3 * dim], rows[:, 3 * dim:]
        new_w, new_m, new_v, new_step = out[:, :dim], out[:, dim:2 * dim], out[:, 2 * dim:3 * dim], out[:, 3 * dim:]
        torch.add(step, 1, out=new_step)  # float32 counts exactly up to 2**24 updates of one row
        # products rounded one at a time, as DGL does (fused multiply-adds would round differently)
        scratch = torch.mul(grad, 1.0 - b1, out=new_w)
        torch.mul(m, b1, out=new_m).add_(scratch)
        torch.mul(grad, grad, out=scratch).mul_(1.0 - b2)
        torch.mul(v, b2, out=new_v).add_(scratch)
        corr1 = torch.pow(b1, new_step).neg_().add_(1.0)  # [n, 1]: 1 - b1**step
        corr2 = torch.pow(b2, new_step).neg_().add_(1.0)
        denom = torch.div(new_v, corr2).sqrt_().add_(self.defaults["eps"])  # sqrt(v_hat) + eps
        torch.div(new_m, corr1, out=new_w).mul_(self.lr).div_(denom)      # lr * m_hat / denom
        new_w.neg_().add_(w)
        return out
