"""``dgl_oac.BatchLoader``: any batch source, its embedding rows pipelined.

``BatchLoader(batches, ids={emb: fn}, mode="oac", prefetch="auto")`` wraps an iterable that yields batches of
its own making (a ``torch.utils.data.DataLoader`` with a ``collate_fn``, an infinite ``IterableDataset``, a
generator): no graph, no sampler. For each batch, ``fn(batch)`` names the ids (``int64``, any shape, repeats
allowed) the model will read from ``emb``; their rows are gathered ahead, validated (oac) and held while the
batch is out, and any ``emb(x)`` whose ids are among them returns those rows, differentiable, committed by
the next ``step()``. The loader yields the source's batches unchanged: the training loop stays as it was.

The schedule is :mod:`dgl_oac.loading.epoch`'s; "pull batch b" is ``next(source)``, in order: on the caller's thread, or
with ``pull_thread=True`` on a background thread of the epoch's, which pulls up to two batches before they are
due, so the source's own work for a batch overlaps training (:mod:`dgl_oac.loading.source_thread`, which says why it is
not the default: the generator states below cannot be swapped on another thread). ``fn`` runs on the gather
thread (pipelined modes) or at hand-out (sync): it must be a pure function of the batch.

Sources that draw from global RNGs (``torch.randint`` in an ``IterableDataset``, ``random``, numpy's global
generator): a pipelined loader pulls batch i+k while the caller trains on batch i, so if the loop draws from
the same generators (dropout, negative sampling in the loss), the draws would interleave differently in every
mode. The loader therefore pulls its source inside generator states of its own (:class:`SourceRNG`): torch's
CPU generator, ``random`` and numpy's global generator are swapped in around each pull and back out after, so
the source's stream is a function of ``seed`` alone (or of one draw from torch's generator at ``iter()`` when
``seed`` is None), the same in every mode and at every depth, and the caller's own draws are those it would
make without the loader. Other generators (DGL's ``dgl.seed``, a CUDA generator) are not swapped: a source
that uses them gives the same stream in every mode only if nothing else draws from them.
"""
from __future__ import annotations

import dataclasses
import math
import random
import warnings
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, Iterator, List, Mapping, Optional, Tuple, Union

import torch

from ..config import (check_mode, check_priority, optional_seed, resolve_device, resolve_pin,
                     resolve_check_finite, table_mode)
from ..embedding import NodeEmbedding
from ..engine.batch import TableRows
from ..engine.depth import resolve_depths
from ..engine.handout import validate_rows
from ..engine.stats import LoaderStats
from ..engine.store import check_ids
from .epoch import END, Epoch, RowCount
from ..inputs import check_unique_names, unwrap
from .source_thread import SourceThread

IdsFn = Callable[[Any], torch.Tensor]
_TORCH_TABLES = (torch.nn.Embedding, torch.nn.EmbeddingBag)


class SourceRNG:
    """Generator states of a source's own: swapped in around each pull (module docstring). numpy's global
    generator is included when numpy is imported."""

    def __init__(self, seed: int) -> None:
        torch_gen = torch.Generator().manual_seed(seed)
        self.torch = torch_gen.get_state()
        self.py = random.Random(seed).getstate()
        np = _numpy()
        self.np = None if np is None else np.random.RandomState(seed % 2 ** 32).get_state()

    def __enter__(self) -> "SourceRNG":
        self._caller = (torch.get_rng_state(), random.getstate())
        torch.set_rng_state(self.torch)
        random.setstate(self.py)
        np = _numpy()
        if np is not None and self.np is not None:
            self._caller_np = np.random.get_state()
            np.random.set_state(self.np)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.torch, self.py = torch.get_rng_state(), random.getstate()
        torch.set_rng_state(self._caller[0])
        random.setstate(self._caller[1])
        np = _numpy()
        if np is not None and self.np is not None:
            self.np = np.random.get_state()
            np.random.set_state(self._caller_np)


def _numpy() -> Any:
    import sys
    return sys.modules.get("numpy")


@dataclass(repr=False)  # LoaderStats' repr, which names the counters
class SourceStats(LoaderStats):
    """:class:`~dgl_oac.engine.stats.LoaderStats` plus how the model read the prefetched rows: ``rows_served``
    (rows returned by ``emb(x)`` calls from a batch's prefetched rows, counted per occurrence) and
    ``fresh_reads`` (``emb(x)`` calls, during a batch, that read the table directly: ids ``fn`` did not name),
    both counted when the caller asks for the next batch."""

    rows_served: int = 0
    fresh_reads: int = 0

    def as_dict(self) -> Dict[str, object]:
        return {**super().as_dict(), "rows_served": self.rows_served, "fresh_reads": self.fresh_reads}

    def __repr__(self) -> str:
        return f"{super().__repr__()[:-1]}, rows_served={self.rows_served}, fresh_reads={self.fresh_reads})"


class BatchLoader:
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
    each ``iter(loader)``. ``mode``, ``prefetch``, ``writeback_depth``, ``check_finite``, ``background_priority``
    are :class:`dgl_oac.DataLoader`'s. ``len(loader)`` is ``len(batches)`` when the source has one.

    ``pull_thread=True``: pull the source on a background thread (in every mode: sync keeps its semantics for
    the rows and stays a fair baseline), for a source that draws only from generators of its own, or none
    (:mod:`dgl_oac.loading.source_thread`); its stream is then the one the caller's thread pulls. Off by default: a
    source drawing from torch's, Python's or numpy's global generator, or DGL's, would give another stream in
    every run.
    """

    def __init__(self, batches: Iterable[Any], ids: Mapping[Any, IdsFn], mode: str = "oac", device: Any = None,
                 prefetch: Union[int, str] = "auto", seed: Optional[int] = None,
                 writeback_depth: Optional[int] = None, pin: Any = "auto", check_finite: Optional[bool] = None,
                 background_priority: str = "idle", pull_thread: bool = False) -> None:
        if not hasattr(batches, "__iter__"):
            raise TypeError(f"batches must be an iterable of batches (a torch DataLoader, an IterableDataset, a "
                            f"generator), got {type(batches).__name__}")
        if not isinstance(ids, Mapping) or not ids:
            raise TypeError("ids must be a non-empty dict {embedding: fn(batch) -> int64 ids}, got "
                            f"{type(ids).__name__}")
        self.embeddings: List[NodeEmbedding] = []
        self._fns: List[IdsFn] = []
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
            self.embeddings.append(table)
            self._fns.append(fn)
        check_unique_names(self.embeddings)
        for emb in self.embeddings:
            if emb.group is not None:
                raise ValueError(f"NodeEmbedding {emb.name!r} is trained by {emb.world_size} ranks: BatchLoader "
                                 f"is single-process only (use dgl_oac.DataLoader with use_ddp=True)")
        self.batches = batches
        self.mode = check_mode(mode)
        self.table_mode = table_mode(self.mode, None)
        self.device = resolve_device("cpu" if device is None else device)
        self.pin = resolve_pin(pin, self.device)
        # prefetch="auto": the depth is chosen online, 0 or up to AUTO_MAX_PREFETCH (dgl_oac.engine.depth)
        self.prefetch, self._depth, self.writeback_depth = resolve_depths(prefetch, writeback_depth)
        self.auto_depth = self._depth is not None
        self.check_finite = resolve_check_finite(check_finite, self.device)
        self.background_priority = check_priority(background_priority)
        self.seed = optional_seed(seed)
        if not isinstance(pull_thread, bool):
            raise TypeError(f"pull_thread must be True or False, got {pull_thread!r}")
        self.pull_thread = pull_thread
        self._stats = SourceStats(mode=self.mode)
        self._repatched = RowCount()  # stats.rows_repatched_at_commit, summed without a host sync per step
        self._epoch = 0
        self._iter: "Optional[weakref.ref[Epoch]]" = None
        self._warned_bypass = False
        self._held: Optional[Tuple[List[TableRows], List[int]]] = None  # the batch out now: rows, fresh-read counts

    @property
    def stats(self) -> SourceStats:
        """Counters and per-stage seconds, as :attr:`dgl_oac.DataLoader.stats`, plus ``rows_served`` and
        ``fresh_reads`` (:class:`SourceStats`)."""
        self._stats.seconds["writeback"] = sum(e.pipeline.writeback_seconds() for e in self.embeddings)
        self._stats.rows_repatched_at_commit = self._repatched.value()
        if self._depth is not None:
            self._stats.depths = dict(self._depth.chosen)
        now = self._reads()  # the batch out now counts as read so far
        return dataclasses.replace(self._stats, rows_served=self._stats.rows_served + sum(s for s, _ in now),
                                   fresh_reads=self._stats.fresh_reads + sum(f for _, f in now))

    def __len__(self) -> int:
        return len(self.batches)  # type: ignore[arg-type]  # TypeError for a source without one, as torch's

    def __iter__(self) -> Iterator[Any]:
        self.close()
        for emb in self.embeddings:
            emb.pipeline.prepare(self.device, self.pin, self.table_mode, self.check_finite)
        seed = self.seed if self.seed is not None else int(torch.randint(0, 2 ** 62, ()))
        rng = SourceRNG(seed + self._epoch if self.seed is not None else seed)
        with rng:  # iter(source) may draw too (torch's DataLoader draws its workers' base seed)
            source = iter(self.batches)
        try:
            num = len(self.batches)  # type: ignore[arg-type]
        except TypeError:
            num = math.inf
        puller = SourceThread(source, END, f"dgl-oac-source-e{self._epoch}", self.background_priority) \
            if self.pull_thread else None
        try:
            it = Epoch(self, self._epoch, 0, num, self._table_ids, sampling=puller)
        except BaseException:
            if puller is not None:
                puller.close()
            raise
        it.source, it.rng = source, rng
        self._iter = weakref.ref(it)
        self._epoch += 1
        return it

    # --- the epoch's calls (dgl_oac.loading.epoch) ------------------------------------------------------------------
    def _pull(self, ep: Epoch, b: int) -> Any:
        if ep.res.sampling is not None:  # pull_thread: the source's thread (its states are not swapped there)
            return ep.res.sampling.get(b)
        with ep.rng:
            return next(ep.source, END)

    def _table_ids(self, batch: Any) -> List[torch.Tensor]:
        """Each table's unique ids ``int64[n], CPU`` for ``batch`` (on the gather thread, or at hand-out)."""
        out = []
        for emb, fn in zip(self.embeddings, self._fns):
            x = fn(batch)
            if not isinstance(x, torch.Tensor) or x.dtype != torch.int64:
                got = x.dtype if isinstance(x, torch.Tensor) else type(x).__name__
                raise TypeError(f"ids[{emb.name!r}](batch) must return an int64 tensor of ids, got {got}")
            x = torch.unique(x.reshape(-1).cpu())
            check_ids(x, emb.num_embeddings, f"ids[{emb.name!r}](batch)")
            out.append(x)
        return out

    def _hand_out(self, ep: Epoch, batch: Any, rows: List[TableRows]) -> Any:
        """Validate and register the rows; the epoch holds their leaves until the next batch is asked for (the
        loader keeps the rows to count how they were read). The batch itself is handed out unchanged."""
        ep.held = validate_rows(rows, ep.tables, self.mode, self.check_finite, self._stats, ep.on_commit)
        self._held = (rows, [e._fresh_reads for e in self.embeddings])
        return batch

    def _reads(self) -> List[Tuple[int, int]]:
        """``(rows served, fresh reads)`` per table for the batch out now (nothing if none is)."""
        if self._held is None:
            return []
        rows, fresh_at = self._held
        out = []
        for emb, r, before in zip(self.embeddings, rows, fresh_at):
            served = sum(r.ids.numel() if rd.pos is None else rd.pos.numel() for rd in r.reads)
            out.append((served + (r.ids.numel() if r.claimed else 0), emb._fresh_reads - before))
        return out

    def _retire(self, ep: Optional[Epoch]) -> None:
        """The caller is done with the batch out now: count how its rows were read; warn once if a table's
        prefetched rows were never read while the model read that table directly (a bypass)."""
        if ep is not None:
            ep.held = None
        reads, self._held = self._reads(), None
        for emb, (served, fresh) in zip(self.embeddings, reads):
            self._stats.rows_served += served
            self._stats.fresh_reads += fresh
            if not served and fresh and not self._warned_bypass:
                self._warned_bypass = True
                warnings.warn(
                    f"BatchLoader: the rows prefetched for NodeEmbedding {emb.name!r} were never read, while the "
                    f"model read it {fresh} time(s) with emb(ids) outside them: those reads gathered their rows "
                    f"on the caller's thread and their step wrote them through, so the pipeline did nothing for "
                    f"this table (loader.stats: gather and commit seconds near 0, rows_served 0). Make "
                    f"ids[{emb.name!r}](batch) return every id the model reads for the batch", stacklevel=3)

    def _epoch_finished(self, ep: Epoch) -> None:
        pass

    def close(self) -> None:
        """End the current pass (threads stopped, queued write-backs applied). Idempotent. Batches already
        handed out stay with their tables: a later ``step()`` still commits them."""
        it = None if self._iter is None else self._iter()
        if it is not None:
            it.close()
        self._retire(None)  # also after a `break` that dropped the epoch
        self._iter = None

    def __enter__(self) -> "BatchLoader":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
