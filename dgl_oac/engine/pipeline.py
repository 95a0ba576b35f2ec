"""``TablePipeline``: everything in flight for one table, as a few owners with one job each.

A :class:`~dgl_oac.embedding.NodeEmbedding` has exactly one. The gather, the hand-out, the committers, the
loader and checkpoints call its methods; none of them assigns its fields. Its parts, in data-flow order:

* the clock (:class:`~dgl_oac.engine.table.VersionClock`): which steps are in the table, which reads are open;
* :class:`~dgl_oac.engine.table.Reads`: opens a read at gather, closes it once (at hand-out, or release);
* the transfer (:class:`~dgl_oac.engine.transfer.Transfer`): host <-> device copies, made by :meth:`prepare`;
* :class:`~dgl_oac.engine.pending.PendingBatches`: batches handed out and not committed, and their leaves;
* :class:`~dgl_oac.engine.refresh.Refresh`: brings a held batch up to the newest step at commit;
* :class:`~dgl_oac.engine.table.StepWriter`: the step counter and the one write path of every step;
* :class:`~dgl_oac.engine.table.Leases`: the write-back thread and the write log, leased by epochs.

Lifetimes (what releases what):

* a read opened by a gather is closed when its batch is handed out (:meth:`TablePipeline.register`): its rows
  are current then (validated, or read fresh), and a batch held across later steps is brought up to date at
  commit (:mod:`.refresh`). So nothing a user holds (a peeked batch, a leaf kept for later) pins the write log:
  it holds only the steps the batches read ahead and not yet handed out can miss, at most the pipeline's depth;
* a batch is released when it is committed, skipped, or its leaves died without a gradient (:mod:`.pending`),
  never because another batch arrived; releasing it closes its read and recycles its rows buffer;
* the write-back thread and the write log live while at least one epoch reads ahead (:mod:`.leases`).

A distributed table (``dist``: :class:`dgl_oac.distributed.inflight.DistTable`) registers every read with the
rows' owners (:mod:`.reads`), logs the rows other owners forward with each step (:mod:`.write_path`), writes
its own rows through (no write-back thread: an owner's rows must be in the shared table when the step ends on
every rank), and refreshes held batches by re-reading them (:mod:`.refresh`).
"""
from __future__ import annotations

from typing import Any, List, Optional, Tuple

import torch

from ..config import logs_writes, normalize_device, resolve_check_finite
from ..device import rows as device_rows
from .batch import BatchState, HandedOut, TableRows
from .table import Leases
from .table import VersionClock, WriteLog
from .pending import PendingBatches
from .table import Reads, ReadTicket
from .refresh import Count, Refresh
from .table import stable_sort
from .table import RowStore
from .transfer import BufferPool, Transfer, pinned_empty, to_device_now
from .table import StepWriter
from .table import WriteBack


class TablePipeline:
    """Per-table pipeline state and its operations (see the module docstring)."""

    def __init__(self, name: str, store: RowStore, dist: Any = None) -> None:
        self.name = name
        self.store = store
        self.dist = dist  # a distributed table's DistTable (registry, owner book); None in one process
        self.clock = VersionClock()
        self.transfer: Optional[Transfer] = None  # made by prepare(): the device is the first loader's
        # CPU buffers for the rows of reads and kernels outside a loader (emb(ids), its step): reused, so a
        # step does not map and fault in tens of MB afresh (a loader's come from its Transfer's pool)
        self.host_rows = BufferPool()
        self.check_finite: Optional[bool] = None  # the last loader's (prepare()); None: the device's default
        self.reads = Reads(self.clock, dist)
        self.queued_reads = 0  # batches a loader queued for its gather thread, not yet taken (queue_reads)
        self.batches = PendingBatches(store.dim, self._released)
        self.leases = Leases(name, store, self.clock, write_through=dist is not None)
        self.writes = StepWriter(name, store, self.clock, self.leases)
        self.refresher = Refresh(name, store, self.leases, lambda: self.writes.steps, dist)

    # --- what other modules read ----------------------------------------------------------------------------
    @property
    def steps(self) -> int:
        """Steps committed so far (= the next step's number)."""
        return self.writes.steps

    @property
    def log(self) -> Optional[WriteLog]:
        """The write log (oac, async with a hook), on the compute device, while an epoch reads ahead."""
        return self.leases.log

    @property
    def writer(self) -> Optional[WriteBack]:
        """The write-back thread, while an epoch reads ahead."""
        return self.leases.writer

    # --- set-up ---------------------------------------------------------------------------------------------
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
        """A pipelined epoch reads ahead (:mod:`.leases`). Depth 0 needs no lease: sync's code path."""
        if self.transfer is None:
            raise RuntimeError(f"NodeEmbedding {self.name!r}: prepare() before lease()")
        self.leases.lease(mode, depth, priority, steps_in_flight, self.steps - 1, self.transfer, threads)

    def give_back(self) -> None:
        """An epoch stops reading ahead (:meth:`.leases.Leases.give_back`)."""
        self.leases.give_back()

    def writeback_seconds(self) -> float:
        """Busy time of this table's write-back threads so far."""
        return self.leases.busy_seconds()

    # --- reads ----------------------------------------------------------------------------------------------
    def open_read(self, ids: torch.Tensor, register: bool = True) -> ReadTicket:
        """Open a read of ``ids`` at the current version (:mod:`.reads`); close it with :meth:`close_read`
        unless a batch carries it."""
        return self.reads.open(ids, register)

    def close_read(self, ticket: ReadTicket) -> bool:
        """Close ``ticket``'s read; True if this call closed it (:meth:`.reads.Reads.close`)."""
        return self.reads.close(ticket)

    def read_now(self, ids: torch.Tensor, device: torch.device) -> torch.Tensor:
        """``emb(ids)`` with grad, outside the batches: read ``ids: int64[n], CPU`` as of every committed step
        (fresh rows). Value ‖ state are gathered once per unique id; the returned leaf ``float32[n, D]`` on
        ``device`` is a :class:`~.batch.Read` of them, committed by the next ``step()``.

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
        ticket = self.open_read(uniq)
        try:
            out = self.host_rows.take(uniq.numel(), self.store.width) if device.type == "cpu" else \
                pinned_empty((uniq.numel(), self.store.width), torch.float32)
            rows = self.store.gather(uniq, out=out, at=ticket.rv)
            rows, uniq_dev, inverse, order = to_device_now(device, rows, uniq, inverse, order)
            if log is not None:  # the rows steps after the read version wrote (torn ones too) from the log
                log.patch(uniq_dev, rows, ticket.rv)
        except BaseException:
            self.close_read(ticket)
            raise
        seen = ticket.rv if log is None else self.steps - 1  # patched: current through the newest step
        batch = HandedOut(TableRows(uniq, uniq_dev, rows, ticket.rv, ticket=ticket), "sync",
                          resolve_check_finite(self.check_finite, device), BatchState(seen))
        self.close_read(ticket)  # handed out now, current: held, it is refreshed at commit (never pins the log)
        self.batches.register(batch)
        return self.batches.read(batch, inverse, whole=True, segments=(order, counts))

    def read(self, batch: HandedOut, pos: Optional[torch.Tensor], whole: bool) -> torch.Tensor:
        """A new leaf of rows ``pos: int64[m]`` of a pending ``batch`` (None: all of them;
        :meth:`.pending.PendingBatches.read`). ``pos`` is on the host (CPU), or already on the batch's device.
        From the host, on a device, it is copied without a host sync and its occurrence counts stay on the host
        (``Read.segments``): the commit plans there which rows the step writes (:mod:`.combine`)."""
        dev = batch.rows.device
        if pos is None or pos.device.type != "cpu" or not device_rows.on_device(dev):
            return self.batches.read(batch, pos, whole)
        order = stable_sort(pos)[1]
        counts = torch.bincount(pos, minlength=batch.ids.numel())  # host
        pos_dev, order = to_device_now(dev, pos, order)
        return self.batches.read(batch, pos_dev, whole, segments=(order, counts))

    # --- pending batches ------------------------------------------------------------------------------------
    def register(self, batch: HandedOut) -> None:
        """Hand ``batch`` out: close its read (what the user holds never pins the write log) and hold it for the
        next ``step()`` while its leaf can still get a gradient."""
        if batch.gathered.ticket is not None:
            self.close_read(batch.gathered.ticket)
        self.batches.register(batch)

    def pending(self) -> List[HandedOut]:
        return self.batches.all()

    def find(self, ids: torch.Tensor) -> Optional[HandedOut]:
        return self.batches.find(ids)

    def release(self, batch: HandedOut) -> None:
        """Forget ``batch``, close its read, recycle its rows. Idempotent; safe on any thread."""
        self.batches.release(batch)

    def release_gathered(self, gathered: TableRows) -> None:
        """Give back a gathered batch not handed out (its read, its rows), or release the batch handed out from it
        (a hand-out that failed after registering it). Idempotent: the read closes once. Any thread."""
        if not self.batches.release_from(gathered) and gathered.ticket is not None and \
                self.close_read(gathered.ticket):
            self._released(gathered)

    def _released(self, gathered: TableRows) -> None:
        """A released batch's rows buffer goes back, once (its read closed at hand-out, or just now)."""
        # nothing reads the rows any more (the leaf is a copy); each pool ignores buffers it did not hand out
        self.host_rows.give_back(gathered.rows)
        if self.transfer is not None:
            self.transfer.recycle(gathered.rows)

    # --- commit ---------------------------------------------------------------------------------------------
    def current_leaf(self, batch: HandedOut) -> Optional[torch.Tensor]:
        return self.refresher.current_leaf(batch)

    def refresh(self, batch: HandedOut, leaf: bool = False) -> Count:
        return self.refresher.refresh(batch, leaf)

    def catch_up(self, batch: HandedOut) -> Count:
        return self.refresher.catch_up(batch)

    def moved_since(self, batch: TableRows) -> Optional[torch.Tensor]:
        return self.refresher.moved_since(batch)

    def kernel_out(self, n: int, device: torch.device) -> Optional[torch.Tensor]:
        """Where the next step's kernel writes ``float32[n, W]`` on ``device`` (the rows'): the write log's ring,
        a loader's pooled buffer, this table's own CPU buffer, or None (allocate)."""
        out = self.writes.kernel_out(n, self.transfer)
        if out is None and device.type == "cpu":
            out = self.host_rows.take(n, self.store.width)
        return out

    def commit(self, batches: List[HandedOut], ids: torch.Tensor, ids_dev: torch.Tensor, new: torch.Tensor,
               delta_from: Optional[torch.Tensor] = None,
               forwarded: Optional[Tuple[torch.Tensor, torch.Tensor]] = None,
               new_host: Optional[torch.Tensor] = None) -> int:
        """Commit the next step (:meth:`.write_path.StepWriter.write`); ``batches`` are released whether or not
        it succeeds (a failed step is skipped, never re-applied). Returns the step."""
        try:
            step = self.writes.write(ids, ids_dev, new, self.transfer, delta_from, forwarded, new_host)
        finally:
            if self.leases.writer is None:  # written through (or failed): the new rows are dead
                self.host_rows.give_back(new)
            for b in batches:
                self.release(b)
        self.writes.trim()
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
    def check(self) -> None:
        """Raise a failure of the write-back thread in the caller (the table misses the steps queued behind it)."""
        self.leases.check()

    def flush(self) -> None:
        """Wait until every committed step is in the table."""
        self.leases.flush()

    def queue_reads(self, n: int) -> None:
        """A loader queued ``n`` batches for its gather thread (``n < 0``: took or dropped them): their reads open
        when the thread (or the caller, for a batch it has not started) gathers them; until then the table is not
        idle either."""
        self.queued_reads += n

    def idle(self) -> bool:
        """Nothing read and uncommitted, no read open, none queued to open."""
        return not self.pending() and self.reads.open_count() == 0 and self.queued_reads == 0

    def reset(self) -> None:
        """The table's contents are about to be replaced (a checkpoint, ``load_state_dict``): forget the log."""
        if not self.idle():
            raise RuntimeError(f"cannot replace the table of NodeEmbedding {self.name!r} while batches are in "
                               f"flight; close its loader (and commit or drop its batches) first")
        self.flush()
        self.leases.renew_log(after=self.steps - 1)

    def close(self) -> None:
        """Drop uncommitted batches, apply every committed step and stop the write-back thread. Idempotent."""
        for b in self.pending():
            self.release(b)
        self.leases.close()
