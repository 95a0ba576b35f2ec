"""A table's pipeline: the batches in flight through one table, from the gather to their release, behind
:class:`TablePipeline`, the one door to a table's engine state.

A batch's rows move through it in this order: :func:`gather_batch_rows` reads them at the current version and starts
their copy (gather thread); :func:`validate_rows` patches them from the write log and hands them out as leaves
(caller); the table's pending batches hold them until ``step()`` takes them, or they are released;
:meth:`TablePipeline.refresh` brings a batch held across later steps up to date at commit; :meth:`TablePipeline.commit`
writes the step (:func:`~dgl_oac.engine.table.write_step`). The records a batch carries on the way
(:class:`TableRows`, :class:`HandedOut`, :class:`BatchState`), the commit listener and the baselines' hook are
the interfaces the layers above plug into.

The per-batch records: one batch's rows of one table, from the gather to the commit.

A batch of one table is three records, each with its own writers:

* :class:`TableRows`, what the gather produced (:mod:`dgl_oac.engine.pipeline`; ``emb(ids)``'s fresh read,
  :meth:`~dgl_oac.engine.pipeline.TablePipeline.read_now`): ``ids``, ``ids_dev``, ``rows``, ``rv``, ``event``,
  ``ticket``. Frozen: no field is reassigned; the ``rows`` tensor's contents are patched in place on the caller's
  thread (validation, refresh, a hook's catch-up);
* :class:`HandedOut`, made once at hand-out (:mod:`dgl_oac.engine.pipeline`, or ``read_now``) over the gathered
  record: ``kind``, ``check_finite``, ``hook``, ``leaf_ref``, ``listener``. Frozen too. Its table's
  :class:`~dgl_oac.engine.pipeline.TablePipeline` holds it pending until it is released;
* :class:`BatchState`, what changes while the batch is pending (the handed-out record's ``state``), one writer a
  field:

  * ``seen``: :meth:`~dgl_oac.engine.pipeline.TablePipeline.refresh`, on the caller's thread (its first value is the
    hand-out's);
  * ``claimed``: :meth:`~dgl_oac.engine.pipeline.TablePipeline.read_held`, on the caller's thread;
  * ``reads``: :meth:`~dgl_oac.engine.pipeline.TablePipeline.read`, on the caller's thread, under the table's
    pending lock;
  * ``leaf``, ``released`` (and each ``Read.leaf``): :class:`~dgl_oac.engine.pipeline.TablePipeline`, on any
    thread (grad hooks, finalizers, release), under that lock.

Its commit is reported to its ``listener`` (:class:`CommitListener`, the loader's), by the step that commits it
(:mod:`dgl_oac.engine.step`). The read's open/closed state is the ``ticket``'s, closed once by
:class:`~dgl_oac.engine.table.Reads`.

Bring a held batch's rows up to the newest step, at commit (or when ``emb(ids)`` reads it again).

A batch's read closes at hand-out (:mod:`dgl_oac.engine.table`), so nothing a user holds pins the write log.
Instead, a batch held across later steps is refreshed on the caller's thread: rows written after the step it
last saw (``BatchState.seen``, written here alone) are replaced from the write log while the log covers that
step, else the rows are re-read after a flush. A distributed table always re-reads: its log holds only what other
owners forwarded for registered reads. Async batches are never refreshed (they compute at what they read), except by
their hook's :meth:`TablePipeline.catch_up` (:mod:`dgl_oac.engine.pipeline`).

The one interface through which a baseline changes what a batch computes: a :class:`BatchHook`.

The engine's exact modes need none. A batch of ``mode="async"`` may carry a hook, given per table by its loader
(the baselines implement async's rules for stale rows as hooks; the engine knows none of them). A batch
with a hook is overwritten and logged at commit like an oac batch (naive async, without one, adds ``new - old``).
The engine calls a hook at three points, all on the caller's thread and device stream:

* hand-out (:mod:`dgl_oac.engine.pipeline`), after the copy is waited for and before the leaf is made:
  :meth:`BatchHook.at_handout` may change the values the batch computes at;
* commit (:mod:`dgl_oac.engine.step`), before the kernel: :meth:`BatchHook.before_kernel` brings the
  step's batches to the current rows (``table.catch_up``) and may rescale their gradients;
* commit, after the kernel, before anything is written: :meth:`BatchHook.after_kernel` observes the step.

What a hook may use of its table is :class:`HookTable`; it never writes the table, the log or the clock.

The batches of one table that were handed out (or read by ``emb(ids)``) and are not committed yet.

Owner of each pending batch's lifetime. A batch (:class:`~dgl_oac.engine.pipeline.HandedOut`) is held from
hand-out (:meth:`TablePipeline.register`) until it is committed, skipped by a failed step, or released because
no leaf of it can get a gradient any more (a ``weakref.finalize`` on each leaf: a batch the user dropped before
backward); never because another batch arrived. A leaf that got a gradient is held strongly (its
post-accumulate-grad hook) until a ``step()`` commits it: DGL's semantics, every read since the last ``step()`` is
committed by the next one, even if the caller dropped the batch after backward.

Threads: registration, reads, claims and lookups run on the caller's thread; the grad hooks run on autograd's
thread (the caller's on CPU) and finalizers on whichever thread drops the last reference. This owner is the one
writer of each batch's :class:`~dgl_oac.engine.pipeline.BatchState` but ``seen`` (:mod:`.pipeline`'s): ``claimed``
on the caller's thread alone (:meth:`TablePipeline.read_held`); ``reads``, ``leaf``, ``released`` and each
``Read.leaf``, which the hooks and finalizers share, under this owner's lock. What a released batch still owns
(its gathered rows buffer; its read closed at hand-out) is given back once.

A failed write-back stays with the table until it is closed: every later :meth:`TablePipeline.check` raises its
error in the caller, because the table misses the steps that were queued behind it.

``TablePipeline``: everything in flight for one table, the one door to it.

A :class:`~dgl_oac.embedding.NodeEmbedding` has exactly one. The gather, the hand-out, the committers, the
loader and checkpoints call its methods; none of them assigns its fields. Its parts, in data-flow order:

* the clock (:class:`~dgl_oac.engine.table.VersionClock`): which steps are in the table, which reads are open;
* :class:`~dgl_oac.engine.table.Reads`: opens a read at gather, closes it once (at hand-out, or release);
* the transfer (:class:`~dgl_oac.engine.transfer.Transfer`): host <-> device copies, made by :meth:`prepare`;
* the pending batches: handed out and not committed, and their leaves (:meth:`TablePipeline.register`,
  :meth:`TablePipeline.release`);
* :meth:`~dgl_oac.engine.pipeline.TablePipeline.refresh`: brings a held batch up to the newest step at commit;
* the step counter (``steps``), counted by :meth:`TablePipeline.commit` through the one write path
  (:func:`~dgl_oac.engine.table.write_step`);
* the leases (:meth:`TablePipeline.lease`, :meth:`TablePipeline.end_lease`): the write-back thread
  (:class:`~dgl_oac.engine.table.WriteBack`) and the write log, while at least one epoch reads ahead.

Callers read ``steps``, ``log`` and ``writer`` and never assign them; everything else goes through a method here.

Lifetimes (what releases what):

* a read opened by a gather is closed when its batch is handed out (:meth:`TablePipeline.register`): its rows
  are current then (validated, or read fresh), and a batch held across later steps is brought up to date at
  commit (:mod:`.pipeline`). So nothing a user holds (a peeked batch, a leaf kept for later) pins the write log:
  it holds only the steps the batches read ahead and not yet handed out can miss, at most the pipeline's depth;
* a batch is released when it is committed, skipped, or its leaves died without a gradient (:mod:`.pipeline`),
  never because another batch arrived; releasing it closes its read and recycles its rows buffer;
* the write-back thread and the write log live while at least one epoch reads ahead (:meth:`TablePipeline.lease`
  at its start, :meth:`TablePipeline.end_lease` at its end, whatever ends it); the last lease applies every queued
  step, stops the thread and retires the log, whose memory the next lease reuses. Without a lease, commits write
  through and held batches are re-read: sync's code path.

A distributed table (``dist``: :class:`dgl_oac.distributed.inflight.DistTable`) registers every read with the
rows' owners (:mod:`.table`), logs the rows other owners forward with each step (:mod:`.table`), writes
its own rows through (no write-back thread: an owner's rows must be in the shared table when the step ends on
every rank), and refreshes held batches by re-reading them (:mod:`.pipeline`).

Gather and copy: read a batch's rows from each CPU table and start their copy to the device.

Runs on the gather thread (pipelined modes) or at hand-out (sync, after a flush). For each table it opens a read
at the table's current version *before* touching the rows: every row written by a step <= that version is read
correctly; a row written later may be stale or torn and is replaced whole by validation (oac) or used as is
(async). The read stays open until the batch is released (see :mod:`dgl_oac.engine.pipeline`).

Reading ahead (the gather thread, ``read_ahead=True``): an out-of-core table's pages (a file larger than the
memory allows: :attr:`~dgl_oac.engine.table.RowStore.out_of_core`) for the whole batch are requested from the
disk together first (:meth:`~dgl_oac.engine.table.RowStore.read_ahead`), so a table larger than the
page cache is read at the disk's queue depth instead of one page fault at a time. Sync's gather at hand-out
does not read ahead: it reads its batch as it always did (after the previous step's write), which is the
baseline the pipelined modes are compared with.

Validate and hand out, on the caller's thread: patch a batch's rows and wrap them as leaves.

Runs inside ``next(loader)``, after the previous ``opt.step()`` (so the write log holds every committed step)
and before the caller's forward pass. Order per table: wait for the copy (device-side), patch stale rows
(oac), make the ``requires_grad`` leaf the model reads, register the batch for the next ``step()``.

Graph-agnostic: :func:`validate_rows` returns the leaves (with the batches registered) in the tables' order, and
the loader puts the leaves where its model reads them (:class:`dgl_oac.BatchLoader`: served by ``emb(ids)``; the
DGL frontend's :func:`dgl_oac.dgl_frontend.graph_source.hand_out`: attached to the sampled graphs).
"""
from __future__ import annotations

import functools
import threading
import time
import weakref
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Dict, List, NamedTuple, Optional, Protocol, Sequence, Tuple, Union

import torch

from ..config import logs_writes, normalize_device, resolve_check_finite
from ..device import rows as device_rows
from .runtime import finalizer
from .table import Reads, RowStore, VersionClock, WriteBack, WriteLog, check_ids, stable_sort, write_step
from .transfer import BufferPool, Transfer, pinned_empty, to_device_now


# ---- The per-batch records: one batch's rows of one table, from the gather to the commit

# A batch's kind says how its rows were read, which decides how the commit brings them up to date:
# "sync"  read from the table after every committed step was in it (fresh);
# "oac"   read ahead, then validated and patched from the write log at hand-out (fresh);
# "async" read ahead and used as read (possibly stale; its commit adds new - old, or, with a hook, brings the
#         rows up to date and overwrites them: dgl_oac.engine.pipeline).

#: ``(pos, grad, whole, segments)`` of one leaf with a gradient (:meth:`HandedOut.contributions`)
Contribution = Tuple[Optional[torch.Tensor], torch.Tensor, bool, Optional[Tuple[torch.Tensor, torch.Tensor]]]


@dataclass(eq=False)
class Read:
    """One ``emb(ids)`` call over rows of a batch: its own leaf, so its gradient counts once per occurrence
    (DGL's trace per call; :mod:`dgl_oac.engine.step`). ``leaf`` is written by its batch's
    :class:`~dgl_oac.engine.pipeline.TablePipeline` alone, under its pending lock."""

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
    (:func:`~dgl_oac.engine.pipeline.validate_rows`); called once, on the caller's thread, after the step wrote it."""

    def committed(self, batch: "HandedOut", seconds: float, repatched: Union[int, torch.Tensor]) -> None:
        """``batch`` was committed ``seconds`` after its step took it; ``repatched``: rows brought up to date at
        the commit (:data:`dgl_oac.engine.pipeline.Count`: an int, or a 0-d device tensor, read without a sync)."""


@dataclass(frozen=True, eq=False)  # identity, not tensor comparison
class HandedOut:
    """A batch of one table as handed out: the gathered rows and what the hand-out decided, made once (see the
    module docstring)."""

    gathered: TableRows
    kind: str                     # "sync", "oac" or "async" (above)
    check_finite: bool
    state: BatchState             # the mutable part, one writer a field (the module docstring)
    hook: Any = None              # async only: its dgl_oac.engine.pipeline.BatchHook (None: naive async)
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


#: A count of rows: an int where the host knows it, a 0-d tensor on the device where it does not (reading it would
#: make the host wait for the device: sum such counts as tensors, read them when reported).
Count = Union[int, torch.Tensor]


# ---- The one interface through which a baseline changes what a batch computes: a :class:`BatchHook`

class HookTable(Protocol):
    """What the engine offers a hook of its table (a :class:`~dgl_oac.engine.pipeline.TablePipeline`)."""

    name: str

    @property
    def steps(self) -> int:
        """Steps committed so far (the next step's number)."""

    def catch_up(self, batch: HandedOut) -> Count:
        """Bring an async batch's rows (read at ``batch.rv``) to the newest step; returns the rows replaced (an
        int, or a 0-d device tensor: counted without a host sync)."""

    def moved_since(self, batch: TableRows) -> Optional[torch.Tensor]:
        """``bool[n]`` (device): the batch's rows a step after its read version wrote (None: none can have)."""


class BatchHook(Protocol):
    """What one table's async batches do at hand-out and at commit (one hook per loader and table)."""

    #: what a user calls it in an error message
    name: str

    def at_handout(self, table: HookTable, batch: TableRows, leaf: torch.Tensor) -> None:
        """Change ``leaf: float32[n, D]`` (device, the values the gathered ``batch`` computes at) in place, or
        not."""

    def before_kernel(self, table: HookTable, batches: List[HandedOut]) -> Count:
        """Bring ``batches``' rows to the current rows (and change their gradients); returns the rows replaced."""

    def after_kernel(self, rows: torch.Tensor, new: torch.Tensor) -> None:
        """Observe the step: ``rows`` (current value ‖ state) and ``new``, ``float32[u, W]`` on the device."""


def hook_of(table_name: str, batches: Sequence[HandedOut]) -> Optional[BatchHook]:
    """The one hook of a step's batches (None: none has one). A step may mix them with sync reads (``emb(ids)``,
    current rows), not with another hook's or naive async batches (deltas)."""
    hooks = {id(b.hook): b.hook for b in batches if b.hook is not None}
    if len(hooks) > 1 or (hooks and any(b.adds for b in batches)):
        names = sorted({getattr(h, "name", type(h).__name__) for h in hooks.values()} |
                       ({"naive async"} if any(b.adds for b in batches) else set()))
        raise RuntimeError(f"one step of NodeEmbedding {table_name!r} commits async batches of different rules "
                           f"({', '.join(names)}); call step() after each loader's batch")
    return next(iter(hooks.values()), None)


# ---- TablePipeline: the one door to a table's engine state

def _hold_leaf(owner_ref: "weakref.ref[TablePipeline]", batch_ref: "weakref.ref[HandedOut]",
               read_ref: "Optional[weakref.ref[Read]]", leaf: torch.Tensor) -> None:
    """Post-accumulate-grad hook: a leaf with a gradient must survive until ``step()`` commits it."""
    owner, batch = owner_ref(), batch_ref()
    if owner is not None and batch is not None:
        owner._hold(batch, None if read_ref is None else read_ref(), leaf)


def _leaf_died(owner_ref: "weakref.ref[TablePipeline]", batch_ref: "weakref.ref[HandedOut]") -> None:
    """Finalizer of each leaf of a batch: once none can get a gradient any more, the batch is released."""
    owner, batch = owner_ref(), batch_ref()
    if owner is not None and batch is not None and not batch.alive():
        owner.release(batch)


class TablePipeline:
    """Per-table pipeline state and its operations (see the module docstring)."""

    def __init__(self, name: str, store: RowStore, dist: Any = None) -> None:
        self.name = name
        self.store = store
        self.dist = dist  # a distributed table's DistTable (registry, owner book); None in one process
        self.clock = VersionClock()
        store.serve_versions(self.clock.wait_applied)  # a shard's owner serves a read at step t once t is applied
        self.transfer: Optional[Transfer] = None  # made by prepare(): the device is the first loader's
        # CPU buffers for the rows of reads and kernels outside a loader (emb(ids), its step): reused, so a
        # step does not map and fault in tens of MB afresh (a loader's come from its Transfer's pool)
        self.host_rows = BufferPool()
        self.check_finite: Optional[bool] = None  # the last loader's (prepare()); None: the device's default
        self.reads = Reads(self.clock, dist)
        self.queued_reads = 0  # batches a loader queued for its gather thread, not yet taken (queue_reads)
        self.steps = 0  # steps committed so far (= the next step's number); commit() alone counts them
        # leased by the epochs that read ahead (lease / end_lease): the write log (oac, async with a hook), on the
        # compute device, and the write-back thread (not for a distributed table, whose owners write through)
        self.log: Optional[WriteLog] = None
        self.writer: Optional[WriteBack] = None
        self._spare_log: Optional[WriteLog] = None  # the last lease's log, kept for its memory
        self._leases = 0
        self._lease_mode = ""
        self._busy_s = 0.0  # busy seconds of write-back threads already stopped
        self._failed: Optional[WriteBack] = None  # a write-back that failed: every check() raises its error
        # the batches handed out and not committed, in read order; guarded by the lock, which a finalizer may
        # re-enter when a garbage-collection pass runs inside a locked section
        self._pending: List[HandedOut] = []
        self._finalizers: Dict[int, "weakref.finalize"] = {}  # id(batch) -> finalizer of its hand-out leaf
        self._lock = threading.RLock()

    # --- set-up and leases ----------------------------------------------------------------------------------
    def prepare(self, device: torch.device, pin: bool, mode: str, check_finite: Optional[bool] = None) -> None:
        """Check and make what a loader of ``mode`` (a :func:`~dgl_oac.config.table_mode`) on ``device`` needs.
        Switching between naive async (deltas, no log) and oac or async with a hook (a log) needs the other
        kind's batches to be committed first. ``check_finite``: the loader's, which ``emb(ids)`` reads outside
        its batches take too (:meth:`read_now`; None: the device's default)."""
        device = normalize_device(device)  # "cuda" and "cuda:0" are one device
        if self.transfer is not None and self.transfer.device != device:
            raise ValueError(f"NodeEmbedding {self.name!r} is already used on {self.transfer.device}, not {device}")
        if self.transfer is None:
            self.transfer = Transfer(device, pin)
        adds = not logs_writes(mode)
        other = [b.kind for b in self.pending() if b.kind != "sync" and b.adds != adds]
        if mode != "sync" and other:
            raise RuntimeError(f"NodeEmbedding {self.name!r} still has {other[0]} batches that were not committed; "
                               f"call opt.step() (or drop them) before iterating a {mode} loader over it")
        self.check_finite = check_finite

    def lease(self, mode: str, depth: int, priority: str, steps_in_flight: int, threads: int = 1) -> None:
        """An epoch of ``mode`` starts reading ahead (depth 0 needs no lease: sync's code path). The first lease
        starts the write-back thread with its queue ``depth``, ``priority`` and OpenMP team (``threads``) and,
        for a mode that logs its writes, makes the write log after the newest committed step."""
        if self.transfer is None:
            raise RuntimeError(f"NodeEmbedding {self.name!r}: prepare() before lease()")
        if self._leases and self._lease_mode != mode:
            raise RuntimeError(f"NodeEmbedding {self.name!r} is pipelined by a {self._lease_mode} loader; a {mode} "
                               f"loader cannot read ahead of it at the same time")
        store, after = self.store, self.steps - 1
        if logs_writes(mode) and self.log is None:
            spare, self._spare_log = self._spare_log, None
            self.log = spare.restart(after=after) if spare is not None and spare.width == store.width \
                else WriteLog(store.num_rows, store.width, self.transfer.device, after=after)
        if self.log is not None:
            self.log.steps_hint = max(self.log.steps_hint, steps_in_flight)
        if self.writer is None and self.dist is None:
            self.writer = WriteBack(store, self.clock, depth, self.name, priority, self.transfer.recycle, threads)
        self._leases += 1
        self._lease_mode = mode

    def end_lease(self) -> None:
        """An epoch stops reading ahead; the last lease applies every queued step, stops the write-back thread
        and retires the log (its memory is kept for the next lease)."""
        self._leases -= 1
        if self._leases > 0:
            return
        self._leases = 0
        writer, self.writer = self.writer, None
        if writer is not None:
            try:
                writer.close()
            finally:
                self._busy_s += writer.busy_s
                if writer.failed():
                    self._failed = writer
        self.log, self._spare_log = None, self.log or self._spare_log

    def go_idle(self) -> None:
        """``"auto"`` priority, once the cores are the caller's: this table's write-back thread idles from now on."""
        if self.writer is not None:
            self.writer.go_idle()

    def writeback_seconds(self) -> float:
        """Busy time of this table's write-back threads so far."""
        return self._busy_s + (self.writer.busy_s if self.writer is not None else 0.0)

    def check(self) -> None:
        """Raise a failure of the write-back thread in the caller, at every call until the table is closed (the
        table misses the steps queued behind it)."""
        for writer in (self._failed, self.writer):
            if writer is not None:
                writer.check()

    def flush(self) -> None:
        """Wait until every committed step is in the table."""
        self.check()
        if self.writer is not None:
            self.writer.flush()

    # --- reads ----------------------------------------------------------------------------------------------
    def read_now(self, ids: torch.Tensor, device: torch.device) -> torch.Tensor:
        """``emb(ids)`` with grad, outside the batches: read ``ids: int64[n], CPU`` as of every committed step
        (fresh rows). Value ‖ state are gathered once per unique id; the returned leaf ``float32[n, D]`` on
        ``device`` is a :class:`~.pipeline.Read` of them, committed by the next ``step()``.

        No host sync on a device: the unique ids and their segments are the host's (CPU ids), the rows are
        gathered into pinned memory and copied with them without a wait (:func:`~.transfer.to_device_now`), and
        while a pipelined epoch runs with a write log on ``device``, the read does not wait for the write-back to
        apply the steps in flight (which would wait for the device to finish them): it reads at the applied
        version and is patched from the log, as a batch read ahead is at hand-out."""
        # unique ids by a stable sort (what torch.unique does inside): its order is the commit's segment order
        ordered, order = stable_sort(ids)
        uniq, inv_sorted, counts = torch.unique_consecutive(ordered, return_inverse=True, return_counts=True)
        inverse = torch.empty_like(inv_sorted).index_copy_(0, order, inv_sorted)
        log = self.log if self.dist is None and self.log is not None and self.log.device == normalize_device(device) \
            else None
        if log is None:
            self.flush()
        ticket = self.reads.open(uniq)
        try:
            rows = self.stage_rows(uniq, ticket.rv, device)
            rows, uniq_dev, inverse, order = to_device_now(device, rows, uniq, inverse, order)
            if log is not None:  # the rows steps after the read version wrote (torn ones too) from the log
                log.patch(uniq_dev, rows, ticket.rv)
        except BaseException:
            self.reads.close(ticket)
            raise
        seen = ticket.rv if log is None else self.steps - 1  # patched: current through the newest step
        batch = HandedOut(TableRows(uniq, uniq_dev, rows, ticket.rv, ticket=ticket), "sync",
                          resolve_check_finite(self.check_finite, device), BatchState(seen))
        self.register(batch)  # handed out now, current: held, it is refreshed at commit (never pins the log)
        return self._new_read(batch, inverse, whole=True, segments=(order, counts))

    def stage_rows(self, ids: torch.Tensor, at: int, device: torch.device, ahead: bool = False) -> torch.Tensor:
        """Rows ``ids: int64[n], CPU`` (value ‖ state, ``float32[n, W]``) as of step ``at``, gathered on this thread
        into host memory that a copy to ``device`` starts from without waiting: the loader's pinned pool for a
        batch read ahead (``ahead``: :func:`gather_batch_rows`, copied on the side stream), else pinned memory on
        a device or this table's CPU buffer (:meth:`read_now`, :meth:`refresh`, copied on the caller's stream).
        The one gather of a table's rows for a device."""
        n, w = ids.numel(), self.store.width
        if ahead:
            out = self.transfer.host_buffer(n, w)
        elif device.type == "cpu":
            out = self.host_rows.take(n, w)
        else:
            out = pinned_empty((n, w), torch.float32)
        return self.store.gather(ids, out=out, at=at)

    def read(self, batch: HandedOut, pos: Optional[torch.Tensor], whole: bool) -> torch.Tensor:
        """A new leaf of rows ``pos: int64[m]`` of a pending ``batch`` (None: all of them; :meth:`_new_read`).
        ``pos`` is on the host (CPU), or already on the batch's device. From the host, on a device, it is copied
        without a host sync and its occurrence counts stay on the host (``Read.segments``): the commit plans
        there which rows the step writes (:mod:`.step`)."""
        dev = batch.rows.device
        if pos is None or pos.device.type != "cpu" or not device_rows.on_device(dev):
            return self._new_read(batch, pos, whole)
        order = stable_sort(pos)[1]
        counts = torch.bincount(pos, minlength=batch.ids.numel())  # host
        pos_dev, order = to_device_now(dev, pos, order)
        return self._new_read(batch, pos_dev, whole, segments=(order, counts))

    def _new_read(self, batch: HandedOut, pos: Optional[torch.Tensor], whole: bool,
                  segments: Optional[Tuple[torch.Tensor, torch.Tensor]] = None) -> torch.Tensor:
        """A new leaf ``float32[m, D]`` (the batch's device) of the rows ``pos: int64[m]`` of a pending ``batch``
        (None: all of them), as they are now: one ``emb(ids)`` call, its own occurrence of each row (DGL's trace
        per call). It keeps the batch pending until the next ``step()`` once it has a gradient. ``segments``:
        ``(order, counts)`` of ``pos`` when the caller has them (:class:`~.pipeline.Read`)."""
        base = batch.live_leaf()
        values = base.detach() if base is not None else batch.rows[:, : self.store.dim]
        leaf = (values.clone() if pos is None else values.index_select(0, pos)).requires_grad_(True)
        read = Read(pos, whole, weakref.ref(leaf), segments=segments)
        me = weakref.ref(self)
        leaf.register_post_accumulate_grad_hook(functools.partial(_hold_leaf, me, weakref.ref(batch),
                                                                  weakref.ref(read)))
        finalizer(leaf, _leaf_died, me, weakref.ref(batch))
        with self._lock:
            batch.state.reads.append(read)
        return leaf

    # --- pending batches: handed out, not committed ---------------------------------------------------------
    def register(self, batch: HandedOut) -> None:
        """Hand ``batch`` out: close its read (what the user holds never pins the write log) and hold it for the
        next ``step()`` while its hand-out leaf (``batch.leaf_ref``; None: only reads of it, made with
        :meth:`read`) can still get a gradient."""
        if batch.gathered.ticket is not None:
            self.reads.close(batch.gathered.ticket)
        me = weakref.ref(self)
        leaf = None if batch.leaf_ref is None else batch.leaf_ref()
        if leaf is not None:
            leaf.register_post_accumulate_grad_hook(functools.partial(_hold_leaf, me, weakref.ref(batch), None))
        with self._lock:
            self._pending.append(batch)
            if leaf is not None:
                self._finalizers[id(batch)] = finalizer(leaf, _leaf_died, me, weakref.ref(batch))

    def _hold(self, batch: HandedOut, read: Optional[Read], leaf: torch.Tensor) -> None:
        with self._lock:
            if batch.state.released:
                return
            if read is None:
                batch.state.leaf = leaf
            else:
                read.leaf = leaf

    def pending(self) -> List[HandedOut]:
        """A snapshot of the pending batches, in read order."""
        with self._lock:
            return list(self._pending)

    def find(self, ids: torch.Tensor) -> Optional[HandedOut]:
        """The pending batch whose ids tensor *is* ``ids`` (the loader's ``input_nodes``), newest first."""
        for b in reversed(self.pending()):
            if (ids is b.ids or ids is b.ids_dev) and b.live_leaf() is not None:
                return b
        return None

    def release(self, batch: HandedOut) -> None:
        """Forget ``batch`` and give back what it owns (its rows buffer; its read closed at hand-out). Idempotent;
        any thread."""
        state = batch.state
        with self._lock:
            if state.released:
                return
            state.released = True
            self._pending = [b for b in self._pending if b is not batch]
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
        self._recycle(batch.gathered)

    def release_gathered(self, gathered: TableRows) -> None:
        """Give back a gathered batch not handed out (its read, its rows), or release the batch handed out from it
        (a hand-out that failed after registering it). Idempotent: the read closes once. Any thread."""
        batch = next((b for b in self.pending() if b.gathered is gathered), None)
        if batch is not None:
            self.release(batch)
        elif gathered.ticket is not None and self.reads.close(gathered.ticket):
            self._recycle(gathered)

    def _recycle(self, gathered: TableRows) -> None:
        """A released batch's rows buffer goes back, once (its read closed at hand-out, or just now)."""
        # nothing reads the rows any more (the leaf is a copy); each pool ignores buffers it did not hand out
        self.host_rows.give_back(gathered.rows)
        if self.transfer is not None:
            self.transfer.recycle(gathered.rows)

    # --- held batches, brought up to the newest step --------------------------------------------------------
    def refresh(self, batch: HandedOut, leaf: bool = False) -> Count:
        """Bring ``batch`` up to the newest step; with ``leaf``, its hand-out leaf too. Returns how many rows were
        replaced: from the log, a 0-d tensor on its device (reading it would be a host sync). A no-op for async
        batches and for batches no step ran after."""
        newest = self.steps - 1
        seen = batch.state.seen
        if seen is None or seen >= newest:
            return 0
        log = self.log
        n: Count
        if log is not None and log.covers(seen) and self.dist is None:
            n = log.patch(batch.ids_dev, batch.rows, seen)
        else:  # the log no longer covers it (held longer than the pipeline's depth), or a distributed table
            self.flush()
            fresh = self.stage_rows(batch.ids, newest, batch.rows.device)
            batch.rows.copy_(fresh, non_blocking=True)
            self.host_rows.give_back(fresh)  # copied (on a device the pinned block outlives its queued copy)
            n = batch.ids.numel()
        batch.state.seen = newest
        live = batch.live_leaf() if leaf else None
        if live is not None:
            with torch.no_grad():
                live.copy_(batch.rows[:, : live.shape[1]])
        return n

    def read_held(self, batch: HandedOut, grad: bool) -> Optional[torch.Tensor]:
        """``emb(ids)`` of exactly a held ``batch``'s ids (``grad``: autograd is on): its rows as of now, or None
        when they must be read anew (:meth:`current_leaf`). The first call with grad returns the hand-out leaf
        (reading it there and through the call is one occurrence); a later one is a read of its own, a new
        occurrence of every row (DGL averages over them); without grad, the values alone."""
        leaf = self.current_leaf(batch)
        if leaf is None or not grad:
            return None if leaf is None else leaf.detach()
        if batch.state.claimed:
            return self.read(batch, None, whole=True)
        batch.state.claimed = True
        return leaf

    def current_leaf(self, batch: HandedOut) -> Optional[torch.Tensor]:
        """``batch``'s leaf with the rows as of now (DGL reads at call time): a batch held across a step is
        refreshed in place while it has no gradient; None once it has one and is behind (read anew instead)."""
        seen = batch.state.seen
        if seen is not None and seen < self.steps - 1:
            if batch.has_grad():
                return None
            self.refresh(batch, leaf=True)
        return batch.live_leaf()

    def catch_up(self, batch: HandedOut) -> Count:
        """Bring an async batch's rows (used as read at version ``rv``) to the newest step, for its hook's commit:
        :meth:`refresh` from the read version (from the log while it covers ``rv``; else re-read). Returns the
        count (:data:`Count`)."""
        if batch.kind != "async" or batch.rv is None:
            raise RuntimeError(f"NodeEmbedding {self.name!r}: catch_up() is for async reads, not {batch.kind}")
        batch.state.seen = batch.rv
        with torch.profiler.record_function("dgl_oac.catch_up"):
            return self.refresh(batch)

    def moved_since(self, batch: TableRows) -> Optional[torch.Tensor]:
        """``bool[n]`` (device): which of ``batch``'s rows a step after its read version wrote; None when no step
        was committed since (or no log exists: nothing reads ahead)."""
        if self.log is None or batch.rv >= self.steps - 1:
            return None
        return self.log.stale(batch.ids_dev, batch.rv)[0]

    # --- commit ---------------------------------------------------------------------------------------------
    def take_ready(self) -> List[HandedOut]:
        """What the next ``step()`` commits: the pending batches with a gradient, in read order, once a failed
        write-back has surfaced (the table misses the steps queued behind it)."""
        self.check()
        return [b for b in self.pending() if b.has_grad()]

    def drop_ready(self) -> None:
        """A step skipped on this table: its ready batches are released, their gradients never applied."""
        for b in self.pending():
            if b.has_grad():
                self.release(b)

    def kernel_out(self, n: int, device: torch.device) -> Optional[torch.Tensor]:
        """Where the next step's kernel writes ``float32[n, W]`` on ``device`` (the rows'): the write log's ring
        (logged without a copy), a loader's pooled buffer, this table's own CPU buffer, or None (allocate)."""
        if self.log is not None:
            return self.log.reserve(n)
        out = None if self.transfer is None else self.transfer.kernel_out(n, self.store.width)
        if out is None and device.type == "cpu":
            out = self.host_rows.take(n, self.store.width)
        return out

    def commit(self, batches: List[HandedOut], ids: torch.Tensor, ids_dev: torch.Tensor, new: torch.Tensor,
               delta_from: Optional[torch.Tensor] = None,
               forwarded: Optional[Tuple[torch.Tensor, torch.Tensor]] = None,
               new_host: Optional[torch.Tensor] = None) -> int:
        """Commit the next step (:func:`.table.write_step`); ``batches`` are released whether or not it succeeds
        (a failed step is skipped, never re-applied). Then the log drops what no open read can miss. Returns the
        step."""
        step = self.steps
        try:
            write_step(self.name, self.store, self.clock, step, ids, ids_dev, new, self.transfer, self.log,
                       self.writer, delta_from, forwarded, new_host)
            self.steps += 1
        finally:
            if self.writer is None:  # written through (or failed): the new rows are dead
                self.host_rows.give_back(new)
            for b in batches:
                self.release(b)
        if self.log is not None:
            self.log.drop_through(self.clock.horizon())
        return step

    def consume_step(self) -> int:
        """Commit an empty step: the next step number is used and published, nothing written (a distributed step
        skipped on every rank: reads opened while it ran are at its version, which must then exist)."""
        dev = self.log.device if self.log is not None else torch.device("cpu")
        none = torch.empty(0, dtype=torch.int64)
        return self.commit([], none, none.to(dev), torch.empty(0, self.store.width, device=dev),
                           new_host=torch.empty(0, self.store.width))

    def write_values(self, ids: torch.Tensor, values: torch.Tensor, start: int = 0) -> int:
        """Overwrite columns ``start .. start + C - 1`` of rows ``ids: int64[n], CPU`` (unique) with ``values:
        float32[n, C]``, CPU, as the next step, the row's other columns kept (``start=0``, ``C = D``: the values,
        optimizer state kept; ``start=D``: the state): the one write path of commits (step order, log,
        write-back), so batches read ahead are patched as for any step. Returns the step."""
        if self.dist is not None:
            raise NotImplementedError(f"NodeEmbedding {self.name!r} is trained by several ranks: write_rows is "
                                      f"single-process only")
        self.flush()  # every committed step is in the table: the state columns kept are the current ones
        rows = self.store.gather(ids)
        rows[:, start:start + values.shape[1]] = values
        dev = self.log.device if self.log is not None else \
            self.transfer.device if self.transfer is not None else torch.device("cpu")
        with torch.no_grad():
            return self.commit([], ids, ids.to(dev), rows.to(dev))

    # --- state ----------------------------------------------------------------------------------------------
    def queue_reads(self, n: int) -> None:
        """A loader queued ``n`` batches for its gather thread (``n < 0``: took or dropped them): their reads open
        when the thread (or the caller, for a batch it has not started) gathers them; until then the table is not
        idle either."""
        self.queued_reads += n

    def idle(self) -> bool:
        """Nothing read and uncommitted, no read open, none queued to open."""
        return not self.pending() and self.reads.open_count() == 0 and self.queued_reads == 0

    def reset(self) -> None:
        """The table's contents are about to be replaced (a checkpoint, ``load_state_dict``): a fresh log (the old
        ring holds rows of the replaced table)."""
        if not self.idle():
            raise RuntimeError(f"cannot replace the table of NodeEmbedding {self.name!r} while batches are in "
                               f"flight; close its loader (and commit or drop its batches) first")
        self.flush()
        if self.log is not None:
            self.log = WriteLog(self.store.num_rows, self.store.width, self.log.device, after=self.steps - 1,
                                steps_hint=self.log.steps_hint)

    def close(self) -> None:
        """Drop uncommitted batches, apply every committed step, stop the write-back thread and drop the logs.
        Idempotent."""
        for b in self.pending():
            self.release(b)
        self._leases = 1
        self.end_lease()
        self._spare_log = None


# ---- Gather and copy: read a batch's rows from each CPU table and start their copy to the device

def gather_batch_rows(tables: Sequence[TablePipeline], table_ids: Sequence[torch.Tensor],
                seconds: Optional[Dict[str, float]] = None, read_ahead: bool = False,
                register: bool = True) -> List[TableRows]:
    """One :class:`TableRows` per table for its ``ids: int64[n], CPU`` (``table_ids``, in the tables' order: the
    same input nodes for every table of a homogeneous graph, a node type's for a heterograph's); the copies to
    the device are started. ``read_ahead``: first ask the disk for every file-backed table's pages of the batch
    (before the reads open, so they open at the newest version the I/O allows). ``register``: distributed, list the
    reads with the rows' owners so that they forward later writes (not for async batches, which are never
    patched)."""
    for table, ids in zip(tables, table_ids):
        # a sampler's bug (or a graph bigger than the table) would otherwise be torch's bare "out of range"
        check_ids(ids, table.store.num_rows,
                  f"input nodes of a batch (from the sampler) for NodeEmbedding {table.name!r}")
    if read_ahead and any(t.store.out_of_core for t in tables):
        t0 = time.perf_counter()
        with torch.profiler.record_function("dgl_oac.read_ahead"):
            for table, ids in zip(tables, table_ids):
                if table.store.out_of_core:
                    table.store.read_ahead(ids)
        if seconds is not None:
            seconds["gather"] += time.perf_counter() - t0
    out: List[TableRows] = []
    try:
        for table, ids in zip(tables, table_ids):
            t0 = time.perf_counter()
            ticket = table.reads.open(ids, register)
            try:
                with torch.profiler.record_function("dgl_oac.gather"):
                    rows = table.stage_rows(ids, ticket.rv, table.transfer.device, ahead=True)
                t1 = time.perf_counter()
                with torch.profiler.record_function("dgl_oac.copy"):
                    # the ids ride with the rows, from pinned memory too: a copy from pageable memory may
                    # make this thread wait for the copy stream (the driver stages it synchronously)
                    tr = table.transfer
                    (rows_dev, ids_dev), event = tr.to_device(rows, tr.staged(ids))
            except BaseException:
                table.reads.close(ticket)
                raise
            if seconds is not None:
                seconds["gather"] += t1 - t0
                seconds["copy"] += time.perf_counter() - t1
            out.append(TableRows(ids, ids_dev, rows_dev, ticket.rv, event, ticket=ticket))
    except BaseException:
        release_all(tables, out)
        raise
    return out


def release_all(tables: Sequence[TablePipeline], rows: Sequence[TableRows]) -> None:
    """Give back gathered batches that will never be handed out (their reads, their rows); one a failed hand-out
    registered is released (:meth:`~dgl_oac.engine.pipeline.TablePipeline.release_gathered`). Idempotent."""
    for table, r in zip(tables, rows):
        table.release_gathered(r)


# ---- Validate and hand out, on the caller's thread: patch a batch's rows and wrap them as leaves

class HandOutStats(Protocol):
    """What :func:`validate_rows` counts into (a loader's ``stats``: :class:`dgl_oac.loading.stats.LoaderStats`)."""

    rows_read: int
    seconds: Dict[str, float]

    def add_patched(self, n: torch.Tensor) -> None:
        """Add the rows patched from the write log (a 0-d tensor on the log's device: no host sync)."""


class HandedLeaf(NamedTuple):
    """One table's part of a batch, as handed out."""

    leaf: torch.Tensor             # float32[n, D], the rows' device, requires grad: what the model reads
    batch: Optional[HandedOut]     # registered for the next step() (None: a node type absent from the batch)


def validate_rows(gathered: List[TableRows], tables: Sequence[TablePipeline], mode: str,
                  check_finite: bool, stats: HandOutStats, listener: Optional[CommitListener],
                  ntypes: Optional[Sequence[Optional[str]]] = None,
                  hooks: Sequence[Optional[BatchHook]] = ()) -> List[HandedLeaf]:
    """Validate each table's rows of one batch (oac: patch them from the write log), wrap them as
    ``requires_grad`` leaves ``float32[n, D]`` (the rows' device) and register them with their tables for the
    next ``step()``, each as a :class:`~.pipeline.HandedOut` whose commit ``listener`` hears of (the batch's first
    table with rows only: a batch counts once). Returns them, in the tables' order. ``ntypes``: each table's
    node type on a heterograph (None: homogeneous). ``hooks``: async only, each table's hook
    (:mod:`dgl_oac.engine.pipeline`), which may move the leaf's values."""
    ntypes = ntypes or [None] * len(tables)
    t0 = time.perf_counter()
    counted = False
    out: List[HandedLeaf] = []
    with torch.profiler.record_function("dgl_oac.validate"):
        for i, (table, r, ntype) in enumerate(zip(tables, gathered, ntypes)):
            table.check()  # a failed write-back surfaces before the batch is used
            table.transfer.wait_for_copy([r.rows, r.ids_dev], r.event)
            # the log holds every committed step: afterwards the rows are what sync reads (nothing can be stale
            # if no step was committed after the read)
            if mode == "oac" and r.rv < table.steps - 1:
                stats.add_patched(table.log.patch(r.ids_dev, r.rows, r.rv))
            empty = ntype is not None and not r.ids.numel()  # a node type absent from the batch: nothing to commit
            seen = None if mode == "async" else table.steps - 1
            d = table.store.dim
            leaf = r.rows[:, :d].contiguous() if r.rows.shape[1] != d else r.rows.detach().clone()
            hook = hooks[i] if hooks else None
            if hook is not None:
                hook.at_handout(table, r, leaf)
            leaf.requires_grad_(True)
            batch = None
            if empty:
                table.release_gathered(r)
            else:
                batch = HandedOut(r, mode, check_finite, BatchState(seen), hook=hook, leaf_ref=weakref.ref(leaf),
                                  listener=None if counted else listener)
                table.register(batch)
                counted = True
            stats.rows_read += r.ids.numel()
            out.append(HandedLeaf(leaf, batch))
    stats.seconds["validate"] += time.perf_counter() - t0
    return out
