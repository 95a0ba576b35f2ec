"""The local committer: runs inside ``SparseOptimizer.step()`` on the caller's thread and device stream.

Synchronisation point. When it runs, (1) backward has produced the gradients of the batches being committed
on the current stream, (2) every earlier step of each table was committed by this same thread, so the write
log is complete up to the previous step. That is why bringing held batches up to date here is exact: a row
written after a batch last saw it is replaced (from the log, or re-read after a flush) before the kernel reads
it. Nothing here waits for the write-back: the rows are handed to it (bounded) or, with no pipelined epoch
running, written through.

What a ``step()`` commits (DGL's semantics): every batch of the optimizer's tables read since the last
``step()`` whose leaf has a gradient, all in one step; a row gets the mean of its gradient over every occurrence
of it in those reads, once (:mod:`dgl_oac.engine.combine`: ``dgl.optim`` averages over occurrences), or their
sum for a kernel whose ``duplicate_reduction`` is ``"sum"`` (``torch.optim.SparseAdam``'s convention). Batches without a gradient stay pending; they are released when their
leaves die.

Per kind of read: sync and oac rows are current, and the step overwrites them; async rows may be stale, and the
table gets ``new - old`` added (Marius-style: no update is lost, but it was computed from stale rows). Async
batches with a hook (:mod:`dgl_oac.engine.hooks`) are first brought to the current rows by it (which may
rescale their gradients), then overwritten and logged like oac's.

Failures: every check (finite values, a failed write-back) runs for every table of the optimizer before
anything is written, so a rejected batch (``FloatingPointError`` for NaN/Inf) leaves every table and every
optimizer state bitwise as before it; the batch is skipped (its reads closed, its gradient never re-applied).
"""
from __future__ import annotations

import time
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, List, Optional, Sequence, Tuple

import torch

from .batch import TableRows
from .combine import combine
from .hooks import hook_of
from .kernel import RowKernel, reduce_duplicates, run_kernel
from .refresh import Count

if TYPE_CHECKING:
    from .pipeline import TablePipeline


def _finite_error(name: str, dim: int, ids: torch.Tensor, rows: torch.Tensor, grad: torch.Tensor,
                  new: torch.Tensor) -> FloatingPointError:
    """Say which input was not finite (rows read, gradient, or the update itself) and for which ids."""
    d = dim
    for what, bad in (("the rows read from the table (values)", rows[:, :d]),
                      ("the rows read from the table (optimizer state)", rows[:, d:]),
                      ("the gradient", grad), ("the optimizer's update (overflow)", new)):
        if bad.numel() and not bool(torch.isfinite(bad).all()):
            mask = (~torch.isfinite(bad)).any(1).cpu()
            shown = ids[mask][:5].tolist()
            break
    return FloatingPointError(
        f"NaN or Inf in {what} of NodeEmbedding {name!r}: {int(mask.sum())} of {ids.numel()} rows, ids "
        f"{shown}{' ...' if int(mask.sum()) > 5 else ''}; the batch was skipped, the table and optimizer state "
        f"are as they were before it")


@dataclass(eq=False)
class Update:
    """One table's computed (not yet applied) step."""

    table: "TablePipeline"
    batches: List[TableRows]
    ids: torch.Tensor       # int64[u], CPU, unique
    ids_dev: torch.Tensor   # int64[u], device
    rows: torch.Tensor      # float32[u, W], device: what the kernel read
    new: torch.Tensor       # float32[u, W], device: what the step writes
    delta: bool             # async rows among them: the table gets new - rows added
    repatched: Count        # rows brought up to date at the commit (int, or a 0-d device tensor: no sync)
    t0: float
    forwarded: Optional[Tuple[torch.Tensor, torch.Tensor]] = None  # distributed: rows other owners wrote
    new_host: Optional[torch.Tensor] = None  # ``new`` on the CPU where the kernel ran there (distributed owners)


def _plan(table: "TablePipeline", kernel: RowKernel) -> Optional[Update]:
    """Bring ``table``'s ready batches up to date and run the kernel; touches no table, log or clock."""
    table.check()  # a failed write-back surfaces here, at the next step()
    batches = table.ready()
    if not batches:
        return None
    t0 = time.perf_counter()
    repatched = sum(table.refresh(b) for b in batches)
    hook = hook_of(table.name, batches)
    if hook is not None:
        repatched += hook.before_kernel(table, [b for b in batches if b.hook is hook])
    dim = table.store.dim
    ids, ids_dev, rows, sums, counts = combine(batches, dim)
    grad = reduce_duplicates(kernel, sums, counts)
    with torch.no_grad():
        # NaN/Inf in the gradient or the rows read makes `new` non-finite too for the built-in kernels
        # (``propagates_nonfinite``), so their new rows alone are summed; a custom kernel could hide it, so its
        # gradient is summed as well. Fast path: one host sync on a sum (one vectorised pass; isfinite()
        # materialises a mask); only if it is not finite (or a sum of finite values overflowed) does
        # the exact per-row check run.
        new, probe = run_kernel(kernel, table, rows, grad, table.kernel_out(ids.numel(), rows.device),
                                probe_grad=not kernel.propagates_nonfinite)
        if any(b.check_finite for b in batches) and not bool(torch.isfinite(probe)):
            if not bool(torch.isfinite(new).all() & torch.isfinite(grad).all()):
                raise _finite_error(table.name, dim, ids, rows, grad, new)
        if hook is not None:
            hook.after_kernel(rows, new)  # a statistic of the steps, not table state
    delta = any(b.adds for b in batches)
    return Update(table, batches, ids, ids_dev, rows, new, delta, repatched, t0)


def apply_update(u: Update) -> None:
    """Write the step (through the table's one path: write-back or write-through, log), then release."""
    with torch.no_grad():
        u.table.commit(u.batches, u.ids, u.ids_dev, u.new, delta_from=u.rows if u.delta else None,
                       forwarded=u.forwarded, new_host=u.new_host)
    elapsed = time.perf_counter() - u.t0
    for b in u.batches:
        if b.on_commit is not None:
            b.on_commit(b, elapsed, u.repatched)


class LocalCommitter:
    """The committer of a table trained in this process alone (:class:`~dgl_oac.engine.kernel.Committer`)."""

    def commit(self, kernel: RowKernel, tables: "Sequence[TablePipeline]") -> None:
        """Commit every ready batch of every table in ``tables`` as one step, with ``kernel``.

        All or nothing for everything that can be checked first: each table's update is computed and checked
        (finite, shapes, no failed write-back) before any table, log or clock is touched. On such a failure the
        batch is skipped in every table (its gradients dropped, its reads closed) and the error is raised: the
        tables and optimizer state are bitwise as before it. A failure while applying (an I/O error in a
        write-through, a device->host copy) skips the batch in the tables not yet applied.
        """
        updates = []
        try:
            with torch.profiler.record_function("dgl_oac.engine.commit"):
                for table in tables:
                    u = _plan(table, kernel)
                    if u is not None:
                        updates.append(u)
        except BaseException:
            skip(tables)
            raise
        if not updates:
            warnings.warn(f"{type(kernel).__name__}.step() found nothing to commit: no row read since the last "
                          f"step() has a gradient (was backward() called, and were the rows read with grad "
                          f"enabled?)", stacklevel=3)
            return
        for i, u in enumerate(updates):
            try:
                apply_update(u)
            except BaseException:
                skip([rest.table for rest in updates[i + 1:]])
                raise


def skip(tables: "Sequence[TablePipeline]") -> None:
    """Drop the tables' ready batches (their gradients are never applied, their reads closed)."""
    for table in tables:
        for b in table.ready():
            table.release(b)


#: the one local committer (it holds no state): every table trained in one process is given it
LOCAL = LocalCommitter()
