"""``dgl_oac.BatchLoader``: any batch source, its embedding rows pipelined.

``BatchLoader(batches, ids={emb: fn}, mode="oac", prefetch="auto")`` wraps an iterable that yields batches of
its own making (a ``torch.utils.data.DataLoader`` with a ``collate_fn``, an infinite ``IterableDataset``, a
generator): no graph, no sampler. For each batch, ``fn(batch)`` names the ids (``int64``, any shape, repeats
allowed) the model will read from ``emb``; their rows are gathered ahead, validated (oac) and held while the
batch is out, and any ``emb(x)`` whose ids are among them returns those rows, differentiable, committed by
the next ``step()``. The loader yields the source's batches unchanged: the training loop stays as it was.

The schedule is :mod:`dgl_oac.loading.epoch`'s; "pull batch b" is ``next(source)``
(:class:`~dgl_oac.loading.iterable_source.IterableSource`), in order: on the caller's thread, or with
``pull_thread=True`` on a background thread of the epoch's, which pulls up to two batches before they are due, so
the source's own work for a batch overlaps training (:mod:`dgl_oac.loading.source_thread`, which says why it is
not the default: the generator states below cannot be swapped on another thread). ``fn`` runs on the gather
thread (pipelined modes) or at hand-out (sync): it must be a pure function of the batch.

Sources that draw from global RNGs (``torch.randint`` in an ``IterableDataset``, ``random``, numpy's global
generator): a pipelined loader pulls batch i+k while the caller trains on batch i, so if the loop draws from the
same generators (dropout, negative sampling in the loss), the draws would interleave differently in every mode.
The loader therefore pulls its source inside generator states of its own
(:class:`~dgl_oac.loading.iterable_source.SourceRNG`): torch's CPU generator, ``random`` and numpy's global
generator are swapped in around each pull and back out after, so the source's stream is a function of ``seed``
alone (or of one draw from torch's generator at ``iter()`` when ``seed`` is None), the same in every mode and at
every depth, and the caller's own draws are those it would make without the loader. Other generators (DGL's
``dgl.seed``, a CUDA generator) are not swapped: a source that uses them gives the same stream in every mode only
if nothing else draws from them.

``generators="global"`` keeps the source on the process's global generators instead, in the order the unwrapped
loop pulls it (:class:`~dgl_oac.loading.iterable_source.GlobalStream`): the batches are then exactly the
unwrapped loop's, the run you had before adding the loader, as long as the training step draws nothing from
those generators between batches (on a GPU dropout draws from the CUDA generator). Where the step does draw,
the loader warns once: the batches then depend on how far ahead it pulls. Not the default, because the default
must keep oac equal to sync whatever the step draws.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Dict, Iterable, Iterator, Mapping, Optional, Union

import torch

from ..config import optional_seed
from ..embedding import NodeEmbedding
from .stats import LoaderStats
from ..tables import check_unique_names, unwrap
from .base import LoaderBase
from .iterable_source import GlobalStream, IdsFn, IterableSource, ServedReads, SourceRNG
from .settings import LoaderSettings
from .source import END
from .source_thread import SourceThread

_TORCH_TABLES = (torch.nn.Embedding, torch.nn.EmbeddingBag)
#: ``BatchLoader(generators=...)``: the loader's own generator states (the default) or the process's
GENERATORS = ("loader", "global")


@dataclass(repr=False)  # LoaderStats' repr, which names the counters
class SourceStats(LoaderStats):
    """:class:`~dgl_oac.loading.stats.LoaderStats` plus how the model read the prefetched rows: ``rows_served``
    (rows returned by ``emb(x)`` calls from a batch's prefetched rows, counted per occurrence) and
    ``fresh_reads`` (``emb(x)`` calls, during a batch, that read the table directly: ids ``fn`` did not name),
    both counted when the caller asks for the next batch."""

    rows_served: int = 0
    fresh_reads: int = 0

    def as_dict(self) -> Dict[str, object]:
        return {**super().as_dict(), "rows_served": self.rows_served, "fresh_reads": self.fresh_reads}

    def __repr__(self) -> str:
        return f"{super().__repr__()[:-1]}, rows_served={self.rows_served}, fresh_reads={self.fresh_reads})"


class BatchLoader(LoaderBase):
    """``BatchLoader(batches, ids={emb: fn}, mode="oac", device=None, prefetch="auto", seed=None, ...)``.

    Yields the items of ``batches`` (any iterable; one pass per ``iter(loader)``). ``ids`` maps each table (a
    :class:`~dgl_oac.NodeEmbedding` or a ``dgl_oac.nn.Embedding``) to ``fn(batch) -> int64 ids`` (any shape,
    CPU, repeats allowed): the rows the model reads for that batch. While the batch is out (until the next
    batch is asked for), ``emb(x, device)`` for ids ``x`` among them returns the prefetched rows
    (``float32[x.numel(), D]`` on ``device``), exact in oac and sync, read as of the gather in async.
    Other ids are read from the table directly (and counted in ``stats.fresh_reads``).

    A key that is torch's own ``nn.Embedding`` is skipped: torch reads its dense table itself, so nothing is
    prefetched for it, and with only such keys the loader just pulls the source (inside its generator
    states). That lets one loop run on either backend with the import as the only change
    (``examples/pinsage.py``, ``examples/node2vec.py``).

    ``seed``: the source's own generator states (module docstring); None draws one from torch's generator at
    each ``iter(loader)``. ``generators="global"``: no states of its own; the source draws from the global
    generators as without the loader, so its batches are the unwrapped loop's (module docstring: when that
    holds, and the warning when it does not); ``seed`` and ``pull_thread`` are then refused. ``mode``, ``prefetch``,
    ``writeback_depth``, ``check_finite``, ``background_priority``
    are :class:`dgl_oac.DataLoader`'s. ``len(loader)`` is ``len(batches)`` when the source has one.

    ``staleness`` (``mode="async"`` only): async's rules for stale rows, as :class:`dgl_oac.DataLoader`'s.

    Resume: :meth:`state_dict` and :meth:`load_state_dict` (also through :func:`dgl_oac.checkpoint.save_checkpoint`
    and ``load_checkpoint(..., loader=)``), as :class:`dgl_oac.DataLoader`'s: the resumed ``iter(loader)`` pulls
    and drops the epoch's first ``position`` batches of the source, inside the loader's generator states, then
    trains from there. Its batches are the uninterrupted run's when the source yields the same stream for the
    same generator states (a torch ``DataLoader``, a seeded generator); with ``generators="global"``, when the
    global generators are restored too (``load_checkpoint`` does).

    ``pull_thread=True``: pull the source on a background thread (in every mode: sync keeps its semantics for
    the rows and stays a fair baseline), for a source that draws only from generators of its own, or none
    (:mod:`dgl_oac.loading.source_thread`); its stream is then the one the caller's thread pulls. Off by default: a
    source drawing from torch's, Python's or numpy's global generator, or DGL's, would give another stream in
    every run.
    """

    def __init__(self, batches: Iterable[Any], ids: Mapping[Any, IdsFn], mode: str = "oac", device: Any = None,
                 prefetch: Union[int, str] = "auto", seed: Optional[int] = None,
                 writeback_depth: Optional[int] = None, pin: Any = "auto", check_finite: Optional[bool] = None,
                 background_priority: str = "auto", pull_thread: bool = False, generators: str = "loader",
                 staleness: Optional[str] = None) -> None:
        if not hasattr(batches, "__iter__"):
            raise TypeError(f"batches must be an iterable of batches (a torch DataLoader, an IterableDataset, a "
                            f"generator), got {type(batches).__name__}")
        if not isinstance(ids, Mapping) or not ids:
            raise TypeError("ids must be a non-empty dict {embedding: fn(batch) -> int64 ids}, got "
                            f"{type(ids).__name__}")
        embeddings, self._fns = [], []
        for emb, fn in ids.items():
            table = unwrap(emb)
            if type(table) in _TORCH_TABLES:  # torch reads its own table: nothing to prefetch (class docstring)
                continue
            if not isinstance(table, NodeEmbedding):
                raise TypeError(f"ids: keys must be dgl_oac.NodeEmbedding or dgl_oac.nn.Embedding, got "
                                f"{type(emb).__name__}")
            if not callable(fn):
                raise TypeError(f"ids[{table.name!r}] must be a function of the batch returning int64 ids, got "
                                f"{type(fn).__name__}")
            embeddings.append(table)
            self._fns.append(fn)
        check_unique_names(embeddings)
        for emb in embeddings:
            if emb.group is not None:
                raise ValueError(f"NodeEmbedding {emb.name!r} is trained by {emb.world_size} ranks: BatchLoader "
                                 f"is single-process only (use dgl_oac.DataLoader with use_ddp=True)")
        settings = LoaderSettings.resolve(mode, device, prefetch, writeback_depth, pin, check_finite,
                                          background_priority, staleness)
        self.batches = batches
        if not isinstance(pull_thread, bool):
            raise TypeError(f"pull_thread must be True or False, got {pull_thread!r}")
        self.pull_thread = pull_thread
        if generators not in GENERATORS:
            raise ValueError(f"generators must be one of {', '.join(map(repr, GENERATORS))}, got {generators!r}")
        if generators == "global" and seed is not None:
            raise ValueError("generators='global' draws the source's batches from the global generators, as without "
                             "the loader: seed the run with torch.manual_seed (and random/numpy), not seed=")
        if generators == "global" and pull_thread:
            raise ValueError("generators='global' with pull_thread=True: the source's thread would draw from the "
                             "global generators while the training step does, in no fixed order")
        self.generators = generators
        # (with the global generators nothing is drawn here: the source's first batch is the unwrapped loop's)
        super().__init__(settings, embeddings, SourceStats(mode=settings.mode),
                         None if generators == "global" else optional_seed(seed))
        self._reads = ServedReads(embeddings, self._stats)

    @property
    def stats(self) -> SourceStats:
        """Counters and per-stage seconds, as :attr:`dgl_oac.DataLoader.stats`, plus ``rows_served`` and
        ``fresh_reads`` (:class:`SourceStats`)."""
        stats = super().stats
        now = self._reads.now()  # the batch out now counts as read so far
        return dataclasses.replace(stats, rows_served=stats.rows_served + sum(s for s, _ in now),
                                   fresh_reads=stats.fresh_reads + sum(f for _, f in now))

    def __len__(self) -> int:
        return len(self.batches)  # type: ignore[arg-type]  # TypeError for a source without one, as torch's

    def __iter__(self) -> Iterator[Any]:
        epoch, start = self.next_epoch()
        rng = GlobalStream() if self.seed is None else SourceRNG(self.seed + epoch)
        with rng:  # iter(source) may draw too (torch's DataLoader draws its workers' base seed)
            batches = iter(self.batches)
            for _ in range(start):  # resumed mid-epoch: the batches done before are pulled again, and dropped
                next(batches, None)
        try:
            num = len(self.batches)  # type: ignore[arg-type]
        except TypeError:
            num = math.inf
        puller = SourceThread(batches, END, f"dgl-oac-source-e{epoch}", self.background_priority, start) \
            if self.pull_thread else None
        source = IterableSource(batches, rng, puller, self.embeddings, self._fns, self.settings, self._stats,
                                self._reads, self.rules)
        return self.start_epoch(source, epoch, start, num, sampling=puller)

    def close(self) -> None:
        """End the current pass (threads stopped, queued write-backs applied). Idempotent. Batches already
        handed out stay with their tables: a later ``step()`` still commits them."""
        super().close()
        self._reads.retire(stacklevel=2)  # also after a `break` that dropped the epoch
