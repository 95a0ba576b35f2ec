"""One pass of a :class:`dgl_oac.BatchLoader`'s iterable: :class:`IterableSource`, the epoch's
:class:`~dgl_oac.loading.source.BatchSource`; the generator states it pulls in (:class:`SourceRNG`, the loader's
own, or :class:`GlobalStream`, the process's); how the
model read each batch's rows (:class:`ServedReads`, the loader's, across its epochs)."""
from __future__ import annotations

import random
import sys
import warnings
from typing import Any, Callable, Iterator, List, Optional, Sequence, Tuple, Union

import torch

from ..engine.pipeline import BatchHook, CommitListener, HandedOut, TableRows, validate_rows
from .stats import LoaderStats
from ..engine.table import check_ids
from .settings import LoaderSettings
from .source import END
from .source_thread import SourceThread

IdsFn = Callable[[Any], torch.Tensor]


class SourceRNG:
    """Generator states of a source's own: swapped in around each pull (:mod:`dgl_oac.loading.batch_loader`).
    numpy's global generator is included when numpy is imported."""

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


class GlobalStream:
    """``BatchLoader(generators="global")``: the source pulls from the process's global generators (torch's CPU
    generator, ``random``, numpy's global one) as it would without the loader, nothing swapped. Each pull starts
    from the states the previous pull left, as without the loader, unless the training step drew from them in
    between: then the batches from there on depend on how far ahead the loader pulls (so they differ between
    modes and depths), and the first pull that finds the states changed warns, once."""

    def __init__(self) -> None:
        self._left: Optional[Tuple[Any, ...]] = None  # the states the last pull left
        self.warned = False

    @staticmethod
    def _states() -> Tuple[Any, ...]:
        np = _numpy()
        return (torch.get_rng_state(), random.getstate(),
                None if np is None else np.random.get_state(legacy=True))

    def __enter__(self) -> "GlobalStream":
        if self._left is not None and not self.warned and not _same_states(self._left, self._states()):
            self.warned = True
            warnings.warn(
                "BatchLoader(generators='global'): the training step drew from the global random generators "
                "(torch's CPU generator, random or numpy's) between two pulls of the source, dropout on the CPU "
                "for example. The loader pulls batches ahead of the step, so from here on the source's batches "
                "depend on the prefetch depth: they differ from the unwrapped loop's and between modes (oac no "
                "longer equals sync). Draw the step's randomness from a torch.Generator of its own, or use the "
                "default generators='loader' (the source then gets generator states of its own, the same "
                "stream in every mode)", RuntimeWarning, stacklevel=5)
        return self

    def __exit__(self, *exc: Any) -> None:
        self._left = self._states()


def _same_states(a: Tuple[Any, ...], b: Tuple[Any, ...]) -> bool:
    np_a, np_b = a[2], b[2]
    same_np = (np_a is None) == (np_b is None) and (np_a is None or (
        np_a[0] == np_b[0] and bool((np_a[1] == np_b[1]).all()) and tuple(np_a[2:]) == tuple(np_b[2:])))
    return torch.equal(a[0], b[0]) and a[1] == b[1] and same_np


def _numpy() -> Any:
    return sys.modules.get("numpy")


class ServedReads:
    """How the model read the batch out now: rows served from its prefetched rows, ``emb(x)`` calls that read a
    table directly; added to ``stats`` (``rows_served``, ``fresh_reads``) when the batch is retired."""

    def __init__(self, embeddings: Sequence[Any], stats: Any) -> None:
        self.embeddings, self.stats = list(embeddings), stats
        self.warned_bypass = False
        self.out: Optional[Tuple[List[HandedOut], List[int]]] = None  # the batch out now: rows, fresh-read counts

    def hold(self, rows: List[HandedOut]) -> None:
        self.out = (rows, [e._fresh_reads for e in self.embeddings])

    def now(self) -> List[Tuple[int, int]]:
        """``(rows served, fresh reads)`` per table for the batch out now (nothing if none is)."""
        if self.out is None:
            return []
        rows, fresh_at = self.out
        out = []
        for emb, r, before in zip(self.embeddings, rows, fresh_at):
            served = sum(r.ids.numel() if rd.pos is None else rd.pos.numel() for rd in r.state.reads)
            out.append((served + (r.ids.numel() if r.state.claimed else 0), emb._fresh_reads - before))
        return out

    def retire(self, stacklevel: int) -> None:
        """Count the batch out now; warn once if a table's prefetched rows were never read while the model read
        that table directly (a bypass). ``stacklevel``: the warning's, from here to the user's frame."""
        reads, self.out = self.now(), None
        for emb, (served, fresh) in zip(self.embeddings, reads):
            self.stats.rows_served += served
            self.stats.fresh_reads += fresh
            if not served and fresh and not self.warned_bypass:
                self.warned_bypass = True
                warnings.warn(
                    f"BatchLoader: the rows prefetched for NodeEmbedding {emb.name!r} were never read, while the "
                    f"model read it {fresh} time(s) with emb(ids) outside them: those reads gathered their rows "
                    f"on the caller's thread and their step wrote them through, so the pipeline did nothing for "
                    f"this table (loader.stats: gather and commit seconds near 0, rows_served 0). Make "
                    f"ids[{emb.name!r}](batch) return every id the model reads for the batch",
                    stacklevel=stacklevel + 1)


class IterableSource:
    """One pass of ``batches`` (an iterator) for the tables of ``embeddings``, ``fns[i](batch)`` naming table i's
    ids: pulled on the caller's thread inside ``rng`` (the loader's generator states, or the global ones), or
    taken from ``puller`` (``pull_thread=True``). ``hooks``: each table's staleness rule (async only), or none."""

    def __init__(self, batches: Iterator[Any], rng: Union[SourceRNG, GlobalStream], puller: Optional[SourceThread],
                 embeddings: Sequence[Any], fns: Sequence[IdsFn], settings: LoaderSettings, stats: LoaderStats,
                 reads: ServedReads, hooks: Sequence[Optional[BatchHook]] = ()) -> None:
        self.batches, self.rng, self.puller = batches, rng, puller
        self.embeddings, self.fns = list(embeddings), list(fns)
        self.tables = [e.pipeline for e in self.embeddings]
        self.settings, self.stats, self.reads, self.hooks = settings, stats, reads, list(hooks)
        self.held: Optional[List[torch.Tensor]] = None  # the leaves of the batch out now

    def pull(self, b: int) -> Any:
        if self.puller is not None:  # the source's thread: its states are not swapped there
            return self.puller.get(b)
        with self.rng:
            return next(self.batches, END)

    def table_ids(self, batch: Any) -> List[torch.Tensor]:
        out = []
        for emb, fn in zip(self.embeddings, self.fns):
            x = fn(batch)
            if not isinstance(x, torch.Tensor) or x.dtype != torch.int64:
                got = x.dtype if isinstance(x, torch.Tensor) else type(x).__name__
                raise TypeError(f"ids[{emb.name!r}](batch) must return an int64 tensor of ids, got {got}")
            x = torch.unique(x.reshape(-1).cpu())
            check_ids(x, emb.num_embeddings, f"ids[{emb.name!r}](batch)")
            out.append(x)
        return out

    def handed_ids(self, out: Any) -> Any:
        """A tuple batch's first item (ids first, as DGL's loaders hand them out): a read of it through a table
        this loader does not carry warns."""
        return out[0] if isinstance(out, tuple) and out else None

    def hand_out(self, batch: Any, rows: List[TableRows], listener: CommitListener) -> Any:
        """Validate and register the rows; hold their leaves until the next batch is asked for (the loader's
        :class:`ServedReads` keeps the rows to count how they were read). The batch is handed out unchanged."""
        handed = validate_rows(rows, self.tables, self.settings.mode, self.settings.check_finite, self.stats,
                               listener, hooks=self.hooks)
        self.held = [h.leaf for h in handed]
        self.reads.hold([h.batch for h in handed])
        return batch

    def retire(self) -> None:
        self.held = None
        self.reads.retire(stacklevel=3)  # seen from here: Epoch.__next__ is 2, the user's loop 3
