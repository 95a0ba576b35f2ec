"""The interface between a loader and its epoch: :class:`BatchSource`, one pass of a loader's batches.

A loader makes a source at each ``iter(loader)`` and gives it to :class:`~dgl_oac.loading.epoch.Epoch`, which
calls nothing else of the loader. Whatever a pass needs (its iterator, its seeds, the leaves of the batch out
now) lives in the source, which ends with the epoch.
"""
from __future__ import annotations

from typing import Any, List, Protocol, runtime_checkable

import torch

from ..engine.pipeline import CommitListener, TableRows

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

    def handed_ids(self, out: Any) -> Any:
        """The ids tensor the caller got with ``out`` (what :meth:`hand_out` returned) that a model may read with
        ``emb(ids)``: the epoch marks it, so that a read of it that bypasses the pipeline warns
        (:mod:`dgl_oac.unpipelined`); None when the caller gets none (its reads are served otherwise)."""

    def retire(self) -> None:
        """The caller is done with the batch out now (it asked for the next one, or the epoch ended). Idempotent."""
