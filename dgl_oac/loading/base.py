"""What every loader shares: :class:`LoaderBase` (its settings, its stats, its current epoch and how it ends,
where it resumes, async's staleness rules).

A loader subclasses it: at each ``iter(loader)`` it asks :meth:`LoaderBase.next_epoch` which epoch and batch to
start at, makes a :class:`~dgl_oac.loading.source.BatchSource` for them and starts the epoch with
:meth:`LoaderBase.start_epoch`. Resume (:meth:`LoaderBase.state_dict`, :meth:`LoaderBase.load_state_dict`) and
the staleness rules (:attr:`LoaderBase.rules`) are the same for every source. The loader holds its epoch weakly: a
loop left without ``close()`` frees the epoch at once (refcount, no cycle), and the epoch's finalizer stops its
threads; nothing relies on ``__del__``.
"""
from __future__ import annotations

import weakref
from typing import Any, Dict, List, Optional, Tuple, TypeVar, Union

from ..baselines.staleness import make_rule

from .epoch import Closeable, Epoch, Progress, StructureCarrier
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

    def __init__(self, settings: LoaderSettings, embeddings: List[Any], stats: LoaderStats,
                 seed: Optional[int] = None) -> None:
        self.settings = settings
        self.embeddings = embeddings
        self.seed = seed
        self._stats = stats
        self._repatched = RowCount()  # stats.rows_repatched_at_commit, summed without a host sync per step
        self._iter: "Optional[weakref.ref[Epoch]]" = None  # the current epoch, weakly (module docstring)
        self._epoch, self._start = 0, 0  # where the next iter(loader) starts (next_epoch)
        # the current epoch's position: outlives the epoch (held weakly) for state_dict() and the next iter()
        self._progress: Optional[Progress] = None
        #: each table's hook (:class:`~dgl_oac.engine.pipeline.BatchHook`): async's staleness rule, or none
        self.rules = [make_rule(settings.staleness, e) for e in embeddings] if settings.staleness else []

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
        if self.settings.depth_controller is not None:
            self._stats.depths = dict(self.settings.depth_controller.chosen)
            self._stats.probe_batches = self.settings.depth_controller.probe_batches
        return self._stats

    def prepare_tables(self) -> None:
        """Make what the tables need for this loader's mode and device (at each ``iter(loader)``)."""
        s = self.settings
        for emb in self.embeddings:
            emb.pipeline.prepare(s.device, s.pin, s.table_mode, s.check_finite)

    def next_epoch(self) -> Tuple[int, int]:
        """At ``iter(loader)``: end the current epoch, make the tables ready, and return ``(epoch, start)``, the
        epoch and batch to start at. After an epoch ran to its end, or was left after a batch was handed out (as
        in torch), the next epoch from its start; ``iter()`` again before any ``next()`` (``tqdm.auto`` does this)
        starts the same epoch at the same place; after :meth:`load_state_dict`, where it says."""
        self._roll_over()
        p = self._progress
        if p is not None and p.handed > p.start:
            self._epoch, self._start = p.epoch + 1, 0
        elif p is not None:
            self._epoch, self._start = p.epoch, p.start
        self.close()
        self.prepare_tables()
        epoch, start = self._epoch, self._start
        self._start = 0
        return epoch, start

    def _roll_over(self) -> None:
        """An epoch that ran to its end is followed by the next one, from its start."""
        p = self._progress
        if p is not None and p.finished:
            self._epoch, self._start, self._progress = p.epoch + 1, 0, None

    def state_dict(self) -> Dict[str, Any]:
        """Where the next run resumes: ``{"seed", "epoch", "position"}``. ``position`` counts the epoch's batches
        that are done: committed, skipped by a failed ``step()`` (non-finite), or released without a gradient
        (their leaf died); a batch handed out and still held but not yet stepped is not done (a resumed run
        hands it out again)."""
        self._roll_over()
        p = self._progress
        if p is not None:  # with no embeddings nothing is committed: handed out is done
            # a batch's listener is on one table's rows only (the first with rows): each is counted once
            waiting = sum(1 for e in self.embeddings for b in e.pipeline.pending() if b.listener is p.listener)
            return {"seed": self.seed, "epoch": p.epoch, "position": p.handed - waiting}
        return {"seed": self.seed, "epoch": self._epoch, "position": self._start}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Resume at ``state`` (from :meth:`state_dict`): the next ``iter(loader)`` starts at its epoch and
        position, with its seed. Ends the current epoch first."""
        self.close()
        seed = state["seed"]
        self.seed = None if seed is None else int(seed)
        self._epoch, self._start = int(state["epoch"]), int(state["position"])

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
        self._progress = it.progress
        return it

    def close(self) -> None:
        """End the current epoch: stop its threads (queued write-backs applied first). Idempotent. Batches
        already handed out stay with their tables: a later ``step()`` still commits them."""
        it = None if self._iter is None else self._iter()
        if it is not None:
            it.close()
        self._iter = None
        self._roll_over()
        self._progress = None

    def __enter__(self: L) -> L:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
