"""Stage U, the commit: runs inside ``SparseOptimizer.step()`` on the caller's thread and device stream.

Synchronisation point. When it runs, (1) the batch's backward has produced ``leaf.grad`` on the current stream,
(2) every earlier step of this embedding has been committed by this same thread, so the device write log and
``last_slot`` are complete up to the previous step. That is why re-validating here is exact: a row whose newest
write is after the batch's read version is patched from the log before the kernel reads it. Nothing here waits
for the write-back: sync mode writes through, the other modes enqueue (bounded) and return.

Per mode:
* sync  — kernel on fresh rows, rows written to the table before ``step()`` returns;
* async — kernel on possibly stale rows; the table gets ``new - old`` added (Marius-style: no update is lost,
          but updates were computed from stale rows);
* oac   — re-validate, kernel, log the new rows (they are what later batches patch from), overwrite in order.

Failures: every check (finite values, a failed write-back) runs for every embedding of the optimizer before
anything is written, so a rejected batch (``FloatingPointError`` for NaN/Inf) leaves every table and every
optimizer state bitwise as before it; the batch is skipped (its reads closed, its gradient never re-applied).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, List, Optional, Sequence, Tuple

import torch

from .optim.base import average_duplicates

if TYPE_CHECKING:
    from .embedding import NodeEmbedding, Slot
    from .optim.base import SparseOptimizer


def _merge(slots: "List[Slot]") -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(ids_cpu[u], ids_dev[u], rows[u, W], grad[u, D])`` over the pending slots, duplicates averaged."""
    if len(slots) == 1 and slots[0].unique:
        s = slots[0]
        return s.ids, s.ids_dev, s.rows, s.leaf.grad
    ids_dev = torch.cat([s.ids_dev for s in slots])
    rows = torch.cat([s.rows for s in slots])
    grad = torch.cat([s.leaf.grad for s in slots])
    uniq, first, grad = average_duplicates(ids_dev, grad)
    return uniq.cpu(), uniq, rows.index_select(0, first), grad


def _finite_error(emb: "NodeEmbedding", ids: torch.Tensor, rows: torch.Tensor, grad: torch.Tensor,
                  new: torch.Tensor) -> FloatingPointError:
    """Say which input was not finite (rows read, gradient, or the update itself) and for which ids."""
    d = emb.embedding_dim
    for what, bad in (("the rows read from the table (values)", rows[:, :d]),
                      ("the rows read from the table (optimizer state)", rows[:, d:]),
                      ("the gradient", grad), ("the optimizer's update (overflow)", new)):
        if bad.numel() and not bool(torch.isfinite(bad).all()):
            mask = (~torch.isfinite(bad)).any(1).cpu()
            shown = ids[mask][:5].tolist()
            break
    return FloatingPointError(
        f"NaN or Inf in {what} of NodeEmbedding {emb.name!r}: {int(mask.sum())} of {ids.numel()} rows, ids "
        f"{shown}{' ...' if int(mask.sum()) > 5 else ''}; the batch was skipped, the table and optimizer state "
        f"are as they were before it")


def _refresh(emb: "NodeEmbedding", s: "Slot") -> int:
    """Bring ``s.rows`` up to the newest committed step; returns how many rows were replaced.

    Normally a no-op: the hand-out made the rows current and no step of ``emb`` ran since. Only when a batch is
    held across another batch's ``step()`` (two ``next()`` before a ``step()``, ``list(loader)``) are some rows
    older than the step that updates them; reading them anew keeps the earlier step's update (as DGL's
    optimizers do, which read the table at ``step()``). oac patches just the rows written since from the log;
    sync re-reads the batch from the table; async keeps its stale rows by design (its delta keeps the update).
    """
    if s.seen is None or s.seen >= emb.step_count - 1:
        return 0
    if s.mode == "oac":
        return int(emb.log.patch(s.ids_dev, s.rows, s.seen))
    if s.mode == "sync":
        emb.flush()
        s.rows.copy_(emb.store.gather(s.ids))
        return s.ids.numel()
    return 0


def _release(emb: "NodeEmbedding", slots: "List[Slot]") -> None:
    """Forget ``slots`` (the pending batches with a gradient) and close their reads."""
    emb.pending = [s for s in emb.pending if s.leaf.grad is None]
    if any(emb.current is s for s in slots):
        emb.current = None
    for s in slots:
        if s.rv is not None:
            emb.clock.end_read(s.rv)
        if emb.transfer is not None:  # nothing reads the rows after the commit (the leaf is a copy)
            emb.transfer.recycle(s.rows)


@dataclass(eq=False)
class _Plan:
    """One embedding's computed (not yet applied) commit."""

    emb: "NodeEmbedding"
    slots: "List[Slot]"
    mode: str
    ids: torch.Tensor       # int64[u], CPU, unique
    ids_dev: torch.Tensor   # int64[u], device
    rows: torch.Tensor      # float32[u, W], device: what the kernel read
    new: torch.Tensor       # float32[u, W], device: what the step writes
    repatched: int
    t0: float


def _plan(emb: "NodeEmbedding", opt: "SparseOptimizer") -> Optional[_Plan]:
    """Validate and run the kernel for ``emb``'s pending batches; touches no table, log or clock."""
    if emb.writer is not None:
        emb.writer.check()  # a failed write-back surfaces here, at the next step()
    slots = [s for s in emb.pending if s.leaf.grad is not None]
    if not slots:
        return None
    t0 = time.perf_counter()
    modes = {s.mode for s in slots}
    if len(modes) != 1:
        raise RuntimeError(f"batches of {emb.name!r} from loaders of different modes {sorted(modes)} pending in "
                           f"one step; call opt.step() between them")
    mode = modes.pop()
    repatched = sum(_refresh(emb, s) for s in slots)
    ids, ids_dev, rows, grad = _merge(slots)
    with torch.no_grad():
        # oac: the kernel writes straight into the write log's ring (logged without a copy)
        # sync/async on CPU: a pooled buffer (a fresh 30 MB tensor per step would be page-faulted in each time)
        out = emb.log.reserve(ids.numel()) if mode == "oac" else \
            emb.transfer.kernel_out(*rows.shape) if emb.transfer is not None else None
        new = opt.update_rows(rows, grad, emb.embedding_dim, out=out)
        if tuple(new.shape) != tuple(rows.shape):
            raise RuntimeError(f"{type(opt).__name__}.update_rows returned shape {tuple(new.shape)} for rows of "
                               f"shape {tuple(rows.shape)}")
        # NaN/Inf in the gradient or the rows read makes `new` non-finite too for the built-in kernels, but a
        # custom kernel could hide it, so the gradient is checked as well. Fast path: one host sync on two sums
        # (a sum is one vectorised pass; isfinite() materialises a mask); only if a sum is not finite (or a sum
        # of finite values overflowed) does the exact per-row check run.
        if any(s.check_finite for s in slots) and not bool(torch.isfinite(new.sum() + grad.sum())):
            if not bool(torch.isfinite(new).all() & torch.isfinite(grad).all()):
                raise _finite_error(emb, ids, rows, grad, new)
    return _Plan(emb, slots, mode, ids, ids_dev, rows, new, repatched, t0)


def _apply(plan: _Plan) -> None:
    """Write ``plan`` through (sync) or hand it to the write-back (async, oac); then close the batch."""
    emb, mode, new = plan.emb, plan.mode, plan.new
    step = emb.step_count
    try:
        with torch.no_grad():
            if mode == "sync":
                emb.flush()  # an earlier pipelined loader's writes come first
                host = new.cpu() if new.device.type != "cpu" else new
                emb.store.write(plan.ids, host)
                emb.clock.publish(step)
                if emb.transfer is not None:  # (None: emb(ids) outside any loader)
                    emb.transfer.recycle(new)
            else:
                payload = new if mode == "oac" else torch.sub(new, plan.rows, out=new)  # async: the delta
                (host,), event = emb.transfer.to_host(payload)  # before the log: a failure here leaves no trace
                if mode == "oac":
                    emb.log.append(step, plan.ids_dev, new)
                emb.writer.submit(step, plan.ids, host, event, "write" if mode == "oac" else "add")
    except BaseException:
        _release(emb, plan.slots)  # never re-applied by a later step()
        raise
    emb.step_count += 1
    _release(emb, plan.slots)
    if mode == "oac":
        emb.log.drop_through(emb.clock.horizon())
    elapsed = time.perf_counter() - plan.t0
    for s in plan.slots:
        for hook in s.on_commit:
            hook(s, elapsed, plan.repatched)


def commit_step(opt: "SparseOptimizer", embeddings: "Sequence[NodeEmbedding]") -> None:
    """Commit every pending batch of every embedding of ``opt`` (usually exactly one batch).

    All or nothing for everything that can be checked first: each embedding's update is computed and checked
    (finite, shapes, no failed write-back) before any table, log or clock is touched. On such a failure the
    batch is skipped in every embedding (its gradients dropped, its reads closed) and the error is raised: the
    tables and optimizer state are bitwise as before it. A failure while applying (an I/O error in sync's
    write-through, a device->host copy) skips the batch in the embeddings not yet applied.
    """
    plans = []
    try:
        for emb in embeddings:
            plan = _plan(emb, opt)
            if plan is not None:
                plans.append(plan)
    except BaseException:
        for emb in embeddings:
            _release(emb, [s for s in emb.pending if s.leaf.grad is not None])
        raise
    for i, plan in enumerate(plans):
        try:
            _apply(plan)
        except BaseException:
            for rest in plans[i + 1:]:
                _release(rest.emb, rest.slots)
            raise


def commit_pending(emb: "NodeEmbedding", opt: "SparseOptimizer") -> None:
    """Commit ``emb``'s pending batches alone (:func:`commit_step` over one embedding)."""
    commit_step(opt, [emb])
