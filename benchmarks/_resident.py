"""The device-resident table: the race's ceiling mode ``"resident"``.

What a user whose table fits in device memory would run. The whole table and its optimizer state are one
``float32[N, D+S]`` tensor on the compute device (value ‖ state, the layout of :mod:`dgl_oac.engine.table`). A
read gathers the batch's rows there, and the model gets their values as a leaf. ``step()`` runs the library's
own code on those rows: the combine (:func:`dgl_oac.engine.step.combine`), the duplicate reduction
(:func:`dgl_oac.engine.step.reduce_duplicates`) and the optimizer's row kernel (``dgl_oac.optim``). It then
writes the new rows back in place.

No pipeline is involved: no gather thread, no host copy either way, no write-back, no write log, no version
clock. The batches come from a :class:`dgl_oac.DataLoader` without tables, which gives the same batch stream
as every mode: sampled on the caller's thread, the structure copied on the side stream. It is the ceiling any
CPU-table scheme can reach.

On the CPU it is the same table in place (sync without copies), and it trains sync's bits exactly
(``tests/tools/test_resident.py``).

This is a benchmark-level reference, not a library mode. A library mode (``mode="resident"`` on the loader
and the table, with the store on the device) would need the engine's store, pipeline and loader to accept a
device-resident store. Those files have other owners.
"""
from __future__ import annotations

import types
from typing import Any, List, Sequence

import torch

import dgl_oac
from dgl_oac.engine.pipeline import BatchState, HandedOut, TableRows
from dgl_oac.engine.step import combine, reduce_duplicates

#: rows copied to the device per chunk when a table is moved there (bounds the host staging memory)
CHUNK_ROWS = 1 << 20


class ResidentEmbedding:
    """A table ``float32[N, D+S]`` on one device. Called like a ``NodeEmbedding`` (``emb(ids, device)``), and
    stepped by :class:`ResidentOptimizer`.

    Every call with grad enabled is one read: a batch of its own, committed by the next ``step()`` if its leaf
    has a gradient by then, and dropped otherwise. ``ids`` must be unique within a call. A batch's input nodes
    are unique, and the tasks read them once.
    """

    def __init__(self, name: str, table: torch.Tensor, dim: int) -> None:
        self.name, self.table, self.embedding_dim = name, table, int(dim)
        self.num_embeddings = table.shape[0]
        # what a row kernel's update_table reads of a table: its name and store.dim
        self.view = types.SimpleNamespace(name=name, store=types.SimpleNamespace(dim=self.embedding_dim))
        self._reads: List[HandedOut] = []

    @classmethod
    def of(cls, emb: "dgl_oac.NodeEmbedding", device: torch.device) -> "ResidentEmbedding":
        """``emb``'s values and optimizer state (its optimizer attached, so the state columns exist) on
        ``device``: on the CPU the very table, in place; elsewhere a copy, in chunks of :data:`CHUNK_ROWS`."""
        emb.flush()
        src = emb.store.table
        if torch.device(device).type == "cpu":
            return cls(emb.name, src, emb.embedding_dim)
        table = torch.empty(src.shape, dtype=src.dtype, device=device)
        for lo in range(0, src.shape[0], CHUNK_ROWS):
            table[lo:lo + CHUNK_ROWS].copy_(src[lo:lo + CHUNK_ROWS])
        return cls(emb.name, table, emb.embedding_dim)

    @property
    def weight(self) -> torch.Tensor:
        """``float32[N, D]`` on the table's device: a view of the values."""
        return self.table[:, : self.embedding_dim]

    @property
    def optm_state(self) -> torch.Tensor:
        """``float32[N, S]`` on the table's device: a view of the optimizer state."""
        return self.table[:, self.embedding_dim:]

    def __call__(self, node_ids: torch.Tensor, device: Any = None) -> torch.Tensor:
        """Rows ``float32[n, D]`` on the table's device for unique ``node_ids: int64[n]`` (any device). With
        grad: a leaf over a gather of the full rows, kept for the next ``step()`` (the leaf sync's hand-out
        makes, :mod:`dgl_oac.engine.pipeline`). ``device`` is accepted for the ``NodeEmbedding`` call shape and
        must be the table's."""
        if device is not None and torch.device(device).type != self.table.device.type:
            raise ValueError(f"ResidentEmbedding {self.name!r} lives on {self.table.device}, not {device}")
        ids = node_ids.to(self.table.device)
        d = self.embedding_dim
        if not torch.is_grad_enabled():
            return self.table[:, :d].index_select(0, ids)
        rows = self.table.index_select(0, ids)  # value ‖ state: what the kernel updates
        leaf = rows[:, :d].contiguous() if rows.shape[1] != d else rows.detach().clone()
        leaf.requires_grad_(True)
        self._reads.append(HandedOut(TableRows(ids, ids, rows, None), "sync", True, BatchState(None, leaf=leaf)))
        return leaf

    def commit(self, kernel: Any) -> None:
        """One step of ``kernel`` (a ``dgl_oac.optim`` optimizer, for its math) over the reads with a gradient,
        written in place; reads without one are dropped."""
        ready = [b for b in self._reads if b.has_grad()]
        self._reads = []
        if not ready:
            return
        _, ids, rows, sums, counts = combine(ready, self.embedding_dim)
        grad = reduce_duplicates(kernel, sums, counts)
        checked = getattr(kernel, "update_checked", None)  # the committers' call (engine.step.run_kernel)
        if checked is not None:
            new = checked(self.view, rows, grad)[0]
        else:
            new = kernel.update_table(self.view, rows, grad)
        self.table.index_copy_(0, ids, new)


class ResidentOptimizer:
    """``step()`` over :class:`ResidentEmbedding` s with the row kernel of ``kernel`` (a ``dgl_oac.optim``
    optimizer; the tables it was built over are not touched)."""

    def __init__(self, kernel: Any, tables: Sequence[ResidentEmbedding]) -> None:
        self.kernel, self.tables = kernel, list(tables)

    @property
    def param_groups(self) -> List[dict]:
        return self.kernel.param_groups

    def zero_grad(self) -> None:
        """No-op: each read's gradient is consumed by one ``step()``, as in dgl_oac."""

    def step(self) -> None:
        with torch.no_grad():
            for t in self.tables:
                t.commit(self.kernel)


def tableless(loader: "dgl_oac.DataLoader") -> "dgl_oac.DataLoader":
    """A loader of ``loader``'s batches without its tables: the same stream (a function of the seed), the
    structure moved to the device as ``loader`` would move it, no rows."""
    return dgl_oac.DataLoader(loader.graph, loader.indices, loader.graph_sampler, embeddings=(), mode="sync",
                              device=loader.device, batch_size=loader.batch_size, shuffle=loader.shuffle,
                              drop_last=loader.drop_last, num_workers=loader.num_workers, seed=loader.seed,
                              pin=loader.pin, structure=loader.structure)


def make_resident(task: Any) -> Any:
    """Turn a freshly built sync ``task`` (a :mod:`dgl_oac.app.tasks` task with one table, ``task.emb``: node,
    link, kg) into its resident twin, in place: the table on ``task.device``, its optimizer's kernel, a
    tableless loader of the same batches. Model and table initialisation are sync's own. Returns ``task``."""
    emb, loader = task.emb, task.loader
    if not isinstance(emb, dgl_oac.NodeEmbedding) or not isinstance(loader, dgl_oac.DataLoader):
        raise TypeError(f"make_resident needs a dgl-oac task (NodeEmbedding, DataLoader), got "
                        f"{type(emb).__name__} and {type(loader).__name__}")
    if emb.pipeline.steps:
        raise ValueError(f"make_resident needs a fresh task; NodeEmbedding {emb.name!r} has trained "
                         f"{emb.pipeline.steps} steps")
    resident = ResidentEmbedding.of(emb, task.device)
    task.loader = tableless(loader)
    loader.close()
    emb.close()
    task.emb, task.sparse = resident, ResidentOptimizer(task.sparse, [resident])
    return task
