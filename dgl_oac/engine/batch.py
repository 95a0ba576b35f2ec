"""The per-batch type: one batch's rows of one table, from the gather to the commit.

A :class:`TableRows` is made by the gather (:mod:`dgl_oac.engine.gather`), validated and given a leaf at hand-out
(:mod:`dgl_oac.engine.handout`), held by its table's :class:`~dgl_oac.engine.pending.PendingBatches` while pending,
and consumed by the commit (:mod:`dgl_oac.engine.commit`). Each field has one writer:

* the gather (it makes the object; immutable afterwards): ``ids``, ``ids_dev``, ``rows`` (the tensor; its
  contents are patched in place on the caller's thread), ``rv``, ``event``, ``ticket``;
* the hand-out, on the caller's thread, once, before the batch is registered: ``kind``, ``check_finite``,
  ``on_commit``, ``hook``, ``leaf_ref``; afterwards the caller's thread alone: ``seen`` (hand-out, refresh),
  ``claimed`` and ``reads`` (``emb(ids)`` calls);
* :class:`~dgl_oac.engine.pending.PendingBatches`, from any thread (grad hooks, finalizers), under its lock:
  ``leaf``, ``released`` (and ``Read.leaf``).

The read's open/closed state is the ``ticket``'s, closed once by :class:`~dgl_oac.engine.reads.Reads`.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, List, Optional, Tuple

import torch

#: How a batch's rows were read, which decides how the commit brings them up to date:
#: ``"sync"``  read from the table after every committed step was in it (fresh);
#: ``"oac"``   read ahead, then validated and patched from the write log at hand-out (fresh);
#: ``"async"`` read ahead and used as read (possibly stale; its commit adds ``new - old``, or, with a
#:            ``hook``, brings the rows up to date and overwrites them: :mod:`dgl_oac.engine.hooks`).
KINDS = ("sync", "oac", "async")


@dataclass(eq=False)
class Read:
    """One ``emb(ids)`` call over rows of a batch: its own leaf, so its gradient counts once per occurrence
    (DGL's trace per call; :mod:`dgl_oac.engine.combine`)."""

    pos: Optional[torch.Tensor]  # int64[m], device: the batch's rows it read, repeats allowed (None: all, in order)
    whole: bool                  # every row of the batch occurs in ``pos``
    leaf_ref: "weakref.ref[torch.Tensor]"
    leaf: Optional[torch.Tensor] = None  # held strongly once it has a gradient (so step() still finds it)
    #: where the read knew them already (``emb(ids)`` of fresh ids: its sort): ``order: int64[m]`` on the device, a
    #: stable argsort of ``pos``, and ``counts: int64[n]`` on the host (CPU), occurrences of each batch row (the
    #: commit plans its segment sums from them without a host sync)
    segments: Optional[Tuple[torch.Tensor, torch.Tensor]] = None

    def grad(self) -> Optional[torch.Tensor]:
        leaf = self.leaf if self.leaf is not None else self.leaf_ref()
        return None if leaf is None else leaf.grad


@dataclass(eq=False)  # identity, not tensor comparison
class TableRows:
    """One batch's rows of one table."""

    ids: torch.Tensor             # int64[n], CPU, unique
    ids_dev: torch.Tensor         # int64[n], device
    rows: torch.Tensor            # float32[n, D+S], device: value ‖ optimizer state
    rv: Optional[int]             # read version (the ticket's, kept after the read closed: catch-up starts there)
    event: Any = None             # torch.cuda.Event of the host->device copy (None on CPU)
    kind: str = "sync"
    seen: Optional[int] = None    # rows are current through this step (None: async, never refreshed)
    check_finite: bool = True
    hook: Any = None              # async only: its dgl_oac.engine.hooks.BatchHook (None: naive async)
    on_commit: Optional[Callable[["TableRows", float, int], None]] = None
    leaf_ref: Optional["weakref.ref[torch.Tensor]"] = None  # the requires-grad leaf the model reads
    leaf: Optional[torch.Tensor] = None  # held strongly once it has a gradient (so step() still finds it)
    claimed: bool = False         # an emb(input_nodes) call returned the leaf (later calls get a Read of their own)
    reads: List[Read] = field(default_factory=list)  # emb(ids) calls over these rows, in call order
    released: bool = False
    ticket: Any = None            # its read (dgl_oac.engine.reads.ReadTicket), open until hand-out or release
    _order: Optional[torch.Tensor] = field(default=None, repr=False)  # lazily: argsort of ids

    @property
    def registration(self) -> Any:
        """Distributed: the read's registration with the rows' owners (None otherwise)."""
        return None if self.ticket is None else self.ticket.registration

    @property
    def adds(self) -> bool:
        """Its commit adds ``new - old`` to the table (naive async) instead of overwriting the rows."""
        return self.kind == "async" and self.hook is None

    def live_leaf(self) -> Optional[torch.Tensor]:
        """The leaf, if it is still alive."""
        if self.leaf is not None:
            return self.leaf
        return None if self.leaf_ref is None else self.leaf_ref()

    def grad(self) -> Optional[torch.Tensor]:
        """The hand-out leaf's gradient ``float32[n, D]`` on the device, or None while backward has not reached it."""
        leaf = self.live_leaf()
        return None if leaf is None else leaf.grad

    def has_grad(self) -> bool:
        """Whether any of its leaves (the hand-out leaf or a read's) has a gradient: the next step commits it."""
        return self.grad() is not None or any(r.grad() is not None for r in self.reads)

    def alive(self) -> bool:
        """Whether any of its leaves can still get a gradient (or holds one)."""
        return self.live_leaf() is not None or any(r.leaf is not None or r.leaf_ref() is not None for r in self.reads)

    def contributions(self) -> List[Tuple[Optional[torch.Tensor], torch.Tensor, bool,
                                          Optional[Tuple[torch.Tensor, torch.Tensor]]]]:
        """``(pos, grad, whole, segments)`` of each leaf with a gradient: the hand-out leaf (``pos`` None), then
        the reads (:class:`Read`)."""
        out: List[Tuple[Optional[torch.Tensor], torch.Tensor, bool, Optional[Tuple[torch.Tensor, torch.Tensor]]]]
        out = []
        g = self.grad()
        if g is not None:
            out.append((None, g, True, None))
        for r in self.reads:
            g = r.grad()
            if g is not None:
                out.append((r.pos, g, r.whole, r.segments))
        return out

    def positions(self, ids: torch.Tensor) -> Optional[torch.Tensor]:
        """Positions of ``ids: int64[m], CPU`` among this batch's ids, or None if any is missing."""
        if self._order is None:
            self._order = torch.argsort(self.ids)
        ordered = self.ids[self._order]
        if not ordered.numel():
            return None if ids.numel() else ids
        ids = ids.contiguous()  # searchsorted warns (and copies anyway) for a non-contiguous view
        pos = torch.searchsorted(ordered, ids).clamp_max(ordered.numel() - 1)
        if bool((ordered[pos] != ids).any()):
            return None
        return self._order[pos]
