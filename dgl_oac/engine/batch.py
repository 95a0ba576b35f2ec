"""The per-batch records: one batch's rows of one table, from the gather to the commit.

A batch of one table is three records, each with its own writers:

* :class:`TableRows`, what the gather produced (:mod:`dgl_oac.engine.gather`; ``emb(ids)``'s fresh read,
  :meth:`~dgl_oac.engine.pipeline.TablePipeline.read_now`): ``ids``, ``ids_dev``, ``rows``, ``rv``, ``event``,
  ``ticket``. Frozen: no field is reassigned; the ``rows`` tensor's contents are patched in place on the caller's
  thread (validation, refresh, a hook's catch-up);
* :class:`HandedOut`, made once at hand-out (:mod:`dgl_oac.engine.handout`, or ``read_now``) over the gathered
  record: ``kind``, ``check_finite``, ``hook``, ``leaf_ref``, ``listener``. Frozen too. Its table's
  :class:`~dgl_oac.engine.pending.PendingBatches` holds it until it is released;
* :class:`BatchState`, what changes while the batch is pending (the handed-out record's ``state``), one writer a
  field:

  * ``seen``: :class:`~dgl_oac.engine.refresh.Refresh`, on the caller's thread (its first value is the
    hand-out's);
  * ``claimed``: :meth:`PendingBatches.claim <dgl_oac.engine.pending.PendingBatches.claim>`, on the caller's
    thread;
  * ``reads``: :meth:`PendingBatches.read <dgl_oac.engine.pending.PendingBatches.read>`, on the caller's thread,
    under its lock;
  * ``leaf``, ``released`` (and each ``Read.leaf``): :class:`~dgl_oac.engine.pending.PendingBatches`, on any
    thread (grad hooks, finalizers, release), under its lock.

Its commit is reported to its ``listener`` (:class:`CommitListener`, the loader's), by the step that commits it
(:mod:`dgl_oac.engine.step_plan`). The read's open/closed state is the ``ticket``'s, closed once by
:class:`~dgl_oac.engine.table.Reads`.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass
from functools import cached_property
from typing import Any, List, Optional, Protocol, Tuple, Union

import torch

# A batch's kind says how its rows were read, which decides how the commit brings them up to date:
# "sync"  read from the table after every committed step was in it (fresh);
# "oac"   read ahead, then validated and patched from the write log at hand-out (fresh);
# "async" read ahead and used as read (possibly stale; its commit adds new - old, or, with a hook, brings the
#         rows up to date and overwrites them: dgl_oac.engine.hooks).

#: ``(pos, grad, whole, segments)`` of one leaf with a gradient (:meth:`HandedOut.contributions`)
Contribution = Tuple[Optional[torch.Tensor], torch.Tensor, bool, Optional[Tuple[torch.Tensor, torch.Tensor]]]


@dataclass(eq=False)
class Read:
    """One ``emb(ids)`` call over rows of a batch: its own leaf, so its gradient counts once per occurrence
    (DGL's trace per call; :mod:`dgl_oac.engine.combine`). ``leaf`` is written by its batch's
    :class:`~dgl_oac.engine.pending.PendingBatches` alone, under its lock."""

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


@dataclass(frozen=True, eq=False)  # identity, not tensor comparison
class TableRows:
    """One batch's rows of one table, as gathered (see the module docstring)."""

    ids: torch.Tensor             # int64[n], CPU, unique
    ids_dev: torch.Tensor         # int64[n], device
    rows: torch.Tensor            # float32[n, D+S], device: value ‖ optimizer state
    rv: Optional[int]             # read version (the ticket's, kept after the read closed: catch-up starts there)
    event: Any = None             # torch.cuda.Event of the host->device copy (None on CPU)
    #: its read (dgl_oac.engine.table.ReadTicket), open until hand-out or release; None: made outside a table
    ticket: Any = None

    @property
    def registration(self) -> Any:
        """Distributed: the read's registration with the rows' owners (None otherwise)."""
        return None if self.ticket is None else self.ticket.registration

    @cached_property
    def _order(self) -> torch.Tensor:
        """``int64[n]``, CPU: argsort of ``ids`` (derived, not a field: made by the first :meth:`positions`)."""
        return torch.argsort(self.ids)

    def positions(self, ids: torch.Tensor) -> Optional[torch.Tensor]:
        """Positions of ``ids: int64[m], CPU`` among this batch's ids, or None if any is missing."""
        ordered = self.ids[self._order]
        if not ordered.numel():
            return None if ids.numel() else ids
        ids = ids.contiguous()  # searchsorted warns (and copies anyway) for a non-contiguous view
        pos = torch.searchsorted(ordered, ids).clamp_max(ordered.numel() - 1)
        if bool((ordered[pos] != ids).any()):
            return None
        return self._order[pos]


class BatchState:
    """What changes while a handed-out batch is pending; each field has one writer (the module docstring)."""

    __slots__ = ("seen", "claimed", "reads", "leaf", "released")

    def __init__(self, seen: Optional[int], leaf: Optional[torch.Tensor] = None) -> None:
        self.seen = seen              # rows are current through this step (None: async, never refreshed)
        self.claimed = False          # an emb(input_nodes) call returned the leaf (later calls get a Read each)
        self.reads: List[Read] = []   # emb(ids) calls over these rows, in call order
        self.leaf = leaf              # the hand-out leaf, held strongly once it has a gradient (step() finds it)
        self.released = False


class CommitListener(Protocol):
    """Who hears of a batch's commit (a loader's epoch: its stats). Registered per batch at hand-out
    (:func:`~dgl_oac.engine.handout.validate_rows`); called once, on the caller's thread, after the step wrote it."""

    def committed(self, batch: "HandedOut", seconds: float, repatched: Union[int, torch.Tensor]) -> None:
        """``batch`` was committed ``seconds`` after its step took it; ``repatched``: rows brought up to date at
        the commit (:data:`dgl_oac.engine.refresh.Count`: an int, or a 0-d device tensor, read without a sync)."""


@dataclass(frozen=True, eq=False)  # identity, not tensor comparison
class HandedOut:
    """A batch of one table as handed out: the gathered rows and what the hand-out decided, made once (see the
    module docstring)."""

    gathered: TableRows
    kind: str                     # "sync", "oac" or "async" (above)
    check_finite: bool
    state: BatchState             # the mutable part, one writer a field (the module docstring)
    hook: Any = None              # async only: its dgl_oac.engine.hooks.BatchHook (None: naive async)
    leaf_ref: Optional["weakref.ref[torch.Tensor]"] = None  # the requires-grad leaf the model reads (None: reads)
    listener: Optional[CommitListener] = None  # told of its commit (None: not counted, e.g. a batch's 2nd table)

    # the gathered record's fields the stages after hand-out read
    @property
    def ids(self) -> torch.Tensor:
        return self.gathered.ids

    @property
    def ids_dev(self) -> torch.Tensor:
        return self.gathered.ids_dev

    @property
    def rows(self) -> torch.Tensor:
        return self.gathered.rows

    @property
    def rv(self) -> Optional[int]:
        return self.gathered.rv

    @property
    def registration(self) -> Any:
        return self.gathered.registration

    @property
    def adds(self) -> bool:
        """Its commit adds ``new - old`` to the table (naive async) instead of overwriting the rows."""
        return self.kind == "async" and self.hook is None

    def live_leaf(self) -> Optional[torch.Tensor]:
        """The hand-out leaf, if it is still alive."""
        leaf = self.state.leaf
        if leaf is not None:
            return leaf
        return None if self.leaf_ref is None else self.leaf_ref()

    def grad(self) -> Optional[torch.Tensor]:
        """The hand-out leaf's gradient ``float32[n, D]`` on the device, or None while backward has not reached it."""
        leaf = self.live_leaf()
        return None if leaf is None else leaf.grad

    def has_grad(self) -> bool:
        """Whether any of its leaves (the hand-out leaf or a read's) has a gradient: the next step commits it."""
        return self.grad() is not None or any(r.grad() is not None for r in self.state.reads)

    def alive(self) -> bool:
        """Whether any of its leaves can still get a gradient (or holds one)."""
        return self.live_leaf() is not None or any(r.leaf is not None or r.leaf_ref() is not None
                                                   for r in self.state.reads)

    def contributions(self) -> List[Contribution]:
        """``(pos, grad, whole, segments)`` of each leaf with a gradient: the hand-out leaf (``pos`` None), then
        the reads (:class:`Read`)."""
        out: List[Contribution] = []
        g = self.grad()
        if g is not None:
            out.append((None, g, True, None))
        for r in self.state.reads:
            g = r.grad()
            if g is not None:
                out.append((r.pos, g, r.whole, r.segments))
        return out
