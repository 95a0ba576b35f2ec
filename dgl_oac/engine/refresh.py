"""Bring a held batch's rows up to the newest step, at commit (or when ``emb(ids)`` reads it again).

A batch's read closes at hand-out (:mod:`dgl_oac.engine.table`), so nothing a user holds pins the write log.
Instead, a batch held across later steps is refreshed on the caller's thread: rows written after the step it
last saw (``BatchState.seen``, written here alone) are replaced from the write log while the log covers that
step, else the rows are re-read after a flush. A distributed table always re-reads: its log holds only what other
owners forwarded for registered reads. Async batches are never refreshed (they compute at what they read), except by their hook's
:meth:`Refresh.catch_up` (:mod:`dgl_oac.engine.hooks`).
"""
from __future__ import annotations

from typing import Any, Callable, Optional, Union

import torch

from .batch import HandedOut, TableRows
from .table import Leases
from .table import RowStore
from .transfer import pinned_empty

#: A count of rows: an int where the host knows it, a 0-d tensor on the device where it does not (reading it would
#: make the host wait for the device: sum such counts as tensors, read them when reported).
Count = Union[int, torch.Tensor]


class Refresh:
    """Refreshes the batches of one table; ``steps()`` is the table's step counter (the next step's number)."""

    def __init__(self, name: str, store: RowStore, leases: Leases, steps: Callable[[], int], dist: Any) -> None:
        self.name = name
        self.store = store
        self.leases = leases
        self._steps = steps
        self.dist = dist

    def refresh(self, batch: HandedOut, leaf: bool = False) -> Count:
        """Bring ``batch`` up to the newest step; with ``leaf``, its hand-out leaf too. Returns how many rows were
        replaced: from the log, a 0-d tensor on its device (reading it would be a host sync). A no-op for async
        batches and for batches no step ran after."""
        newest = self._steps() - 1
        seen = batch.state.seen
        if seen is None or seen >= newest:
            return 0
        log = self.leases.log
        n: Count
        if log is not None and log.covers(seen) and self.dist is None:
            n = log.patch(batch.ids_dev, batch.rows, seen)
        else:  # the log no longer covers it (held longer than the pipeline's depth), or a distributed table
            self.leases.flush()
            staging = None if batch.rows.device.type == "cpu" else \
                pinned_empty((batch.ids.numel(), self.store.width), torch.float32)
            batch.rows.copy_(self.store.gather(batch.ids, out=staging, at=newest), non_blocking=True)
            n = batch.ids.numel()
        batch.state.seen = newest
        live = batch.live_leaf() if leaf else None
        if live is not None:
            with torch.no_grad():
                live.copy_(batch.rows[:, : live.shape[1]])
        return n

    def current_leaf(self, batch: HandedOut) -> Optional[torch.Tensor]:
        """``batch``'s leaf with the rows as of now (DGL reads at call time): a batch held across a step is
        refreshed in place while it has no gradient; None once it has one and is behind (read anew instead)."""
        seen = batch.state.seen
        if seen is not None and seen < self._steps() - 1:
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
        log = self.leases.log
        if log is None or batch.rv >= self._steps() - 1:
            return None
        return log.stale(batch.ids_dev, batch.rv)[0]
