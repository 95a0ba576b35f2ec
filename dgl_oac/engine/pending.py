"""The batches of one table that were handed out (or read by ``emb(ids)``) and are not committed yet.

Owner of each pending batch's lifetime. A batch (:class:`~dgl_oac.engine.batch.HandedOut`) is held from
hand-out (:meth:`PendingBatches.register`) until it is committed, skipped by a failed step, or released because
no leaf of it can get a gradient any more (a ``weakref.finalize`` on each leaf: a batch the user dropped before
backward); never because another batch arrived. A leaf that got a gradient is held strongly (its
post-accumulate-grad hook) until a ``step()`` commits it: DGL's semantics, every read since the last ``step()`` is
committed by the next one, even if the caller dropped the batch after backward.

Threads: registration, reads, claims and lookups run on the caller's thread; the grad hooks run on autograd's
thread (the caller's on CPU) and finalizers on whichever thread drops the last reference. This owner is the one
writer of each batch's :class:`~dgl_oac.engine.batch.BatchState` but ``seen`` (:mod:`.refresh`'s): ``claimed``
on the caller's thread alone (:meth:`PendingBatches.claim`); ``reads``, ``leaf``, ``released`` and each
``Read.leaf``, which the hooks and finalizers share, under this owner's lock. What a released batch still owns
(its gathered rows buffer; its read closed at hand-out) is given back through ``on_release``, once.
"""
from __future__ import annotations

import functools
import threading
import weakref
from typing import Callable, Dict, List, Optional, Tuple

import torch

from .batch import HandedOut, Read, TableRows
from .runtime import finalizer


def _hold_leaf(owner_ref: "weakref.ref[PendingBatches]", batch_ref: "weakref.ref[HandedOut]",
               read_ref: "Optional[weakref.ref[Read]]", leaf: torch.Tensor) -> None:
    """Post-accumulate-grad hook: a leaf with a gradient must survive until ``step()`` commits it."""
    owner, batch = owner_ref(), batch_ref()
    if owner is not None and batch is not None:
        owner._hold(batch, None if read_ref is None else read_ref(), leaf)


def _leaf_died(owner_ref: "weakref.ref[PendingBatches]", batch_ref: "weakref.ref[HandedOut]") -> None:
    """Finalizer of each leaf of a batch: once none can get a gradient any more, the batch is released."""
    owner, batch = owner_ref(), batch_ref()
    if owner is not None and batch is not None and not batch.alive():
        owner.release(batch)


class PendingBatches:
    """The pending batches of one table, in read order (see the module docstring)."""

    def __init__(self, dim: int, on_release: Callable[[TableRows], None]) -> None:
        self.dim = dim
        self._on_release = on_release  # recycles the gathered rows' buffer (called once per batch)
        self._batches: List[HandedOut] = []
        self._finalizers: Dict[int, "weakref.finalize"] = {}  # id(batch) -> finalizer of its hand-out leaf
        self._lock = threading.RLock()  # re-entered if a finalizer runs inside a locked section (a GC pass)

    def register(self, batch: HandedOut) -> None:
        """Hold ``batch`` for the next ``step()`` while its hand-out leaf (``batch.leaf_ref``, alive now; None:
        only reads of it, made with :meth:`read`) can still get a gradient."""
        me = weakref.ref(self)
        leaf = None if batch.leaf_ref is None else batch.leaf_ref()
        if leaf is not None:
            leaf.register_post_accumulate_grad_hook(functools.partial(_hold_leaf, me, weakref.ref(batch), None))
        with self._lock:
            self._batches.append(batch)
            if leaf is not None:
                self._finalizers[id(batch)] = finalizer(leaf, _leaf_died, me, weakref.ref(batch))

    def read(self, batch: HandedOut, pos: Optional[torch.Tensor], whole: bool,
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
        finalizer(leaf, _leaf_died, me, weakref.ref(batch))
        with self._lock:
            batch.state.reads.append(read)
        return leaf

    def claim(self, batch: HandedOut) -> bool:
        """Caller's thread: whether this is the first ``emb(input_nodes)`` call of ``batch``, whose rows are the
        hand-out leaf (a later call is a read of its own: DGL averages over every call's occurrences)."""
        first = not batch.state.claimed
        batch.state.claimed = True
        return first

    def _hold(self, batch: HandedOut, read: Optional[Read], leaf: torch.Tensor) -> None:
        with self._lock:
            if batch.state.released:
                return
            if read is None:
                batch.state.leaf = leaf
            else:
                read.leaf = leaf

    def all(self) -> List[HandedOut]:
        """A snapshot of the pending batches, in read order."""
        with self._lock:
            return list(self._batches)

    def find(self, ids: torch.Tensor) -> Optional[HandedOut]:
        """The pending batch whose ids tensor *is* ``ids`` (the loader's ``input_nodes``), newest first."""
        for b in reversed(self.all()):
            if (ids is b.ids or ids is b.ids_dev) and b.live_leaf() is not None:
                return b
        return None

    def release_from(self, gathered: TableRows) -> bool:
        """Release the pending batch handed out from the ``gathered`` record; False if there is none."""
        batch = next((b for b in self.all() if b.gathered is gathered), None)
        if batch is not None:
            self.release(batch)
        return batch is not None

    def ready(self) -> List[HandedOut]:
        """Pending batches with a gradient, in read order: what the next ``step()`` commits."""
        return [b for b in self.all() if b.has_grad()]

    def release(self, batch: HandedOut) -> None:
        """Forget ``batch`` and give back what it owns. Idempotent; any thread."""
        state = batch.state
        with self._lock:
            if state.released:
                return
            state.released = True
            self._batches = [b for b in self._batches if b is not batch]
            fin = self._finalizers.pop(id(batch), None)
            # the leaves are dropped after the lock: the last reference to a leaf runs its finalizer, which
            # may release another batch (and take this lock) on this very thread
            dropped = [state.leaf] + [r.leaf for r in state.reads]
            state.leaf = None
            for r in state.reads:
                r.leaf = None
        if fin is not None:
            fin.detach()
        del dropped
        self._on_release(batch.gathered)
