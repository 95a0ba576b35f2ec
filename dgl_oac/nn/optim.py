"""torch's sparse optimizers as dgl-oac row kernels: ``SparseAdam``, ``SGD``, ``Adagrad`` with torch's signatures
and torch's semantics for sparse gradients.

- Duplicate ids in one step are SUMMED (torch coalesces the sparse gradient; DGL averages):
  ``duplicate_reduction = "sum"``.
- Adam's and Adagrad's step count is per TABLE (``torch.optim.SparseAdam``'s ``state["step"]`` per tensor),
  not per row as ``dgl_oac.SparseAdam``: a table's count goes up by one at every ``step()`` that updates it.
  It is optimizer state (:meth:`tensor_state`: in ``state_dict()`` and in ``dgl_oac.checkpoint``), and it is
  deterministic in every mode because the commit runs the kernel in step order.
- The arithmetic follows torch's ``sparse_adam`` / sparse ``adagrad`` / ``sgd`` operation by operation (the
  same roundings), so the rows equal torch's bitwise for the same gradients (``tests/nn/test_nn_optim.py``).
  Where they can differ, by float rounding only: a row read three times or more in one step (torch's coalesce
  adds its gradients in the order of an unstable sort, dgl-oac in read order), and SGD with duplicate ids
  (torch adds ``-lr * g`` once per occurrence; here ``-lr * sum(g)`` once).
- ``w + alpha * x`` is one ``torch.add(w, x, alpha=...)``: torch's sparse ``add_`` rounds it as a fused
  multiply-add, and so does the dense ``add`` with ``alpha`` (measured bitwise equal); a separate ``mul`` then
  ``add`` differs in the last bit.

Not supported (a clear error): ``weight_decay`` (torch rejects it for sparse gradients too), SGD's ``momentum``
and ``nesterov`` (dense buffers over the whole table), per-group hyperparameters, and tables trained by several
processes (use ``dgl_oac.SparseAdam`` there). ``step()`` may raise ``FloatingPointError`` for a NaN/Inf step and skip
it, where torch would write the NaNs.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Dict, Iterable, Optional, Tuple

import torch

from ..optim.base import SparseOptimizer
from .params import resolve_tables


class _TorchSparse(SparseOptimizer, torch.optim.Optimizer):
    """Shared by the three: tables from ``parameters()``, the per-table step count, torch's ``step(closure)``.

    Also a ``torch.optim.Optimizer`` by type (its ``__init__`` is not run: the state lives in the tables), so
    torch's LR schedulers accept it; they set ``param_groups[0]["lr"]``, which the kernels read at every step."""

    duplicate_reduction = "sum"
    propagates_nonfinite = True

    def __init__(self, params: Iterable[Any], lr: float, **hyper: Any) -> None:
        tables = resolve_tables(params, f"dgl_oac.nn.{type(self).__name__}")
        if any(t.group is not None for t in tables):
            raise NotImplementedError(f"dgl_oac.nn.{type(self).__name__} trains single-process tables; tables "
                                      f"shared by several trainers use DGL's semantics (dgl_oac.SparseAdam ...)")
        super().__init__(tables, lr, **hyper)
        self._steps: Dict[str, int] = {t.name: 0 for t in self._params}

    @classmethod
    def class_key(cls) -> str:
        return f"nn.{cls.__name__}"  # not DGL's optimizer of the same name (other semantics)

    def update_table(self, table: Any, rows: torch.Tensor, grad: torch.Tensor,
                     out: Optional[torch.Tensor] = None) -> torch.Tensor:
        """:meth:`update_rows` at this table's next step count (torch's tensor-level ``step``)."""
        return self.update_rows(rows, grad, table.store.dim, out=out, step=self._steps[table.name] + 1)

    def step(self, closure: Optional[Callable[[], Any]] = None) -> Any:
        """Commit every table's pending reads (torch's ``step``; ``closure`` re-evaluates the loss first).

        A table's step count goes up only if its rows were written: a step skipped for NaN/Inf leaves it."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        before = {t.name: t.pipeline.steps for t in self._params}
        try:
            super().step()
        finally:
            for t in self._params:
                if t.pipeline.steps != before[t.name]:
                    self._steps[t.name] += 1
        return loss

    def tensor_state(self) -> Dict[str, Any]:
        """``{"step": {table name: steps taken}}``."""
        return {"step": dict(self._steps)}

    def load_tensor_state(self, state: Dict[str, Any]) -> None:
        steps = state.get("step")
        if steps is None:
            raise KeyError(f"dgl_oac.nn.{type(self).__name__} state has no step counts (saved by another optimizer?)")
        missing = sorted(set(self._steps) - set(steps))
        if missing:
            raise KeyError(f"dgl_oac.nn.{type(self).__name__} state has no step count for tables {missing}")
        self._steps = {name: int(steps[name]) for name in self._steps}

    def _grad(self, grad: torch.Tensor) -> torch.Tensor:
        return grad.neg() if self.defaults["maximize"] else grad


def _out(rows: torch.Tensor, out: Optional[torch.Tensor]) -> torch.Tensor:
    return torch.empty_like(rows) if out is None else out


class SparseAdam(_TorchSparse):
    """``SparseAdam(params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, maximize=False)``, as
    ``torch.optim.SparseAdam``. Row layout ``[w (D) | exp_avg (D) | exp_avg_sq (D)]``."""

    state_names = ("exp_avg", "exp_avg_sq")

    def __init__(self, params: Iterable[Any], lr: float = 1e-3, betas: Tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, maximize: bool = False) -> None:
        super().__init__(params, lr, betas=tuple(betas), eps=eps, maximize=bool(maximize))

    def _check_hyper(self) -> None:
        b1, b2 = self.defaults["betas"]
        if not (0.0 <= b1 < 1.0 and 0.0 <= b2 < 1.0):
            raise ValueError(f"betas must lie in [0, 1), got {self.defaults['betas']!r}")
        if not self.defaults["eps"] >= 0:
            raise ValueError(f"eps must be >= 0, got {self.defaults['eps']!r}")

    def state_width(self, dim: int) -> int:
        return 2 * dim

    def update_rows(self, rows: torch.Tensor, grad: torch.Tensor, dim: int, out: Optional[torch.Tensor] = None,
                    *, step: int) -> torch.Tensor:
        """torch's ``sparse_adam`` on unique rows; ``step``: the table's step count, this step included (no
        default: a commit path must call :meth:`update_table`, which knows it)."""
        b1, b2 = self.defaults["betas"]
        out = _out(rows, out)
        g = self._grad(grad)
        w, m, v = rows[:, :dim], rows[:, dim:2 * dim], rows[:, 2 * dim:]
        new_w, new_m, new_v = out[:, :dim], out[:, dim:2 * dim], out[:, 2 * dim:]
        upd_m = torch.sub(g, m).mul_(1 - b1)      # (g - m) * (1 - b1)
        torch.add(m, upd_m, out=new_m)            # m + that (torch: exp_avg.add_; also its numer)
        upd_v = g.pow(2).sub_(v).mul_(1 - b2)
        torch.add(v, upd_v, out=new_v)
        denom = upd_v.add_(v).sqrt_().add_(self.defaults["eps"])
        step_size = self.lr * math.sqrt(1 - b2 ** step) / (1 - b1 ** step)
        torch.div(new_m, denom, out=new_w).mul_(-step_size).add_(w)
        return out


class Adagrad(_TorchSparse):
    """``Adagrad(params, lr=1e-2, lr_decay=0, weight_decay=0, initial_accumulator_value=0, eps=1e-10,
    maximize=False)``, as ``torch.optim.Adagrad`` on sparse gradients. Row layout ``[w (D) | sum (D)]``."""

    state_names = ("sum",)

    def __init__(self, params: Iterable[Any], lr: float = 1e-2, lr_decay: float = 0.0, weight_decay: float = 0.0,
                 initial_accumulator_value: float = 0.0, eps: float = 1e-10, foreach: Optional[bool] = None,
                 *, maximize: bool = False, differentiable: bool = False, fused: Optional[bool] = None) -> None:
        if weight_decay != 0:
            raise ValueError("weight_decay option is not compatible with sparse gradients (torch.optim.Adagrad "
                             "raises this too)")
        if differentiable or fused:
            raise ValueError("dgl_oac.nn.Adagrad supports neither differentiable=True nor fused=True")
        super().__init__(params, lr, lr_decay=lr_decay, initial_accumulator_value=initial_accumulator_value,
                         eps=eps, maximize=bool(maximize))
        if initial_accumulator_value != 0:  # torch's state["sum"] starts there
            for t in self._params:
                t.pipeline.reset()
                t.store.state().fill_(float(initial_accumulator_value))

    def _check_hyper(self) -> None:
        for key in ("lr_decay", "initial_accumulator_value", "eps"):
            if not self.defaults[key] >= 0:
                raise ValueError(f"{key} must be >= 0, got {self.defaults[key]!r}")

    def state_width(self, dim: int) -> int:
        return dim

    def update_rows(self, rows: torch.Tensor, grad: torch.Tensor, dim: int, out: Optional[torch.Tensor] = None,
                    *, step: int) -> torch.Tensor:
        """torch's sparse Adagrad on unique rows; ``step``: the table's step count, this step included (no
        default, as Adam's)."""
        out = _out(rows, out)
        g = self._grad(grad)
        w, s = rows[:, :dim], rows[:, dim:]
        new_w, new_s = out[:, :dim], out[:, dim:]
        clr = self.lr / (1 + (float(step) - 1) * self.defaults["lr_decay"])
        torch.add(s, g.pow(2), out=new_s)                   # state_sum.add_(g ** 2)
        std = new_s.sqrt().add_(self.defaults["eps"])
        torch.add(w, torch.div(g, std), alpha=-clr, out=new_w)  # w + (-clr) * (g / std), fused as torch's add_
        return out


class SGD(_TorchSparse):
    """``SGD(params, lr=1e-3, momentum=0, dampening=0, weight_decay=0, nesterov=False, *, maximize=False)``, as
    ``torch.optim.SGD`` on sparse gradients: ``w - lr * g``. No state."""

    state_names = ()

    def __init__(self, params: Iterable[Any], lr: float = 1e-3, momentum: float = 0.0, dampening: float = 0.0,
                 weight_decay: float = 0.0, nesterov: bool = False, *, maximize: bool = False,
                 foreach: Optional[bool] = None, differentiable: bool = False, fused: Optional[bool] = None) -> None:
        if momentum != 0 or weight_decay != 0 or nesterov:
            raise ValueError("dgl_oac.nn.SGD is plain SGD (momentum=0, weight_decay=0): torch applies those to "
                             "sparse gradients as dense tensors over the whole table, which is what a CPU table "
                             "avoids")
        if differentiable or fused:
            raise ValueError("dgl_oac.nn.SGD supports neither differentiable=True nor fused=True")
        super().__init__(params, lr, maximize=bool(maximize))

    def state_width(self, dim: int) -> int:
        return 0

    def update_rows(self, rows: torch.Tensor, grad: torch.Tensor, dim: int, out: Optional[torch.Tensor] = None,
                    step: int = 1) -> torch.Tensor:
        """``w + (-lr) * g`` on unique rows (``step`` unused: SGD has no step count)."""
        out = _out(rows, out)
        return torch.add(rows, self._grad(grad), alpha=-self.lr, out=out)  # fused, as torch's sparse add_
