"""``dgl_oac.DataLoader``: DGL's loader, plus the rows of learnable embeddings, pipelined.

The schedule, with ``prefetch = k`` (at the moment the caller asks for batch i)::

    caller thread   : sample i+k ─► [submit] ··· wait ─► validate i ─► yield i ─► fwd/bwd i ─► opt.step(): commit i
    gather thread   :                gather+copy i+1 .. i+k (each opens a read at version `applied`)
    write-back thread (one per embedding):  table[ids_j] = rows_j for committed j < i, in step order; applied = j
    (both background threads at idle priority by default: they run on what the caller's compute leaves free)

    sync : no gather thread; batch i is gathered at hand-out, after step i-1 was written through.
    async: as above without validation; write-back adds (new - old).
    oac  : as above; validate = patch rows whose last write is newer than the batch's read version from the
           device write log (values and optimizer state), so batch i sees exactly what sync would have.

Batches in flight (sampled, not yet handed out) never exceed k. Sampling stays on the caller's thread because
that is the only place DGL's RNG is reproducible (:mod:`dgl_oac.sampling`); the batch stream is a function of
``seed`` alone, identical in every mode.
"""
from __future__ import annotations

import math
import time
import warnings
import weakref
from typing import Any, Dict, Iterator, Optional, Sequence

import dgl
import torch

from .config import check_mode, check_positive_int, check_priority, optional_seed, resolve_device, resolve_pin
from .embedding import NodeEmbedding
from .handout import HandOut
from .sampling import batch_seed, epoch_generator, reproducible
from .stage import Worker
from .stats import LoaderStats
from .store import check_ids

_IGNORED_DGL_KWARGS = ("use_uva", "persistent_workers", "pin_prefetcher", "use_prefetch_thread",
                       "use_alternate_streams", "gpu_cache", "prefetch_factor")


class DataLoader:
    """``DataLoader(graph, indices, graph_sampler, embeddings=[emb, ...], mode="oac", device=None, ...)``.

    Yields exactly what ``dgl.dataloading.DataLoader`` yields for ``graph_sampler`` and, for each embedding,
    its rows for the batch's input nodes as ``blocks[0].srcdata[emb.name]`` (float32[n, D], ``device``,
    requires grad); with no blocks (a zero-layer sampler) as ``ndata[emb.name]`` of the pair graphs.
    The sparse optimizer's ``step()`` commits exactly those rows.

    ``background_priority="idle"`` runs the gather and write-back threads at Linux ``SCHED_IDLE``: they use only
    what the training thread leaves idle, so on a machine whose cores the model's compute already fills they
    stop slowing it down (measured in ``benchmarks/RESULTS.md``). ``"normal"`` keeps the OS default; prefer it
    where other heavy processes share this one's scheduling group (no per-session autogroup), whose load would
    otherwise starve the pipeline (the time the caller spends waiting shows in ``stats.seconds["wait"]``).
    """

    def __init__(self, graph: dgl.DGLGraph, indices: torch.Tensor, graph_sampler: Any,
                 embeddings: Sequence[NodeEmbedding] = (), mode: str = "oac", device: Any = None,
                 batch_size: int = 1, shuffle: bool = False, drop_last: bool = False, num_workers: int = 0,
                 seed: Optional[int] = None, prefetch: int = 4, writeback_depth: Optional[int] = None,
                 pin: Any = "auto", check_finite: bool = True, background_priority: str = "idle",
                 **kwargs: Any) -> None:
        for key in list(kwargs):
            if key in _IGNORED_DGL_KWARGS:
                warnings.warn(f"DataLoader({key}=...) is a dgl.dataloading option that dgl_oac ignores",
                              stacklevel=2)
                kwargs.pop(key)
        if kwargs:
            raise TypeError(f"unknown DataLoader option(s): {', '.join(sorted(kwargs))}")
        if num_workers:
            raise ValueError("num_workers > 0 is not supported: dgl_oac samples on the calling thread, the only "
                             "place DGL's sampling is reproducible; gather, copy and write-back already run on "
                             "background threads")
        if not isinstance(graph, dgl.DGLGraph):
            raise TypeError(f"graph must be a dgl.DGLGraph, got {type(graph).__name__}")
        if graph.idtype != torch.int64:
            raise TypeError(f"graph has idtype {graph.idtype}; dgl_oac uses int64 node ids throughout: pass "
                            f"graph.long()")
        if isinstance(indices, dict):
            raise TypeError("heterogeneous indices (a dict) are not supported yet; pass an int64 tensor")
        self.graph, self.graph_sampler = graph, graph_sampler
        self.mode = check_mode(mode)
        self.device = resolve_device("cpu" if device is None else device)
        self.pin = resolve_pin(pin, self.device)
        self.batch_size = check_positive_int("batch_size", batch_size)
        self.prefetch = check_positive_int("prefetch", prefetch)
        self.writeback_depth = check_positive_int(
            "writeback_depth", max(2, self.prefetch) if writeback_depth is None else writeback_depth)
        self.shuffle, self.drop_last, self.check_finite = bool(shuffle), bool(drop_last), bool(check_finite)
        self.background_priority = check_priority(background_priority)
        self.seed = optional_seed(seed)
        self.indices = torch.as_tensor(indices)
        self.embeddings = list(embeddings)
        self._check_inputs()
        self._stats = LoaderStats()
        self._epoch, self._start = 0, 0
        self._iter: Optional["_Epoch"] = None

    def _check_inputs(self) -> None:
        is_edge = hasattr(self.graph_sampler, "negative_sampler") or getattr(
            self.graph_sampler, "samples_edges", False)
        bound = self.graph.num_edges() if is_edge else self.graph.num_nodes()
        check_ids(self.indices, bound, "indices (" + ("edge" if is_edge else "node") + " ids)")
        names = [e.name for e in self.embeddings]
        if len(set(names)) != len(names):
            raise ValueError(f"embedding names must be unique, got {names}")
        for emb in self.embeddings:
            if not isinstance(emb, NodeEmbedding):
                raise TypeError(f"embeddings must be dgl_oac.NodeEmbedding, got {type(emb).__name__}")
            if emb.num_embeddings != self.graph.num_nodes():
                raise ValueError(f"NodeEmbedding {emb.name!r} has {emb.num_embeddings} rows but the graph has "
                                 f"{self.graph.num_nodes()} nodes")

    @property
    def stats(self) -> LoaderStats:
        """Counters and per-stage seconds (``writeback``: busy time of the embeddings' write-back threads)."""
        writers = [e.writer for e in self.embeddings if e.writer is not None]
        self._stats.seconds["writeback"] = sum(w.busy_s for w in writers)
        return self._stats

    def __len__(self) -> int:
        n = self.indices.numel()
        return n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)

    def __iter__(self) -> Iterator[Any]:
        it = self._iter
        if it is not None and not it.finished:
            if it.handed > it.start:  # an abandoned epoch counts as done, as in torch
                self._epoch, self._start = it.epoch + 1, 0
            else:  # iter() again before any next() (tqdm.auto does this) starts the same epoch, same place
                self._epoch, self._start = it.epoch, it.start
        self.close()
        for emb in self.embeddings:
            emb._prepare(self.device, self.pin, self.mode, self.writeback_depth, self.background_priority,
                         steps_in_flight=self.prefetch + self.writeback_depth + 2)
        epoch, start = self._epoch, self._start
        self._start = 0
        self._iter = _Epoch(self, epoch, start)
        return self._iter

    # --- resume ---------------------------------------------------------------------------------------------
    def state_dict(self) -> Dict[str, int]:
        """Where the next run resumes: ``{"seed", "epoch", "position"}``. ``position`` counts the epoch's batches
        that are done: committed, skipped by a failed ``step()`` (non-finite), or dropped without a gradient; a
        batch handed out but not yet stepped is not done (a resumed run hands it out again)."""
        if self._iter is not None and not self._iter.finished:
            it = self._iter  # with no embeddings nothing is committed: a batch counts once handed out
            waiting = sum(1 for s in self.embeddings[0].pending if it.handout.on_commit in s.on_commit) \
                if self.embeddings else 0
            return {"seed": self.seed, "epoch": it.epoch, "position": it.handed - waiting}
        return {"seed": self.seed, "epoch": self._epoch, "position": self._start}

    def load_state_dict(self, state: Dict[str, int]) -> None:
        self.close()
        self.seed, self._epoch, self._start = int(state["seed"]), int(state["epoch"]), int(state["position"])

    def close(self) -> None:
        """Stop the background threads of the current epoch. Idempotent."""
        if self._iter is not None:
            self._iter.close()
            self._iter = None

    def __enter__(self) -> "DataLoader":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
        for emb in self.embeddings:
            emb.close()

    def __del__(self) -> None:
        try:  # may run inside the cyclic GC at any moment (another loader's batch awaiting backward, say):
            if self._iter is not None:  # stop threads, leave the embeddings' pending batches alone
                self._iter.close(release_pending=False)
        except Exception:  # interpreter shutdown
            pass


def _weakly(method: Any) -> Any:
    """``method`` without keeping its object alive (calls after the object died return None). The gather
    thread and handed-out batches hold an epoch only this way, so an iterator dropped mid-epoch without
    ``close()`` (a ``break`` inside a function) is collected, and ``_Epoch.__del__`` stops its thread and
    closes its open reads, which would otherwise pin the OAC write log's horizon forever."""
    ref = weakref.WeakMethod(method)
    return lambda *args: (lambda m: None if m is None else m(*args))(ref())


class _Epoch:
    """One pass over the indices: the caller-side half of the schedule in the module docstring."""

    def __init__(self, loader: DataLoader, epoch: int, start: int) -> None:
        self.loader, self.epoch = loader, epoch
        n = loader.indices.numel()
        order = torch.randperm(n, generator=epoch_generator(loader.seed, epoch)) if loader.shuffle else None
        self.order = loader.indices if order is None else loader.indices[order]
        self.num_batches = len(loader)
        self.next_sample = self.handed = self.start = start
        self.committed = start
        self.finished = False
        self.closed = False  # a closed epoch (loader.close(), an error, the end) hands out nothing more
        self.handout = HandOut(loader, _weakly(self._on_commit))
        self.worker: Optional[Worker] = None
        self._open: Dict[int, list] = {}  # batch -> Rows whose reads are open but not handed out
        self._sample_error: Optional[BaseException] = None  # raised when its batch is due, not when sampled ahead
        if loader.mode != "sync" and loader.embeddings:
            depth = loader.prefetch + 1
            self.worker = Worker(f"dgl-oac-gather-e{epoch}", _weakly(self._gather), depth, depth,
                                 priority=loader.background_priority)

    def __del__(self) -> None:
        try:  # see DataLoader.__del__
            self.close(release_pending=False)
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    def _on_commit(self, slot: Any, seconds: float, repatched: int) -> None:
        self.committed += 1
        st = self.loader._stats
        st.committed += 1
        st.seconds["commit"] += seconds
        st.rows_repatched_at_commit += repatched

    def _sample(self, b: int) -> Any:
        t0 = time.perf_counter()
        seeds = self.order[b * self.loader.batch_size:(b + 1) * self.loader.batch_size]
        with reproducible(batch_seed(self.loader.seed, self.epoch, b)):
            result = self.loader.graph_sampler.sample(self.loader.graph, seeds)
        self.loader._stats.seconds["sample"] += time.perf_counter() - t0
        return b, result

    def _gather(self, item: Any) -> Any:  # gather thread
        from .gather import gather_rows

        b, result = item
        rows = gather_rows(self.loader.embeddings, input_nodes_of(result), open_read=True,
                           seconds=self.loader._stats.seconds)
        self._open[b] = rows
        return b, result, rows

    def __iter__(self) -> "_Epoch":
        return self

    def __next__(self) -> Any:
        if self.finished or self.closed:
            raise StopIteration
        if self.handed >= self.num_batches:
            self._finish()
            raise StopIteration
        try:
            if self.worker is None:
                b, result = self._sample(self.handed)
                rows = None
            else:
                last = min(self.handed + self.loader.prefetch, self.num_batches - 1)
                while self.next_sample <= last and self._sample_error is None:
                    try:
                        item = self._sample(self.next_sample)
                    except Exception as exc:  # noqa: BLE001 - the batches before it are handed out first
                        self._sample_error = exc
                        break
                    self.worker.submit(item)
                    self.next_sample += 1
                if self._sample_error is not None and self.next_sample == self.handed:
                    raise self._sample_error
                in_flight = self.next_sample - self.handed
                assert in_flight <= self.loader.prefetch + 1, \
                    f"{in_flight} batches in flight with prefetch={self.loader.prefetch}"
                self.loader._stats.max_in_flight = max(self.loader._stats.max_in_flight, in_flight - 1)
                t0 = time.perf_counter()
                b, result, rows = self.worker.result()
                self.loader._stats.seconds["wait"] += time.perf_counter() - t0
                self._open.pop(b)
            assert b == self.handed, f"batch {b} handed out in place of batch {self.handed}"
            out = self.handout(result, rows)
        except BaseException:
            self.close()
            raise
        self.handed += 1
        self.loader._stats.batches += 1
        return out

    def _finish(self) -> None:
        self.finished = True
        self.close()
        for emb in self.loader.embeddings:
            emb.flush()  # the epoch's last step is in the table once the loop ends
        self.loader._epoch, self.loader._start = self.epoch + 1, 0

    def close(self, release_pending: bool = True) -> None:
        """Stop the gather thread and release reads of batches never handed out. Idempotent. With
        ``release_pending``, also forget handed-out batches that got no gradient (of any loader)."""
        self.closed = True
        if self.worker is not None:
            self.worker.close()
            self.worker = None
        for rows in self._open.values():
            for r in rows:
                r.emb.clock.end_read(r.rv)
        self._open.clear()
        for emb in self.loader.embeddings if release_pending else ():
            emb.drop_pending_without_grad()


def input_nodes_of(result: Any) -> torch.Tensor:
    """A DGL sampler's ``input_nodes`` (first element of its tuple), homogeneous graphs only."""
    ids = result[0]
    if isinstance(ids, dict):
        raise TypeError("heterogeneous batches are not supported yet (input_nodes is a dict)")
    return ids
