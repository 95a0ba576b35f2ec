"""The interface between a loader and its epoch: :class:`BatchSource`, one pass of a loader's batches.

A loader makes a source at each ``iter(loader)`` and gives it to :class:`~dgl_oac.loading.epoch.Epoch`, which
calls nothing else of the loader. Whatever a pass needs (its iterator, its seeds, the leaves of the batch out
now) lives in the source, which ends with the epoch.
"""
from __future__ import annotations

from typing import Any, List, Protocol, Union, runtime_checkable

import torch

from ..engine.pipeline import CommitListener, HandedOut, TableRows
from ..engine.stats import LoaderStats

#: What :meth:`BatchSource.pull` returns when the source has no more batches.
END = object()

@runtime_checkable
class BatchSource(Protocol):
    """One pass of a loader's batches, as its epoch uses it (calls on the caller's thread unless noted)."""

    def pull(self, b: int) -> Any:
        """Batch ``b`` (asked for in order: 0, 1, ... from the epoch's start), or :data:`END`."""

    def table_ids(self, batch: Any) -> List[torch.Tensor]:
        """Each table's unique ids ``int64[n], CPU`` for ``batch``, in the epoch's table order (on the gather
        thread, or at hand-out): a pure function of the batch."""

    def hand_out(self, batch: Any, rows: List[TableRows], listener: CommitListener) -> Any:
        """Validate and register ``rows`` (gathered for ``batch``; their batches tell ``listener`` when they
        commit) and make what
        the caller gets. The source may hold the batch's leaves until :meth:`retire`."""

    def retire(self) -> None:
        """The caller is done with the batch out now (it asked for the next one, or the epoch ended). Idempotent."""


class RowCount:
    """A count added to without a host sync: ints on the host, 0-d device tensors (rows a commit patched from a
    device's write log: :data:`dgl_oac.engine.pipeline.Count`) on their device; :meth:`value` reads the sum (a
    sync, when a loader's stats are read)."""

    def __init__(self) -> None:
        self._host = 0
        self._device: Union[torch.Tensor, None] = None

    def add(self, n: Union[int, torch.Tensor]) -> None:
        if isinstance(n, torch.Tensor):
            self._device = n if self._device is None else self._device + n.to(self._device.device)
        else:
            self._host += n

    def value(self) -> int:
        return self._host + (0 if self._device is None else int(self._device))


class CommitCounter:
    """An epoch's :class:`~dgl_oac.engine.pipeline.CommitListener`: counts its batches' commits into the loader's
    ``stats``, also after the epoch ended (``list(loader)``); the rows repatched go to ``repatched_rows``, which the
    loader's ``stats`` reads. One per epoch: it also tells the epoch's pending batches apart."""

    def __init__(self, stats: LoaderStats, repatched_rows: RowCount) -> None:
        self.stats, self.repatched_rows = stats, repatched_rows

    def committed(self, batch: HandedOut, seconds: float, repatched: Union[int, torch.Tensor]) -> None:
        self.stats.committed += 1
        self.stats.seconds["commit"] += seconds
        self.repatched_rows.add(repatched)
