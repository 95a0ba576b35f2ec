"""``TablePipeline``: the one owner of everything in flight for one table.

A :class:`~dgl_oac.embedding.NodeEmbedding` has exactly one. It owns the version clock, the step counter, the
device write log (oac; async with a staleness rule), the host<->device transfer, the write-back thread (leased
by the epochs that pipeline) and the batches read but not yet committed. The gather, the hand-out, the commit,
the loader and checkpoints call its methods; none of them assigns its fields.

Lifetimes (what releases what):

* a read opened by a gather is closed when its batch is handed out (:meth:`TablePipeline.register`): its rows
  are current then (validated, or read fresh), and a batch held across later steps is brought up to date at
  commit by :meth:`~TablePipeline.refresh` (from the log while the log covers it, else re-read). So nothing a
  user holds (a peeked batch, a leaf kept for later) pins the write log: it holds only the steps the batches
  read ahead and not yet handed out can miss, at most the pipeline's depth, whatever lives or is collected;
* a batch is released when it is committed, skipped, or its leaf died without a gradient (a
  ``weakref.finalize`` on the leaf), never because another batch arrived;
* a batch whose leaf got a gradient is held until a ``step()`` commits it (DGL's semantics: every read since
  the last ``step()`` is committed by the next one), even if the caller dropped the batch after backward;
* the write-back thread and the write log (oac, async with a staleness rule) live while at least one epoch
  reads ahead (leases them); without them, commits write through and held batches are re-read: sync's code
  path.

Every commit, whatever its path (a loader of any mode, ``emb(ids)`` outside a loader), takes the next step
number, goes to the write-back (or the table) in step order, and is logged when a write log exists.

A distributed table (``dist``, see :mod:`dgl_oac.distributed`) also registers every read with the rows' owners
(:class:`~dgl_oac.distributed.inflight.Registry`), logs the rows other owners forward with each step, writes
its own rows through (an owner's rows must be in the shared table when the step ends on every rank), and
brings held batches up to date by re-reading them (the log holds only what was forwarded for registered reads).
"""
from __future__ import annotations

import functools
import threading
import weakref
from typing import Any, List, Optional, Tuple

import torch

from .batch import Read, TableRows
from ..config import logs_writes, normalize_device
from .oac import VersionClock, WriteLog
from .store import RowStore
from .transfer import Transfer
from .writeback import WriteBack


def _hold_leaf(batch_ref: "weakref.ref[TableRows]", leaf: torch.Tensor) -> None:
    """Post-accumulate-grad hook: a leaf with a gradient must survive until ``step()`` commits it."""
    batch = batch_ref()
    if batch is not None and not batch.released:
        batch.leaf = leaf


def _hold_read_leaf(read_ref: "weakref.ref[Read]", leaf: torch.Tensor) -> None:
    """Post-accumulate-grad hook of a read's leaf (see :func:`_hold_leaf`)."""
    read = read_ref()
    if read is not None:
        read.leaf = leaf


def _leaf_died(table_ref: "weakref.ref[TablePipeline]", batch_ref: "weakref.ref[TableRows]") -> None:
    """Finalizer of each leaf of a batch: once none can get a gradient any more, the batch is released."""
    table, batch = table_ref(), batch_ref()
    if table is not None and batch is not None and not batch.alive():
        table.release(batch)


class TablePipeline:
    """Per-table pipeline state and its operations (see the module docstring)."""

    def __init__(self, name: str, store: RowStore, dist: Any = None) -> None:
        self.name = name
        self.store = store
        self.dist = dist  # a distributed table's DistTable (registry, owner book); None in one process
        self.clock = VersionClock()
        self.steps = 0                       # steps committed so far (= the next step's number)
        self.log: Optional[WriteLog] = None  # oac only, on the compute device, while an epoch reads ahead
        self._spare_log: Optional[WriteLog] = None  # the last one, kept for its memory
        self.transfer: Optional[Transfer] = None
        self.writer: Optional[WriteBack] = None
        self._leases = 0
        self._lease_mode = ""
        self._writeback_s = 0.0  # busy seconds of write-back threads already stopped
        self._failed: Optional[WriteBack] = None  # a write-back that failed: the table misses committed steps
        self._pending: List[TableRows] = []  # read, not committed (guarded: finalizers run on any thread)
        self._lock = threading.Lock()

    # --- set-up ---------------------------------------------------------------------------------------------
    def prepare(self, device: torch.device, pin: bool, mode: str) -> None:
        """Check and make what a loader of ``mode`` (a :func:`~dgl_oac.config.table_mode`) on ``device`` needs.
        Switching between naive async (deltas, no log) and oac or async with a staleness rule (a log) needs the
        other kind's batches to be committed first."""
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

    def lease(self, mode: str, depth: int, priority: str, steps_in_flight: int) -> None:
        """A pipelined epoch reads ahead: run the write-back thread and, for oac and async with a staleness rule,
        keep a write log (the first lease decides depth and priority). Depth 0 needs neither: sync's code path."""
        if self._leases and self._lease_mode != mode:
            raise RuntimeError(f"NodeEmbedding {self.name!r} is pipelined by a {self._lease_mode} loader; a {mode} "
                               f"loader cannot read ahead of it at the same time")
        if self.transfer is None:
            raise RuntimeError(f"NodeEmbedding {self.name!r}: prepare() before lease()")
        if logs_writes(mode) and self.log is None:
            spare, self._spare_log = self._spare_log, None
            self.log = spare.restart(after=self.steps - 1) if spare is not None and spare.width == self.store.width \
                else WriteLog(self.store.num_rows, self.store.width, self.transfer.device, after=self.steps - 1)
        if self.log is not None:
            self.log.steps_hint = max(self.log.steps_hint, steps_in_flight)
        if self.writer is None and self.dist is None:
            self.writer = WriteBack(self.store, self.clock, depth, self.name, priority, self.transfer.recycle)
        self._leases += 1
        self._lease_mode = mode

    def give_back(self) -> None:
        """An epoch stops reading ahead: the last lease applies every queued step, stops the thread and retires
        the log (batches still held are then brought up to date by re-reading them; its memory is reused by
        the next lease)."""
        self._leases -= 1
        if self._leases > 0:
            return
        self._leases = 0
        writer, self.writer = self.writer, None
        if writer is not None:
            try:
                writer.close()
            finally:
                self._writeback_s += writer.busy_s
                if writer.failed():
                    self._failed = writer
        self.log, self._spare_log = None, self.log or self._spare_log  # the next lease reuses its memory

    def writeback_seconds(self) -> float:
        """Busy time of this table's write-back threads so far."""
        return self._writeback_s + (self.writer.busy_s if self.writer is not None else 0.0)

    # --- reads ----------------------------------------------------------------------------------------------
    def open_read(self, ids: torch.Tensor) -> Tuple[int, Any]:
        """Open a read of ``ids`` at the current version: ``(rv, registration)`` (distributed: registered with
        the rows' owners; else None). Close it with :meth:`close_read` unless a batch carries it."""
        if self.dist is None:
            return self.clock.begin_read(), None
        return self.dist.registry.open_read(self.clock, ids)

    def close_read(self, rv: int, registration: Any) -> None:
        self.clock.end_read(rv)
        if registration is not None:
            self.dist.registry.release(registration)

    def _end_read(self, batch: TableRows) -> None:
        """Close ``batch``'s read once (at hand-out or release, whichever is first; any thread). ``batch.rv``
        keeps its number: an async batch's commit catches up from it (:meth:`catch_up`)."""
        with self._lock:
            if not batch.read_open:
                return
            batch.read_open = False
        if batch.rv is not None:
            self.close_read(batch.rv, batch.registration)

    def read_now(self, ids: torch.Tensor, device: torch.device) -> torch.Tensor:
        """``emb(ids)`` with grad, outside the batches: read ``ids: int64[n], CPU`` from the table after every
        committed step is in it (fresh rows). Value ‖ state are gathered once per unique id; the returned leaf
        ``float32[n, D]`` on ``device`` is a :class:`Read` of them, committed by the next ``step()``."""
        uniq, inverse = torch.unique(ids, return_inverse=True)
        self.flush()
        rv, reg = self.open_read(uniq)
        try:
            rows = self.store.gather(uniq).to(device)
        except BaseException:
            self.close_read(rv, reg)
            raise
        batch = TableRows(uniq, uniq.to(device), rows, rv, kind="sync", seen=rv, registration=reg)
        with self._lock:
            self._pending.append(batch)
        self._end_read(batch)  # handed out now, current: held, it is refreshed at commit (never pins the log)
        return self.read(batch, inverse.to(device), whole=True)

    def read(self, batch: TableRows, pos: Optional[torch.Tensor], whole: bool) -> torch.Tensor:
        """A new leaf ``float32[m, D]`` (the batch's device) of the rows ``pos: int64[m]`` of a pending ``batch``
        (None: all of them), as they are now: one ``emb(ids)`` call, its own occurrence of each row (DGL's trace
        per call). It keeps the batch pending until the next ``step()`` once it has a gradient."""
        base = batch.live_leaf()
        values = base.detach() if base is not None else batch.rows[:, : self.store.dim]
        leaf = (values.clone() if pos is None else values.index_select(0, pos)).requires_grad_(True)
        read = Read(pos, whole, weakref.ref(leaf))
        leaf.register_post_accumulate_grad_hook(functools.partial(_hold_read_leaf, weakref.ref(read)))
        weakref.finalize(leaf, _leaf_died, weakref.ref(self), weakref.ref(batch))
        batch.reads.append(read)
        return leaf

    # --- pending batches ------------------------------------------------------------------------------------
    def register(self, batch: TableRows, leaf: torch.Tensor) -> None:
        """Hold ``batch`` for the next ``step()``; it lives as long as ``leaf`` can still get a gradient. Its read
        closes now (module docstring: what the user holds never pins the write log)."""
        self._end_read(batch)
        batch.leaf_ref = weakref.ref(leaf)
        leaf.register_post_accumulate_grad_hook(functools.partial(_hold_leaf, weakref.ref(batch)))
        batch._finalizer = weakref.finalize(leaf, _leaf_died, weakref.ref(self), weakref.ref(batch))
        with self._lock:
            self._pending.append(batch)

    def pending(self) -> List[TableRows]:
        with self._lock:
            return list(self._pending)

    def find(self, ids: torch.Tensor) -> Optional[TableRows]:
        """The pending batch whose ids tensor *is* ``ids`` (the loader's ``input_nodes``), newest first."""
        for b in reversed(self.pending()):
            if (ids is b.ids or ids is b.ids_dev) and b.live_leaf() is not None:
                return b
        return None

    def newest(self) -> Optional[TableRows]:
        for b in reversed(self.pending()):
            if b.live_leaf() is not None:
                return b
        return None

    def current_leaf(self, batch: TableRows) -> Optional[torch.Tensor]:
        """``batch``'s leaf with the rows as of now (DGL reads at call time): a batch held across a step is
        refreshed in place while it has no gradient; None once it has one and is behind (read anew instead)."""
        if batch.seen is not None and batch.seen < self.steps - 1:
            if batch.has_grad():
                return None
            self.refresh(batch, leaf=True)
        return batch.live_leaf()

    def ready(self) -> List[TableRows]:
        """Pending batches with a gradient, in read order: what the next ``step()`` commits."""
        return [b for b in self.pending() if b.has_grad()]

    def release(self, batch: TableRows) -> None:
        """Forget ``batch`` and close its read. Idempotent; safe on any thread."""
        with self._lock:
            if batch.released:
                return
            batch.released = True
            self._pending = [b for b in self._pending if b is not batch]
        fin = getattr(batch, "_finalizer", None)
        if fin is not None:
            fin.detach()
        batch.leaf = None
        for r in batch.reads:
            r.leaf = None
        self._end_read(batch)
        if self.transfer is not None:  # nothing reads the rows any more (the leaf is a copy)
            self.transfer.recycle(batch.rows)

    # --- commit ---------------------------------------------------------------------------------------------
    def refresh(self, batch: TableRows, leaf: bool = False) -> int:
        """Bring a batch held across later steps up to the newest step (rows written since are replaced: from
        the log when it covers the batch, else re-read after a flush); with ``leaf``, its leaf too. Returns how
        many rows were replaced. A no-op for async batches and for batches no step ran after."""
        if batch.seen is None or batch.seen >= self.steps - 1:
            return 0
        if self.log is not None and self.log.covers(batch.seen) and self.dist is None:
            n = int(self.log.patch(batch.ids_dev, batch.rows, batch.seen))
        else:
            self.flush()
            batch.rows.copy_(self.store.gather(batch.ids))
            n = batch.ids.numel()
        batch.seen = self.steps - 1
        live = batch.live_leaf() if leaf else None
        if live is not None:
            with torch.no_grad():
                live.copy_(batch.rows[:, : live.shape[1]])
        return n

    def catch_up(self, batch: TableRows) -> int:
        """Bring an async batch's rows (used as read at version ``rv``) to the newest step, for a staleness
        rule's commit (:mod:`dgl_oac.baselines.staleness`): :meth:`refresh` from the read version (from the log while it
        covers ``rv``; a batch held longer than that is re-read). Returns the count."""
        if batch.kind != "async" or batch.rv is None:
            raise RuntimeError(f"NodeEmbedding {self.name!r}: catch_up() is for async reads, not {batch.kind}")
        batch.seen = batch.rv
        with torch.profiler.record_function("dgl_oac.catch_up"):
            return self.refresh(batch)

    def moved_since(self, batch: TableRows) -> Optional[torch.Tensor]:
        """``bool[n]`` (device): which of ``batch``'s rows a step after its read version wrote; None when no
        step was committed since (or no log exists: nothing reads ahead)."""
        if self.log is None or batch.rv >= self.steps - 1:
            return None
        return self.log.stale(batch.ids_dev, batch.rv)[0]

    def kernel_out(self, n: int) -> Optional[torch.Tensor]:
        """Where the next step's row kernel writes ``float32[n, W]``: the log's ring (oac: logged without a copy),
        a pooled CPU buffer, or None (allocate)."""
        if self.log is not None:
            return self.log.reserve(n)
        return None if self.transfer is None else self.transfer.kernel_out(n, self.store.width)

    def commit(self, batches: List[TableRows], ids: torch.Tensor, ids_dev: torch.Tensor, new: torch.Tensor,
               delta_from: Optional[torch.Tensor] = None,
               forwarded: Optional[Tuple[torch.Tensor, torch.Tensor]] = None) -> int:
        """Commit the next step: ``new: float32[u, W]`` (device) for unique ``ids``; with ``delta_from`` (async)
        the table gets ``new - delta_from`` added instead. ``forwarded`` (distributed): ``(ids_dev, rows)`` other
        owners wrote in this step, logged with it (not written: they are their owners'). ``batches`` are
        released whether or not it succeeds (a failed step is skipped, never re-applied). Returns the step."""
        try:
            step = self._write(ids, ids_dev, new, delta_from, forwarded)
        finally:
            for b in batches:
                self.release(b)
        self._trim()
        return step

    def _trim(self) -> None:
        """Drop log entries no open read can miss (after releases: a committed batch's read no longer counts)."""
        if self.log is not None:
            self.log.drop_through(self.clock.horizon())

    def _write(self, ids: torch.Tensor, ids_dev: torch.Tensor, new: torch.Tensor,
               delta_from: Optional[torch.Tensor], forwarded: Optional[Tuple[torch.Tensor, torch.Tensor]]) -> int:
        step = self.steps
        logged = (ids_dev, new) if not forwarded or not forwarded[0].numel() else \
            (torch.cat([ids_dev, forwarded[0]]), torch.cat([new, forwarded[1]]))
        if delta_from is not None and self.log is not None:
            raise RuntimeError(f"NodeEmbedding {self.name!r}: an async (delta) commit while an oac write log "
                               f"exists would leave the log wrong")
        payload = new if delta_from is None else torch.sub(new, delta_from, out=new)
        op = "write" if delta_from is None else "add"
        if self.writer is not None:
            (host,), event = self.transfer.to_host(payload)  # before the log: a failure here leaves no trace
            if self.log is not None:
                self.log.append(step, *logged)
            self.writer.submit(step, ids, host, event, op)
        else:
            host = payload.cpu()
            (self.store.add if op == "add" else self.store.write)(ids, host)
            if self.log is not None:
                self.log.append(step, *logged)
            self.clock.publish(step)
            if self.transfer is not None:
                self.transfer.recycle(host)
        self.steps += 1
        return step

    def write_values(self, ids: torch.Tensor, values: torch.Tensor) -> int:
        """Overwrite the values of rows ``ids: int64[n], CPU`` (unique) with ``values: float32[n, D]``, CPU, as
        the next step (optimizer state kept): the one write path of commits (step order, log, write-back), so
        batches read ahead are patched as for any step. Returns the step."""
        if self.dist is not None:
            raise NotImplementedError(f"NodeEmbedding {self.name!r} is trained by several ranks: write_rows is "
                                      f"single-process only")
        self.flush()  # every committed step is in the table: the state columns kept are the current ones
        rows = self.store.gather(ids)
        rows[:, : values.shape[1]] = values
        dev = self.log.device if self.log is not None else \
            self.transfer.device if self.transfer is not None else torch.device("cpu")
        with torch.no_grad():
            return self.commit([], ids, ids.to(dev), rows.to(dev))

    # --- state ----------------------------------------------------------------------------------------------
    def check(self) -> None:
        """Raise a failure of the write-back thread in the caller (again at every call: the table misses the
        steps that were queued behind it)."""
        for writer in (self._failed, self.writer):
            if writer is not None:
                writer.check()

    def flush(self) -> None:
        """Wait until every committed step is in the table."""
        self.check()
        if self.writer is not None:
            self.writer.flush()

    def idle(self) -> bool:
        """Nothing read and uncommitted, no read open."""
        return not self.pending() and self.clock.open_reads() == 0

    def reset(self) -> None:
        """The table's contents are about to be replaced (a checkpoint, ``load_state_dict``): forget the log."""
        if not self.idle():
            raise RuntimeError(f"cannot replace the table of NodeEmbedding {self.name!r} while batches are in "
                               f"flight; close its loader (and commit or drop its batches) first")
        self.flush()
        if self.log is not None:  # its ring holds rows of the replaced table
            self.log = WriteLog(self.store.num_rows, self.store.width, self.log.device, after=self.steps - 1,
                                steps_hint=self.log.steps_hint)

    def close(self) -> None:
        """Drop uncommitted batches, apply every committed step and stop the write-back thread. Idempotent."""
        for b in self.pending():
            self.release(b)
        self._leases = 1
        self.give_back()
        self._spare_log = None
