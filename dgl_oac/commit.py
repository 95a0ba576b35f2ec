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
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, List, Tuple

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


def _check_finite(emb: "NodeEmbedding", grad: torch.Tensor, new_rows: torch.Tensor) -> None:
    if not bool(torch.isfinite(grad).all()):
        raise FloatingPointError(f"NaN or Inf in the gradient of NodeEmbedding {emb.name!r}; the table and "
                                 f"optimizer state were left as they were before this batch")
    if not bool(torch.isfinite(new_rows).all()):
        raise FloatingPointError(f"the update of NodeEmbedding {emb.name!r} produced NaN or Inf (rows or state "
                                 f"overflowed); the table and optimizer state were left as they were")


def commit_pending(emb: "NodeEmbedding", opt: "SparseOptimizer") -> None:
    """Commit every batch of ``emb`` handed out since the last step (usually exactly one)."""
    if emb.writer is not None:
        emb.writer.check()  # a failed write-back surfaces here, at the next step()
    slots = [s for s in emb.pending if s.leaf.grad is not None]
    if not slots:
        return
    t0 = time.perf_counter()
    modes = {s.mode for s in slots}
    if len(modes) != 1:
        raise RuntimeError(f"batches of {emb.name!r} from loaders of different modes {sorted(modes)} pending in "
                           f"one step; call opt.step() between them")
    mode = modes.pop()
    repatched = 0
    if mode == "oac":
        for s in slots:  # normally nothing: only a second next() before step() makes rows stale here
            repatched += int(emb.log.patch(s.ids_dev, s.rows, s.rv))
    ids, ids_dev, rows, grad = _merge(slots)
    with torch.no_grad():
        new = opt.update_rows(rows, grad, emb.embedding_dim)
        if any(s.check_finite for s in slots):
            _check_finite(emb, grad, new)
        step = emb.step_count
        if mode == "sync":
            emb.flush()  # an earlier pipelined loader's writes come first
            host = new.cpu() if new.device.type != "cpu" else new
            emb.store.write(ids, host)
            emb.clock.publish(step)
        else:
            if mode == "oac":
                emb.log.append(step, ids_dev, new)
            payload = new if mode == "oac" else new - rows
            (host,), event = emb.transfer.to_host(payload)
            emb.writer.submit(step, ids, host, event, "write" if mode == "oac" else "add")
    emb.step_count += 1
    emb.pending = [s for s in emb.pending if s.leaf.grad is None]
    if any(emb.current is s for s in slots):
        emb.current = None
    for s in slots:
        if s.rv is not None:
            emb.clock.end_read(s.rv)
    if mode == "oac":
        emb.log.drop_through(emb.clock.horizon())
    elapsed = time.perf_counter() - t0
    for s in slots:
        for hook in s.on_commit:
            hook(s, elapsed, repatched)
