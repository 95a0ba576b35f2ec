"""Optimistic Asynchrony Control: versions, the device write log, validate and patch.

Steps are numbered 0, 1, 2, ... in commit order, per embedding. Two structures:

* :class:`VersionClock` (host, shared by threads): ``applied`` = every row of steps <= applied is in the CPU
  table. A gather opens a *read* at ``rv = applied``; it is closed when its batch is handed out (validated and
  patched then, the rows are current; a batch held across later steps is refreshed at commit, ``refresh.py``),
  or when a batch never handed out is released (``TablePipeline.register`` / ``_released``). Like an MVCC
  database's oldest active snapshot, the smallest open ``rv`` is the *horizon*: log entries of steps <= horizon
  can no longer be needed by anyone and are dropped.
* :class:`WriteLog` (on the compute device, main thread only): a ring of the rows each recent step wrote, each
  row at a *slot* (a global, monotonically increasing counter; ring position = slot % capacity). Each step's rows
  start at a slot whose address is a multiple of :data:`~dgl_oac.engine.kernel.ROW_ALIGN` bytes, as a fresh
  allocation's is: the commit's kernel writes there, and its ops see the alignments they see in sync.

Validate (before a batch is handed out): a row is stale iff a step after ``rv`` wrote it; its newest slot holds
what sync would have read, and replaces the row whole (value and optimizer state). Which slot that is, two ways:

* host tables on the CPU: ``last_slot: int64[N]``, the newest slot of every row; one int64 gather per row. 8 bytes
  a row beside the table's own ``4 (D + S)`` in host memory.
* a device log (CUDA): no O(N) state on the device, whose memory is what a table bigger than the GPU lacks.
  Each entry keeps its step's ids; a validation sorts the ids written after ``rv`` (a few steps' rows, stable, so
  the newest write of an id is the last of its run) and looks the batch's ids up with ``searchsorted``. Device
  memory is O(rows in flight): the ring plus 8 bytes per logged row.

Both make no host round trip and no Python loop over rows.
"""
from __future__ import annotations

import math
import threading
from collections import Counter, deque
from typing import Deque, Optional, Tuple

import torch

from .kernel import ROW_ALIGN
from .sorting import stable_sort


class VersionClock:
    """Which steps are durable in the table (``applied``) and which snapshots are still being read."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self.applied = -1
        self._open: Counter = Counter()

    def begin_read(self, at: Optional[int] = None) -> int:
        """Open a read at the current version (or at step ``at`` > ``applied``: a read that will see a step not
        published yet); atomic with ``publish`` so the horizon never passes it."""
        with self._cond:
            rv = self.applied if at is None else at
            self._open[rv] += 1
            return rv

    def end_read(self, rv: int) -> None:
        with self._cond:
            if self._open[rv] <= 0:
                raise RuntimeError(f"read at version {rv} closed twice or never opened")
            self._open[rv] -= 1
            if not self._open[rv]:
                del self._open[rv]

    def publish(self, step: int) -> None:
        """Called after step ``step``'s rows are in the table. Steps publish in order."""
        with self._cond:
            if step != self.applied + 1:
                raise RuntimeError(f"steps published out of order: step {step} after {self.applied}")
            self.applied = step
            self._cond.notify_all()

    def horizon(self) -> int:
        """Newest step that no open read can miss (min of open reads and ``applied``)."""
        with self._cond:
            return min(min(self._open), self.applied) if self._open else self.applied

    def open_reads(self) -> int:
        with self._cond:
            return sum(self._open.values())

    def wait_applied(self, step: int, timeout: float) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: self.applied >= step, timeout)


class WriteLog:
    """Device-side ring of recently written rows, indexed by ``last_slot: int64[N]`` (-1 = never written) or, for
    a sync-free (CUDA) log, by the ids of the entries themselves (module docstring)."""

    def __init__(self, num_rows: int, width: int, device: torch.device, after: int = -1, steps_hint: int = 0,
                 capacity: int = 1 << 14, sync_free: Optional[bool] = None) -> None:
        """A log of the steps after step ``after`` (a read at an older version cannot be validated)."""
        self.device = device
        self.width = width
        # slots a step's first row is a multiple of: its address is then one of ROW_ALIGN bytes (float32 rows)
        self.slot_align = ROW_ALIGN // math.gcd(4 * width, ROW_ALIGN)
        self.ring = self._new_ring(capacity)
        self.entries: Deque[Tuple[int, int, int]] = deque()  # (step, first slot, rows)
        self.next_slot = 0
        self.dropped_upto = after  # newest step whose entry was dropped (or that came before the log)
        self._reserved: Optional[Tuple[int, torch.Tensor]] = None  # (first slot, ring slice) of the next step
        # steps whose rows can be live at once (set by the loader: prefetch + write-back depth + 2); sizes the
        # ring from the first step instead of doubling it (a new ring, and a copy of its live rows) 4-5 times
        self.steps_hint = steps_hint
        # CUDA: avoid nonzero() (a host sync) by patching with a masked gather over the whole batch. A seam:
        # tests run that path on CPU with sync_free=True.
        self.sync_free = device.type == "cuda" if sync_free is None else bool(sync_free)
        # which slot holds a row's newest write: O(N) on the host, O(rows logged) on a device (module docstring)
        self.last_slot: Optional[torch.Tensor] = None
        self._entry_ids: Deque[torch.Tensor] = deque()  # sync-free: each entry's ids: int64[rows], device
        if not self.sync_free:
            self.last_slot = torch.full((num_rows,), -1, dtype=torch.int64, device=device)

    def restart(self, after: int) -> "WriteLog":
        """Reuse this log (its ring's memory, already paged in) for the steps after ``after``: no entry is kept.
        ``last_slot`` may keep old slots: they are all below ``next_slot``, so never read as stale."""
        self.entries.clear()
        self._entry_ids.clear()
        self._reserved = None
        self.dropped_upto = after
        return self

    @property
    def capacity(self) -> int:
        return self.ring.shape[0]

    def _live_from(self) -> int:
        return self.entries[0][1] if self.entries else self.next_slot

    def covers(self, rv: int) -> bool:
        """Whether every step after ``rv`` is still in the log (a read at ``rv`` can be validated)."""
        return rv >= self.dropped_upto

    def first_slot_after(self, rv: int) -> int:
        """Smallest slot written by a step > rv. Fails loudly if such a step was already dropped."""
        if not self.covers(rv):
            raise RuntimeError(
                f"OAC invariant broken: a batch read at version {rv}, but the write log already dropped steps up "
                f"to {self.dropped_upto}; its stale rows could not be patched (pipeline deeper than the log)")
        if self.entries and self.entries[0][0] != self.dropped_upto + 1:
            raise RuntimeError(f"OAC invariant broken: the write log misses step {self.dropped_upto + 1} (its oldest "
                               f"entry is step {self.entries[0][0]}); rows that step wrote could not be patched")
        for step, start, _ in self.entries:
            if step > rv:
                return start
        return self.next_slot

    def stale(self, ids: torch.Tensor, rv: int) -> Tuple[torch.Tensor, torch.Tensor]:
        """``(mask: bool[n], slots: int64[n])`` for ``ids: int64[n]`` on the device: which rows a step after ``rv``
        wrote, and the slot of their newest write (where ``mask`` is False: below the first slot after ``rv``)."""
        first = self.first_slot_after(rv)
        if self.last_slot is not None:
            slots = self.last_slot.index_select(0, ids)
            return slots >= first, slots
        return self._stale_window(ids, first)

    def _stale_window(self, ids: torch.Tensor, first: int) -> Tuple[torch.Tensor, torch.Tensor]:
        """:meth:`stale` from the entries written at slots >= ``first``: sort their ids (stable: slots ascend in
        entry order, so an id's newest write ends its run), then one ``searchsorted`` per id. No host sync."""
        parts = [(e, i) for e, i in zip(self.entries, self._entry_ids) if e[1] >= first]
        if not parts:
            return torch.zeros(ids.shape, dtype=torch.bool, device=ids.device), torch.full_like(ids, -1)
        wids = torch.cat([i for _, i in parts])
        wslots = torch.cat([torch.arange(e[1], e[1] + e[2], device=ids.device) for e, _ in parts])
        sorted_ids, order = stable_sort(wids)
        at = torch.searchsorted(sorted_ids, ids, right=True).sub_(1).clamp_(min=0)
        mask = sorted_ids.index_select(0, at) == ids
        slots = torch.where(mask, wslots.index_select(0, order.index_select(0, at)), torch.full_like(ids, -1))
        return mask, slots

    def patch(self, ids: torch.Tensor, rows: torch.Tensor, rv: int) -> torch.Tensor:
        """Replace stale rows in place with their newest logged copy; returns the count (0-d tensor)."""
        mask, slots = self.stale(ids, rv)
        if self.sync_free:
            fresh = self.ring.index_select(0, slots.clamp_min(0) % self.capacity)
            torch.where(mask.unsqueeze(1), fresh, rows, out=rows)
            return mask.sum()
        idx = mask.nonzero().squeeze(1)
        if idx.numel():
            rows[idx] = self.ring.index_select(0, slots.index_select(0, idx) % self.capacity)
        return torch.tensor(idx.numel())

    def reserve(self, n: int) -> torch.Tensor:
        """A contiguous ``float32[n, W]`` slice of the ring for the next step's rows, so the commit's kernel can
        write into the log directly (no copy). It stays untouched until that step is dropped, i.e. until its
        write-back has applied it: the write-back may read it in place."""
        if not self.entries and self.capacity < n * self.steps_hint:  # nothing live: a new ring copies nothing
            self.ring = self._new_ring(n * self.steps_hint * 5 // 4)
        while True:
            start = -(-self.next_slot // self.slot_align) * self.slot_align
            if start % self.capacity + n > self.capacity:  # skip the tail: the slice must not wrap
                start += self.capacity - start % self.capacity
            if start + n - self._live_from() <= self.capacity:
                break
            self._grow(start + n - self._live_from())
        pos = start % self.capacity
        self._reserved = (start, self.ring[pos:pos + n])
        if n and self._reserved[1].data_ptr() % ROW_ALIGN:
            raise RuntimeError(f"write log invariant broken: step rows at slot {start} (ring position {pos}, width "
                               f"{self.width}) start {self._reserved[1].data_ptr() % ROW_ALIGN} bytes past a "
                               f"{ROW_ALIGN}-byte boundary; the kernel would see other alignments than in sync")
        return self._reserved[1]

    def append(self, step: int, ids: torch.Tensor, rows: torch.Tensor) -> None:
        """Log step ``step``'s new rows (``ids`` unique, on the device); ``rows`` ideally from :meth:`reserve`."""
        last = self.entries[-1][0] if self.entries else self.dropped_upto
        if step != last + 1:
            raise RuntimeError(f"steps must be logged one after another: step {step} after step {last} (the write "
                               f"log would miss the steps between)")
        n = ids.numel()
        reserved = self._reserved
        if reserved is None or reserved[1].data_ptr() != rows.data_ptr() or reserved[1].shape != rows.shape:
            self.reserve(n).copy_(rows)
        start = self._reserved[0]
        self._reserved = None
        if self.last_slot is not None:
            self.last_slot.index_copy_(0, ids, torch.arange(start, start + n, device=self.device))
        else:
            # unique (the caller's contract): no two slots of one step share an id. A copy: the caller may reuse
            # its buffer, and the entry lives until its step is dropped
            self._entry_ids.append(ids.clone())
        self.entries.append((step, start, n))
        self.next_slot = start + n

    def drop_through(self, horizon: int) -> None:
        """Forget entries of steps <= horizon (no open read can miss them)."""
        while self.entries and self.entries[0][0] <= horizon:
            self.dropped_upto = self.entries.popleft()[0]
            if self._entry_ids:
                self._entry_ids.popleft()

    def _grow(self, need: int) -> None:
        # Slices handed out earlier keep the old ring alive (the write-back may still read them).
        ring = self._new_ring(max(2 * self.capacity, need))
        new_cap = ring.shape[0]
        live = torch.arange(self._live_from(), self.next_slot, device=self.device)
        if live.numel():
            ring.index_copy_(0, live % new_cap, self.ring.index_select(0, live % self.capacity))
        self.ring = ring

    def _new_ring(self, rows: int) -> torch.Tensor:
        """``float32[c, W]`` on the log's device, ``c >= rows`` a multiple of ``slot_align`` (so an aligned slot's
        ring position is aligned too); its base is: every allocator aligns to at least 16 bytes."""
        rows = -(-max(rows, 1) // self.slot_align) * self.slot_align
        return torch.empty(rows, self.width, dtype=torch.float32, device=self.device)

    def nbytes(self) -> int:
        """Bytes the log holds on its device: the ring, and ``last_slot`` or the logged ids."""
        ids = self.last_slot if self.last_slot is not None else self._entry_ids
        return self.ring.numel() * 4 + 8 * (ids.numel() if isinstance(ids, torch.Tensor) else sum(i.numel() for i in ids))
