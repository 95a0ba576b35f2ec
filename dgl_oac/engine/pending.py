"""The batches of one table that were handed out (or read by ``emb(ids)``) and are not committed yet.

Owner of each pending batch's lifetime. A batch is held from hand-out (:meth:`PendingBatches.register`) until
it is committed, skipped by a failed step, or released because no leaf of it can get a gradient any more (a
``weakref.finalize`` on each leaf: a batch the user dropped before backward); never because another batch
arrived. A leaf that got a gradient is held strongly (its post-accumulate-grad hook) until a ``step()``
commits it: DGL's semantics, every read since the last ``step()`` is committed by the next one, even if the
caller dropped the batch after backward.

Threads: registration, reads and lookups run on the caller's thread; the grad hooks run on autograd's thread
(the caller's on CPU) and finalizers on whichever thread drops the last reference. So the fields they share,
``TableRows.leaf``, ``Read.leaf`` and ``TableRows.released``, are written only here, under this owner's lock.
What a released batch still owns (its read, its rows buffer) is given back through ``on_release``, once.
"""
from __future__ import annotations

import functools
import threading
import weakref
from typing import Callable, Dict, List, Optional, Tuple

import torch

from .batch import Read, TableRows


def _hold_leaf(owner_ref: "weakref.ref[PendingBatches]", batch_ref: "weakref.ref[TableRows]",
               read_ref: "Optional[weakref.ref[Read]]", leaf: torch.Tensor) -> None:
    """Post-accumulate-grad hook: a leaf with a gradient must survive until ``step()`` commits it."""
    owner, batch = owner_ref(), batch_ref()
    if owner is not None and batch is not None:
        owner._hold(batch, None if read_ref is None else read_ref(), leaf)


def _leaf_died(owner_ref: "weakref.ref[PendingBatches]", batch_ref: "weakref.ref[TableRows]") -> None:
    """Finalizer of each leaf of a batch: once none can get a gradient any more, the batch is released."""
    owner, batch = owner_ref(), batch_ref()
    if owner is not None and batch is not None and not batch.alive():
        owner.release(batch)


class PendingBatches:
    """The pending batches of one table, in read order (see the module docstring)."""

    def __init__(self, dim: int, on_release: Callable[[TableRows], None]) -> None:
        self.dim = dim
        self._on_release = on_release  # closes the batch's read, recycles its rows (called once per batch)
        self._batches: List[TableRows] = []
        self._finalizers: Dict[int, "weakref.finalize"] = {}  # id(batch) -> finalizer of its hand-out leaf
        self._lock = threading.RLock()  # re-entered if a finalizer runs inside a locked section (a GC pass)

    def register(self, batch: TableRows, leaf: Optional[torch.Tensor]) -> None:
        """Hold ``batch`` for the next ``step()`` while ``leaf`` (its hand-out leaf; None: only reads of it,
        made with :meth:`read`) can still get a gradient."""
        me = weakref.ref(self)
        if leaf is not None:
            batch.leaf_ref = weakref.ref(leaf)
            leaf.register_post_accumulate_grad_hook(functools.partial(_hold_leaf, me, weakref.ref(batch), None))
        with self._lock:
            self._batches.append(batch)
            if leaf is not None:
                self._finalizers[id(batch)] = weakref.finalize(leaf, _leaf_died, me, weakref.ref(batch))

    def read(self, batch: TableRows, pos: Optional[torch.Tensor], whole: bool,
             segments: Optional[Tuple[torch.Tensor, torch.Tensor]] = None) -> torch.Tensor:
        """A new leaf ``float32[m, D]`` (the batch's device) of the rows ``pos: int64[m]`` of a pending ``batch``
        (None: all of them), as they are now: one ``emb(ids)`` call, its own occurrence of each row (DGL's trace
        per call). It keeps the batch pending until the next ``step()`` once it has a gradient. ``segments``:
        ``(order, counts)`` of ``pos`` when the caller has them (:class:`~.batch.Read`)."""
        base = batch.live_leaf()
        values = base.detach() if base is not None else batch.rows[:, : self.dim]
        leaf = (values.clone() if pos is None else values.index_select(0, pos)).requires_grad_(True)
        read = Read(pos, whole, weakref.ref(leaf), segments=segments)
        me = weakref.ref(self)
        leaf.register_post_accumulate_grad_hook(functools.partial(_hold_leaf, me, weakref.ref(batch),
                                                                  weakref.ref(read)))
        weakref.finalize(leaf, _leaf_died, me, weakref.ref(batch))
        batch.reads.append(read)
        return leaf

    def _hold(self, batch: TableRows, read: Optional[Read], leaf: torch.Tensor) -> None:
        with self._lock:
            if batch.released:
                return
            if read is None:
                batch.leaf = leaf
            else:
                read.leaf = leaf

    def all(self) -> List[TableRows]:
        """A snapshot of the pending batches, in read order."""
        with self._lock:
            return list(self._batches)

    def find(self, ids: torch.Tensor) -> Optional[TableRows]:
        """The pending batch whose ids tensor *is* ``ids`` (the loader's ``input_nodes``), newest first."""
        for b in reversed(self.all()):
            if (ids is b.ids or ids is b.ids_dev) and b.live_leaf() is not None:
                return b
        return None

    def ready(self) -> List[TableRows]:
        """Pending batches with a gradient, in read order: what the next ``step()`` commits."""
        return [b for b in self.all() if b.has_grad()]

    def release(self, batch: TableRows) -> None:
        """Forget ``batch`` (pending or not: a gathered batch never handed out) and give back what it owns.
        Idempotent; any thread."""
        with self._lock:
            if batch.released:
                return
            batch.released = True
            self._batches = [b for b in self._batches if b is not batch]
            fin = self._finalizers.pop(id(batch), None)
            # the leaves are dropped after the lock: the last reference to a leaf runs its finalizer, which
            # may release another batch (and take this lock) on this very thread
            dropped = [batch.leaf] + [r.leaf for r in batch.reads]
            batch.leaf = None
            for r in batch.reads:
                r.leaf = None
        if fin is not None:
            fin.detach()
        del dropped
        self._on_release(batch)
