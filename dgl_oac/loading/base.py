"""What every loader shares: :class:`LoaderBase` (its settings, its stats, its current epoch and how it ends).

A loader subclasses it, makes a :class:`~dgl_oac.loading.source.BatchSource` at each ``iter(loader)`` and starts
the epoch with :meth:`LoaderBase.start_epoch`. The loader holds its epoch weakly: a loop left without ``close()``
frees the epoch at once (refcount, no cycle), and the epoch's finalizer stops its threads; nothing relies on
``__del__``.
"""
from __future__ import annotations

import weakref
from typing import Any, List, Optional, TypeVar, Union

from .epoch import Closeable, Epoch, StructureCarrier
from .stats import LoaderStats, RowCount
from .settings import LoaderSettings
from .source import BatchSource

L = TypeVar("L", bound="LoaderBase")


class Setting:
    """A read-only loader attribute: the :class:`LoaderSettings` field of its name."""

    def __init__(self, doc: str) -> None:
        self.__doc__ = doc
        self.name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, loader: Optional["LoaderBase"], owner: Optional[type] = None) -> Any:
        return self if loader is None else getattr(loader.settings, self.name)

    def __set__(self, loader: "LoaderBase", value: Any) -> None:
        raise AttributeError(f"loader.{self.name} is read-only: it is resolved once, when the loader is built "
                             f"(pass {self.name}=... to the loader)")


class LoaderBase:
    """``settings`` (resolved once), the tables of ``embeddings`` (NodeEmbeddings) and ``stats``, counted over
    the loader's life. The settings read as attributes: ``loader.mode``, ``loader.prefetch``, ..."""

    def __init__(self, settings: LoaderSettings, embeddings: List[Any], stats: LoaderStats) -> None:
        self.settings = settings
        self.embeddings = embeddings
        self._stats = stats
        self._repatched = RowCount()  # stats.rows_repatched_at_commit, summed without a host sync per step
        self._iter: "Optional[weakref.ref[Epoch]]" = None  # the current epoch, weakly (module docstring)

    # --- the settings, read-only ------------------------------------------------------------------------------
    mode = Setting("``'sync'``, ``'async'`` or ``'oac'``.")
    staleness = Setting("async's rule for stale rows (``'gap'``, ``'lookahead'``), or None.")
    table_mode = Setting("What the tables are told: the mode, or ``mode-staleness``.")
    device = Setting("Where the rows are handed out (a ``torch.device``).")
    pin = Setting("Whether the host buffers of device copies are pinned.")
    check_finite = Setting("Whether a ``step()`` refuses to write NaN/Inf.")
    prefetch = Setting('The most batches read ahead (with ``prefetch="auto"``: the deepest the controller picks).')
    writeback_depth = Setting("The most committed steps queued for the write-back threads.")
    background_priority = Setting("``'auto'``, ``'idle'`` or ``'normal'``: the background threads' priority.")

    @property
    def stats(self) -> LoaderStats:
        """Counters and per-stage seconds (``writeback``: busy time of the embeddings' write-back threads)."""
        self._stats.seconds["writeback"] = sum(e.pipeline.writeback_seconds() for e in self.embeddings)
        self._stats.rows_repatched_at_commit = self._repatched.value()
        if self.settings.depth is not None:
            self._stats.depths = dict(self.settings.depth.chosen)
        return self._stats

    def prepare_tables(self) -> None:
        """Make what the tables need for this loader's mode and device (at each ``iter(loader)``)."""
        s = self.settings
        for emb in self.embeddings:
            emb.pipeline.prepare(s.device, s.pin, s.table_mode, s.check_finite)

    def start_epoch(self, source: BatchSource, epoch: int, start: int, num_batches: Union[int, float],
                    structure: Optional[StructureCarrier] = None, sampling: Optional[Closeable] = None) -> Epoch:
        """Epoch ``epoch`` of ``source`` from batch ``start`` (:class:`~dgl_oac.loading.epoch.Epoch`'s
        arguments); it becomes the current one. ``sampling`` is closed if the epoch cannot start."""
        try:
            it = Epoch(self.settings, source, self._stats, self._repatched, self.embeddings, epoch, start,
                       num_batches, structure, sampling)
        except BaseException:
            if sampling is not None:
                sampling.close()
            raise
        self._iter = weakref.ref(it)
        return it

    def close(self) -> None:
        """End the current epoch: stop its threads (queued write-backs applied first). Idempotent. Batches
        already handed out stay with their tables: a later ``step()`` still commits them."""
        it = None if self._iter is None else self._iter()
        if it is not None:
            it.close()
        self._iter = None

    def __enter__(self: L) -> L:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
