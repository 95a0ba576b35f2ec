"""``loader.stats``: what each stage did and how long it worked or waited, and what counts into it: each epoch's
:class:`CommitCounter`, the commit listener of its batches."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Optional, Union

import torch

from ..engine.pipeline import HandedOut

STAGES = ("sample", "gather", "copy", "wait", "validate", "commit")


@dataclass
class LoaderStats:
    """Counters over the loader's life. Seconds are per stage: ``sample``, ``validate`` and ``commit`` run on
    the caller's thread, ``gather``/``copy`` on the gather thread, ``wait`` is the caller blocked on the
    gather stage, ``writeback`` the write-back threads' busy time.

    ``mode``: the loader's (None: not given). Only oac validates its reads, so only oac knows how many rows were
    stale: async's :attr:`conflict_rate` is None (unknown, not zero), sync's is 0.0 (it reads after every step)."""

    mode: Optional[str] = None
    batches: int = 0
    committed: int = 0
    rows_read: int = 0
    max_in_flight: int = 0
    #: read-ahead batches the gather thread had not started when they were due, gathered on the caller's thread
    #: instead (a starved gather thread: idle priority beside a busy process)
    gathered_by_caller: int = 0
    #: the OpenMP team of each background thread in the latest epoch (:func:`dgl_oac.engine.runtime.background_team`)
    background_threads: int = 0
    rows_repatched_at_commit: int = 0
    depths: Dict[int, int] = field(default_factory=dict)  # prefetch="auto": batches handed out at each depth
    probe_batches: int = 0  # prefetch="auto": of those, the batches its probes ran (what choosing costs)
    seconds: Dict[str, float] = field(default_factory=lambda: {s: 0.0 for s in STAGES})
    _patched: Union[int, torch.Tensor] = 0

    def add_patched(self, n: torch.Tensor) -> None:
        # kept as a (device) tensor: reading it per batch would force a host-device sync
        self._patched = n + self._patched  # from 0 (a number): the total lives on the counts' device, never copied

    @property
    def rows_patched(self) -> int:
        return int(self._patched)

    @property
    def conflict_rate(self) -> Optional[float]:
        """Fraction of rows read that were stale when validated (oac: patched), i.e. what async would have used
        stale; None for async, which does not validate. It grows with the prefetch depth (a deeper pipeline
        reads further behind), so with ``prefetch="auto"`` it depends on the depths chosen (:attr:`depths`)."""
        if self.mode == "async":
            return None
        return self.rows_patched / self.rows_read if self.rows_read else 0.0

    def as_dict(self) -> Dict[str, object]:
        return {"mode": self.mode, "batches": self.batches, "committed": self.committed,
                "rows_read": self.rows_read, "rows_patched": self.rows_patched, "conflict_rate": self.conflict_rate,
                "rows_repatched_at_commit": self.rows_repatched_at_commit,
                "max_in_flight": self.max_in_flight, "gathered_by_caller": self.gathered_by_caller,
                "background_threads": self.background_threads, "depths": dict(self.depths),
                "probe_batches": self.probe_batches,
                "seconds": dict(self.seconds)}

    def __repr__(self) -> str:
        secs = ", ".join(f"{k}={v:.2f}s" for k, v in self.seconds.items())
        rate = self.conflict_rate
        conflicts = ("conflict_rate=None (async does not validate)" if rate is None else
                     f"rows_patched={self.rows_patched}, conflict_rate={rate:.3f}")
        depths = f", depths={dict(sorted(self.depths.items()))}" if self.depths else ""
        return (f"LoaderStats(mode={self.mode!r}, batches={self.batches}, rows_read={self.rows_read}, {conflicts}, "
                f"max_in_flight={self.max_in_flight}{depths}, {secs})")


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
