"""Rows in flight across ranks: what a trainer registers with owners, and what an owner must forward.

Trainer side, :class:`Registry` (one per distributed table, used by its :class:`~dgl_oac.engine.pipeline.TablePipeline`):
every read (a gather ahead of time, or ``emb(ids)``) opens its version and joins the *fresh* list atomically;
``step()`` t takes the fresh reads (they ride with step t's gradients to the rows' owners) and, until step t
is written everywhere, no read opens: a read opened later has version >= t. So every read is registered with
its owners before the commit that follows its version, and owners forward each later write of its rows.
Released reads are deregistered at the next step.

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

from ..engine.oac import VersionClock
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

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._fresh: List[Entry] = []
        self._gone: List[torch.Tensor] = []
        self._stepping = False

    def open_read(self, clock: VersionClock, ids: torch.Tensor) -> Tuple[int, Entry]:
        """Open a read at the current version and list it for registration (waits while a step is running)."""
        with self._cond:
            if not self._cond.wait_for(lambda: not self._stepping, STEP_WAIT_S):
                raise TimeoutError(f"a read waited {STEP_WAIT_S}s for step() to finish on the other ranks")
            entry = Entry(ids)
            self._fresh.append(entry)
            return clock.begin_read(), entry

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

    def take(self, committing: Sequence[Optional[Entry]] = ()) -> Tuple[torch.Tensor, torch.Tensor]:
        """Start a step: ``(registered: int64[a], deregistered: int64[b])`` ids (repeats count), and hold new
        reads until :meth:`done`. The reads this step ``committing`` are deregistered now: their batches are
        released by the step, and owners need not forward its rows for them; one opened since the last step
        (every read in sync) is never registered at all (+1 and -1 in one step would cancel: 16 bytes a row
        sent for nothing)."""
        with self._cond:
            self._stepping = True
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
            self._stepping = False
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
    def make(cls, partition: RowPartition, rank: int) -> "DistTable":
        return cls(Registry(), OwnerBook(partition, rank), partition)
