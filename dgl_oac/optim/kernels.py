"""The three row optimizers. Each is a pure kernel over ``rows = value ‖ state`` (see :mod:`.base`).

The arithmetic follows ``dgl.optim.SparseAdagrad`` / ``SparseAdam`` operation by operation, so results agree
with DGL's to float rounding.
"""
from __future__ import annotations

from typing import Tuple

import torch

from .base import SparseOptimizer


class SparseSGD(SparseOptimizer):
    """``w -= lr * g``. No state."""

    state_names = ()

    def __init__(self, params, lr: float) -> None:
        super().__init__(params, lr)

    def state_width(self, dim: int) -> int:
        return 0

    def update_rows(self, rows: torch.Tensor, grad: torch.Tensor, dim: int) -> torch.Tensor:
        return rows - self.lr * grad


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

    def update_rows(self, rows: torch.Tensor, grad: torch.Tensor, dim: int) -> torch.Tensor:
        w, s = rows[:, :dim], rows[:, dim:]
        s = s + grad * grad
        std = (s + self.defaults["eps"]).sqrt()
        return torch.cat([w - self.lr * grad / std, s], dim=1)


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

    def update_rows(self, rows: torch.Tensor, grad: torch.Tensor, dim: int) -> torch.Tensor:
        b1, b2 = self.defaults["betas"]
        w, m, v, step = rows[:, :dim], rows[:, dim:2 * dim], rows[:, 2 * dim:3 * dim], rows[:, 3 * dim:]
        # float32 holds step counts exactly up to 2**24 updates of one row
        step = step + 1
        m = b1 * m + (1.0 - b1) * grad
        v = b2 * v + (1.0 - b2) * (grad * grad)
        m_hat = m / (1.0 - torch.pow(torch.tensor(b1, device=rows.device), step))
        v_hat = v / (1.0 - torch.pow(torch.tensor(b2, device=rows.device), step))
        return torch.cat([w - self.lr * m_hat / (torch.sqrt(v_hat) + self.defaults["eps"]), m, v, step], dim=1)
