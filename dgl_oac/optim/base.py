"""Sparse row optimizers: a pure row kernel behind a small base class, torch.optim-shaped API.

A kernel (:class:`dgl_oac.engine.step.RowKernel`) maps ``rows: float32[n, D+S]`` (value ‖ state) and ``grad:
float32[n, D]`` to new rows, on whatever device they are on; it never touches the table. Where and when its
result is written is the business of the tables' committer (local, or distributed for tables built after
``init_process_group``), which is what lets sync, async and oac, one trainer or N, share one optimizer.

Duplicate ids in one step: with ``duplicate_reduction = "mean"`` (the default) their gradients are AVERAGED over
every occurrence, across and within ``emb(ids)`` calls (DGL's convention; see :mod:`dgl_oac.engine.step`);
a kernel that sets ``"sum"`` gets their sum (``torch.optim.SparseAdam``'s). The kernel sees each row once.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Dict, Iterable, List, Optional, Tuple

import torch

from ..config import check_lr
from ..tables import unwrap
from ..embedding import NodeEmbedding
from ..engine.step import check_reduction


class SparseOptimizer(ABC):
    """Base class: ``opt = SparseAdagrad([emb], lr=0.01); loss.backward(); opt.step()``.

    ``step()`` is the commit point of the pipeline: it updates every row read since the last ``step()`` whose
    batch has a gradient (see :mod:`dgl_oac.engine.step`) and hands them to the write-back. Each batch's gradient is
    consumed once, so forgetting ``zero_grad()`` cannot re-apply old gradients (a trap of ``dgl.optim``, whose
    ``step()`` re-applies every read since the last ``zero_grad()``); ``zero_grad()`` is kept for the API.
    """

    #: names of the per-row state blocks, in column order after the value (for state_dict readers)
    state_names: Tuple[str, ...] = ()
    #: a NaN/Inf in the gradient always makes the new rows non-finite (the built-in kernels: w - f(g, ...)), so
    #: the commit's finite check reads only the new rows; a custom kernel leaves it False (its gradient is read)
    propagates_nonfinite: bool = False
    #: how a row read several times in one step combines its gradients: ``"mean"`` (``dgl.optim``) or ``"sum"``
    #: (``torch.optim``'s sparse optimizers); both committers honour it
    duplicate_reduction: str = "mean"

    def __init__(self, params: Iterable[Any], lr: float, **hyper: Any) -> None:
        self._params: List[NodeEmbedding] = [unwrap(p) for p in params]  # dgl_oac.nn.Embedding: its table
        if not self._params:
            raise ValueError("a sparse optimizer needs at least one dgl_oac.NodeEmbedding")
        for emb in self._params:
            if not isinstance(emb, NodeEmbedding):
                raise TypeError(f"sparse optimizers take dgl_oac.NodeEmbedding objects, got {type(emb).__name__} "
                                f"(a dgl_oac.nn.Embedding is taken too)")
        names = [e.name for e in self._params]
        if len(set(names)) != len(names):
            raise ValueError(f"embedding names must be unique within an optimizer, got {names}")
        self._committer = self._params[0].committer  # local, or the distributed one of their group
        if any(e.committer is not self._committer for e in self._params):
            raise ValueError("a sparse optimizer cannot mix NodeEmbeddings built before and after "
                             "torch.distributed.init_process_group")
        self.defaults: Dict[str, Any] = {"lr": check_lr(lr), **hyper}
        check_reduction(self)
        self._check_hyper()
        for emb in self._params:
            emb._attach_optimizer(self)

    # --- the row kernel -------------------------------------------------------------------------------------
    @abstractmethod
    def state_width(self, dim: int) -> int:
        """Number of float32 state columns a row of width ``dim`` needs."""

    @abstractmethod
    def update_rows(self, rows: torch.Tensor, grad: torch.Tensor, dim: int,
                    out: Optional[torch.Tensor] = None) -> torch.Tensor:
        """New rows ``float32[n, D+S]`` from ``rows: float32[n, D+S]`` and unique-id ``grad: float32[n, D]``,
        written into ``out`` when given (same shape and device as ``rows``; never aliasing it)."""

    def update_table(self, table: Any, rows: torch.Tensor, grad: torch.Tensor,
                     out: Optional[torch.Tensor] = None) -> torch.Tensor:
        """The committers' call for one table's step (``table``: its ``TablePipeline``, with ``name`` and
        ``store.dim``): :meth:`update_rows`. A kernel with optimizer-level state per table, such as torch's
        tensor-level step count, overrides this to read it."""
        return self.update_rows(rows, grad, table.store.dim, out=out)

    def update_checked(self, table: Any, rows: torch.Tensor, grad: torch.Tensor,
                       out: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, Optional[bool]]:
        """``(new, finite)``: :meth:`update_table`, and whether every new value is finite where the kernel
        learned it on the way (the native CPU kernels do), else None: the committer checks ``new`` itself."""
        return self.update_table(table, rows, grad, out=out), None

    def tensor_state(self) -> Dict[str, Any]:
        """Optimizer state that is not per row (plain data, kept in :meth:`state_dict` and checkpoints): none
        for DGL's kernels."""
        return {}

    def load_tensor_state(self, state: Dict[str, Any]) -> None:
        """Restore :meth:`tensor_state`."""

    @classmethod
    def class_key(cls) -> str:
        """The name a checkpoint records for this optimizer class (checked on load)."""
        return cls.__name__

    def _check_hyper(self) -> None:
        """Validate hyperparameters up front (subclasses extend)."""

    # --- torch.optim-like surface ---------------------------------------------------------------------------
    @property
    def param_groups(self) -> List[Dict[str, Any]]:
        """``[hyperparameters]``: one group, as ``torch.optim`` shows them (LR schedulers read ``"lr"``)."""
        return [self.defaults]

    @property
    def lr(self) -> float:
        """The learning rate."""
        return self.defaults["lr"]

    def step(self) -> None:
        """Commit every embedding's pending batch: update its rows and hand them to the write-back, all tables
        or none. Their committer runs the step with this optimizer as the kernel (distributed, tables built
        after ``init_process_group``: the N-trainer sync step, a collective every rank calls)."""
        self._committer.commit(self, [e.pipeline for e in self._params])

    def zero_grad(self, set_to_none: bool = True) -> None:  # noqa: ARG002 - API compatibility
        """No-op: each batch's leaf gradient is consumed by exactly one ``step()``."""

    def state_dict(self) -> Dict[str, Any]:
        """Hyperparameters, each embedding's state columns (a copy, float32[N, S], CPU) and, if any, the
        :meth:`tensor_state`."""
        out = {"param_groups": [dict(self.defaults)], "state_names": list(self.state_names),
               "state": {e.name: e._store_state_copy() for e in self._params}}
        tensor_state = self.tensor_state()
        if tensor_state:  # kernels with optimizer-level state (torch's step counts)
            out["tensor_state"] = tensor_state
        return out

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """Restore hyperparameters and each embedding's state columns from :meth:`state_dict`; raises
        ``KeyError`` naming an embedding it has no state for."""
        groups = state_dict["param_groups"]
        self.defaults.update(groups[0])
        self._check_hyper()
        for emb in self._params:
            if emb.name not in state_dict["state"]:
                raise KeyError(f"optimizer state_dict has no state for embedding {emb.name!r}")
            emb._load_store_state(state_dict["state"][emb.name])
        self.load_tensor_state(state_dict.get("tensor_state", {}))
