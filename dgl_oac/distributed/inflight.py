"""Rows in flight across ranks: what a trainer registers with owners, and what an owner must forward.

Trainer side, :class:`Registry` (one per distributed table, used by its
:class:`~dgl_oac.engine.pipeline.TablePipeline`):
every read (a gather ahead of time, or ``emb(ids)``) opens its version and joins the *fresh* list atomically;
``step()`` t takes the fresh reads (they ride with step t's gradients to the rows' owners), so every read opened
before step t is registered with its owners before they commit t, and owners forward each later write of its
rows. A read opened while step t runs (after the take) is registered only at step t + 1, so it must not miss
t: it opens at version t, and its rows are read once step t is in them. How that is ensured depends on where
the rows are: a replicated table (rows in this machine's shared replica, written by every owner of the
machine and the mirrors) holds reads back until step t is written everywhere (``blocking``); a sharded table's
owners serve a read at version t once they have applied t (:mod:`.rowserver`), so the read opens at once and
its request travels while the step finishes. Released reads are deregistered at the next step.

Owner side, :class:`OwnerBook`: for each trainer, how many of its live reads hold each owned row; after a
commit the owner forwards to each trainer the new rows it holds.

Locking: ``open_read`` runs on the gather thread, ``take``/``done`` in ``step()`` on the caller's thread,
``release`` on any thread (a leaf's finalizer); one condition guards the lists.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import List, Optional, Sequence, Tuple

import torch

from ..engine.table import VersionClock
from .partition import RowPartition

#: how long a read waits for a step in progress before failing (it only ever waits for one step)
STEP_WAIT_S = 600.0


@dataclass(eq=False)
class Entry:
    """One registered read: its ids (int64[n], CPU) and whether owners know about it yet."""

    ids: torch.Tensor
    sent: bool = False
    released: bool = field(default=False)


class Registry:
    """Trainer side (see the module docstring)."""

    def __init__(self, blocking: bool = True) -> None:
        self._cond = threading.Condition()
        self._fresh: List[Entry] = []
        self._gone: List[torch.Tensor] = []
        self._stepping: Optional[int] = None  # the step running (between take and done), if any
        self.blocking = blocking
        self.opened_during_steps = 0  # reads opened while a step ran (never, when blocking)

    def open_read(self, clock: VersionClock, ids: torch.Tensor, register: bool = True) -> Tuple[int, Entry]:
        """Open a read and list it for registration (unless not ``register``: an async read, never patched): at
        the current version, or, while step t runs, at version t (``blocking``: after step t is done instead,
        waiting for it)."""
        with self._cond:
            if self.blocking and not self._cond.wait_for(lambda: self._stepping is None, STEP_WAIT_S):
                raise TimeoutError(f"a read waited {STEP_WAIT_S}s for step() to finish on the other ranks")
            entry = Entry(ids)
            if register:
                self._fresh.append(entry)
            self.opened_during_steps += self._stepping is not None
            return clock.begin_read(at=self._stepping), entry

    def release(self, entry: Entry) -> None:
        """The read ended: unlist it, or deregister it at the next step if owners know it. Idempotent."""
        with self._cond:
            if entry.released:
                return
            entry.released = True
            if entry.sent:
                self._gone.append(entry.ids)
            else:
                self._fresh = [e for e in self._fresh if e is not entry]

    def take(self, step: int, committing: Sequence[Optional[Entry]] = ()) -> Tuple[torch.Tensor, torch.Tensor]:
        """Start step ``step``: ``(registered: int64[a], deregistered: int64[b])`` ids (repeats count); reads opened
        until :meth:`done` are at version ``step`` (see the module docstring). The reads this step ``committing`` are
        deregistered now: their batches are
        released by the step, and owners need not forward its rows for them; one opened since the last step
        (every read in sync) is never registered at all (+1 and -1 in one step would cancel: 16 bytes a row
        sent for nothing)."""
        with self._cond:
            self._stepping = step
            gone, self._gone = self._gone, []
            for e in committing:
                if e is not None and not e.released:
                    e.released = True
                    if e.sent:
                        gone.append(e.ids)
            fresh, self._fresh = [e for e in self._fresh if not e.released], []
            for e in fresh:
                e.sent = True
        empty = torch.empty(0, dtype=torch.int64)
        return (torch.cat([e.ids for e in fresh]) if fresh else empty,
                torch.cat(gone) if gone else empty)

    def done(self) -> None:
        """The step is written on every rank (or failed): reads may open again."""
        with self._cond:
            self._stepping = None
            self._cond.notify_all()


class OwnerBook:
    """Owner side: ``held[trainer, id - lo]`` = live reads of ``trainer`` holding owned row ``id`` (this rank owns
    rows ``lo <= id < hi`` of ``partition``)."""

    def __init__(self, partition: RowPartition, rank: int) -> None:
        self.partition, self.rank = partition, rank
        self.lo, self.hi = partition.range_of(rank)
        self.held = torch.zeros(partition.world, self.hi - self.lo, dtype=torch.int32)

    def apply(self, trainer: int, ids: torch.Tensor, delta: int) -> None:
        """``delta`` (+1 registered, -1 released) for each of ``ids`` (owned by this rank; repeats add up)."""
        if ids.numel():
            if bool(((ids < self.lo) | (ids >= self.hi)).any()):
                raise RuntimeError(f"rank {self.rank} got in-flight ids of rows it does not own")
            self.held[trainer].index_add_(0, ids - self.lo, torch.full_like(ids, delta, dtype=torch.int32))

    def held_by(self, trainer: int, ids: torch.Tensor) -> torch.Tensor:
        """``bool[n]``: which of owned ``ids`` ``trainer`` has in flight."""
        return self.held[trainer].index_select(0, ids - self.lo) > 0


@dataclass(eq=False)
class DistTable:
    """A distributed table's in-flight bookkeeping: its reads as a trainer, other trainers' reads as an owner."""

    registry: Registry
    book: OwnerBook
    partition: RowPartition

    @classmethod
    def make(cls, partition: RowPartition, rank: int, sharded: bool) -> "DistTable":
        """``sharded``: the table's rows live on their owners, which serve a read once its version is applied,
        so reads never wait for a step here; a replicated table's reads do."""
        return cls(Registry(blocking=not sharded), OwnerBook(partition, rank), partition)
