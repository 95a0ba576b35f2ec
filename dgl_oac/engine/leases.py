"""The write-back thread and the write log of one table, leased by the epochs that read ahead.

Lifetime: both exist while at least one epoch reads ahead (:meth:`Leases.lease` at its start,
:meth:`Leases.give_back` at its end, whatever ends it). The first lease starts the write-back thread
(:class:`~dgl_oac.engine.writeback.WriteBack`; not for a distributed table, whose owners write through) and,
for modes that log their writes (oac, async with a hook), makes the write log on the compute device; the last
lease applies every queued step, stops the thread and retires the log (its memory is kept for the next lease).
Without a lease, commits write through and held batches are re-read: sync's code path.

A write-back that failed stays here until the table is closed: every later :meth:`Leases.check` raises its
error in the caller, because the table misses the steps that were queued behind it.
"""
from __future__ import annotations

from typing import Optional

from ..config import logs_writes
from .oac import VersionClock, WriteLog
from .store import RowStore
from .transfer import Transfer
from .writeback import WriteBack


class Leases:
    """The leased resources of one table (see the module docstring). Caller's thread only."""

    def __init__(self, name: str, store: RowStore, clock: VersionClock, write_through: bool) -> None:
        self.name = name
        self.store = store
        self.clock = clock
        self.write_through = write_through  # a distributed table: no write-back thread, ever
        self.log: Optional[WriteLog] = None     # while a logging epoch reads ahead, on the compute device
        self.writer: Optional[WriteBack] = None
        self._spare_log: Optional[WriteLog] = None  # the last one, kept for its memory
        self._count = 0
        self._mode = ""
        self._busy_s = 0.0  # busy seconds of write-back threads already stopped
        self._failed: Optional[WriteBack] = None

    def lease(self, mode: str, depth: int, priority: str, steps_in_flight: int, after: int,
              transfer: Transfer, threads: int = 1) -> None:
        """An epoch of ``mode`` starts reading ahead; ``after``: the newest committed step (the log starts after
        it). The first lease decides the write-back's depth, priority and OpenMP team (``threads``)."""
        if self._count and self._mode != mode:
            raise RuntimeError(f"NodeEmbedding {self.name!r} is pipelined by a {self._mode} loader; a {mode} "
                               f"loader cannot read ahead of it at the same time")
        if logs_writes(mode) and self.log is None:
            spare, self._spare_log = self._spare_log, None
            self.log = spare.restart(after=after) if spare is not None and spare.width == self.store.width \
                else WriteLog(self.store.num_rows, self.store.width, transfer.device, after=after)
        if self.log is not None:
            self.log.steps_hint = max(self.log.steps_hint, steps_in_flight)
        if self.writer is None and not self.write_through:
            self.writer = WriteBack(self.store, self.clock, depth, self.name, priority, transfer.recycle, threads)
        self._count += 1
        self._mode = mode

    def give_back(self) -> None:
        """An epoch stops reading ahead; the last lease applies every queued step, stops the thread and retires
        the log."""
        self._count -= 1
        if self._count > 0:
            return
        self._count = 0
        writer, self.writer = self.writer, None
        if writer is not None:
            try:
                writer.close()
            finally:
                self._busy_s += writer.busy_s
                if writer.failed():
                    self._failed = writer
        self.log, self._spare_log = None, self.log or self._spare_log  # the next lease reuses its memory

    def renew_log(self, after: int) -> None:
        """The table's contents were replaced: a fresh log (the old ring holds rows of the replaced table)."""
        if self.log is not None:
            self.log = WriteLog(self.store.num_rows, self.store.width, self.log.device, after=after,
                                steps_hint=self.log.steps_hint)

    def busy_seconds(self) -> float:
        """Busy time of this table's write-back threads so far."""
        return self._busy_s + (self.writer.busy_s if self.writer is not None else 0.0)

    def check(self) -> None:
        """Raise a failure of the write-back thread in the caller (again at every call)."""
        for writer in (self._failed, self.writer):
            if writer is not None:
                writer.check()

    def flush(self) -> None:
        """Wait until every committed step is in the table."""
        self.check()
        if self.writer is not None:
            self.writer.flush()

    def close(self) -> None:
        """Apply every committed step, stop the thread, drop the logs. Idempotent."""
        self._count = 1
        self.give_back()
        self._spare_log = None
