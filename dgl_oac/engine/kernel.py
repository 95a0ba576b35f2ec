"""What the engine asks of an optimizer and of a committer: two small interfaces, no implementation.

A **row kernel** (:class:`RowKernel`; ``dgl_oac.optim``'s optimizers are ones) is pure math over rows: it maps
``rows: float32[n, D+S]`` (value ‖ state) and ``grad: float32[n, D]`` to new rows on whatever device they are
on, and never touches a table. A **committer** (:class:`Committer`) runs a step: it combines the gradients of
the tables' ready batches, calls the kernel once per table and writes the result through each table's one
write path. Each :class:`~dgl_oac.engine.pipeline.TablePipeline` is built with its committer: the local one
(:class:`dgl_oac.engine.commit.LocalCommitter`) or, for a table shared by several trainers, the distributed one
(``dgl_oac.distributed.committer``). ``SparseOptimizer.step()`` only asks it to commit its tables with itself
as the kernel.
"""
from __future__ import annotations

from typing import Any, Optional, Protocol, Sequence, Tuple

import torch

from .combine import mean_


#: how a row's gradients over its occurrences in one step are combined before the kernel sees the row once:
#: ``"mean"`` (``dgl.optim``'s convention) or ``"sum"`` (``torch.optim.SparseAdam``'s)
REDUCTIONS = ("mean", "sum")


class RowKernel(Protocol):
    """The optimizer's math, as the committers call it. A kernel may also have ``update_checked(table, rows,
    grad, out) -> (new, finite or None)`` (``SparseOptimizer``'s): :meth:`update_table` that says whether the
    new rows are finite where it learned that on the way, so the commit's check need not read them again."""

    #: a NaN/Inf in the gradient always makes the new rows non-finite (``w - f(g, ...)``): the finite check then
    #: reads only the new rows; False makes it read the gradient too
    propagates_nonfinite: bool
    #: one of :data:`REDUCTIONS`: a duplicated row's gradient is the mean or the sum of its occurrences
    duplicate_reduction: str

    def state_width(self, dim: int) -> int:
        """Number of float32 state columns a row of ``dim`` values needs."""

    def update_rows(self, rows: torch.Tensor, grad: torch.Tensor, dim: int,
                    out: Optional[torch.Tensor] = None) -> torch.Tensor:
        """New rows ``float32[n, D+S]`` from ``rows: float32[n, D+S]`` and unique-id ``grad: float32[n, D]``,
        written into ``out`` when given (same shape and device as ``rows``, never aliasing it)."""

    def update_table(self, table: Any, rows: torch.Tensor, grad: torch.Tensor,
                     out: Optional[torch.Tensor] = None) -> torch.Tensor:
        """What the committers call for one table's step (``table``: its ``TablePipeline``, with ``name`` and
        ``store.dim``): :meth:`update_rows` with that table's dim, plus any state the kernel keeps per table
        (torch's tensor-level step count)."""


class Committer(Protocol):
    """Runs one step of a kernel over tables (all of them, or none: see :mod:`dgl_oac.engine.commit`)."""

    def commit(self, kernel: RowKernel, tables: Sequence[Any]) -> None:
        """Commit every ready batch of every table in ``tables`` (:class:`~dgl_oac.engine.pipeline.TablePipeline`
        objects; not imported here, which imports this module) as one step, with ``kernel``."""


def reduce_duplicates(kernel: RowKernel, sums: torch.Tensor, counts: Optional[torch.Tensor]) -> torch.Tensor:
    """The gradient the kernel sees, ``float32[u, D]``, from the per-row ``sums: float32[u, D]`` over
    ``counts: float32[u]`` occurrences (None: one each), by the kernel's ``duplicate_reduction`` (in place)."""
    return sums if check_reduction(kernel) == "sum" else mean_(sums, counts)


def check_reduction(kernel: RowKernel) -> str:
    """The kernel's ``duplicate_reduction``, or ValueError naming what it should be."""
    how = getattr(kernel, "duplicate_reduction", "mean")
    if how not in REDUCTIONS:
        raise ValueError(f"{type(kernel).__name__}.duplicate_reduction must be one of {REDUCTIONS}, got {how!r}")
    return how


def run_kernel(kernel: RowKernel, table: Any, rows: torch.Tensor, grad: torch.Tensor,
               out: Optional[torch.Tensor], probe_grad: bool) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(new, probe)``: ``kernel.update_table`` of ``table`` over ``rows: float32[u, W]`` and ``grad: float32[u,
    D]`` (one device) into ``out`` (None: allocated), its shape checked, and ``probe``, a 0-d tensor that is
    finite when ``new`` (and ``grad`` with ``probe_grad``) are (the commits' finite check; no host sync by
    itself): a sum of them, or, where the kernel's ``update_checked`` learned it on the way, 0 or NaN. Running
    the kernel on cache-sized blocks of rows was measured and is slower in a real step: the rows come from the
    gather still in cache, and each block pays every op's dispatch again."""
    checked = getattr(kernel, "update_checked", None)  # optional: a RowKernel may have update_table alone
    if checked is None:
        new, finite = kernel.update_table(table, rows, grad, out=out), None
    else:
        new, finite = checked(table, rows, grad, out=out)
    _check_shape(kernel, new, rows)
    probe = new.sum() if finite is None else torch.tensor(0.0 if finite else float("nan"), device=new.device)
    return new, (probe + grad.sum()) if probe_grad else probe


def _check_shape(kernel: RowKernel, new: torch.Tensor, rows: torch.Tensor) -> None:
    if tuple(new.shape) != tuple(rows.shape):
        raise RuntimeError(f"{type(kernel).__name__}.update_rows returned shape {tuple(new.shape)} for rows of "
                           f"shape {tuple(rows.shape)}")
