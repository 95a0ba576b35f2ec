"""``NodeEmbedding``: a learnable table in CPU memory, a drop-in for ``dgl.nn.NodeEmbedding``.

It owns the CPU table (:class:`~dgl_oac.engine.table.RowStore`) and its :class:`~dgl_oac.engine.pipeline.TablePipeline`,
the one owner of everything in flight for the table. Reading ``emb.weight`` (or saving) first waits for pending
write-backs, so what a user sees is always every committed step.

Reads, as in DGL: ``emb(ids, device)`` with grad enabled is recorded and committed by the next ``step()``;
under ``torch.no_grad()`` it returns a plain tensor of the table's current rows and records nothing.
"""
from __future__ import annotations

import weakref
from typing import Any, Callable, Dict, Optional, Sequence

import torch

from .config import normalize_device
from .distributed import Group, current_group
from .distributed.committer import committer_for
from .distributed.inflight import DistTable
from .distributed.partition import RowPartition
from .distributed.shared import SharedRowStore
from .distributed.sharded import ShardedRowStore
from .engine.step import Committer, LOCAL
from .engine.pipeline import TablePipeline
from .engine.table import CacheSize, RowStore, Storage, check_ids
from .engine.table_view import table_view
from .unpipelined import warn_if_unpipelined

class NodeEmbedding:
    """``NodeEmbedding(num_embeddings, embedding_dim, name, init_func=None)``, float32, rows in CPU memory.

    ``storage="memory"`` (default) or a file path for a table larger than RAM (memory-mapped). ``cache``: a
    file-backed table's row cache (:class:`dgl_oac.engine.table.RowCache`: hot rows, value and optimizer state, in
    this process's memory, written to the file when they leave it, by ``sync_to_disk()`` and before a checkpoint
    or ``emb.weight`` reads the table); ``"auto"`` (default) gives a table larger than memory
    :data:`~dgl_oac.engine.table.CACHE_SHARE` of the memory the process has left at its first batch (its
    cgroup's limit where it has one, less what it holds then) and one that fits none, and turns it off if it hits
    under twice what as many random rows would (its ``off_reason`` says so); or a number
    of bytes, 0 for none. Training is bitwise the same with any cache.
    ``init_func`` fills a ``float32[n, D]`` tensor in place (or returns one), like DGL's; the default is zeros, as in DGL.

    Built after ``torch.distributed.init_process_group`` (more than one rank), on every rank in the same order,
    it is one table shared by the ranks, trained by N-trainer sync steps (:mod:`dgl_oac.distributed`).
    ``sharding`` says where its rows live then: ``"replicated"`` (default) keeps one copy of the whole table per
    machine (rank 0 runs ``init_func``): reads are local, memory is the whole table on every machine;
    ``"rows"`` keeps on each rank only the rows it owns, values and optimizer state
    (:mod:`dgl_oac.distributed.sharded`, DGL's ``DistEmbedding`` layout: each owner runs ``init_func`` on its
    rows), and reads the others' rows from their owners: memory is the table divided among the trainers. Both
    train the same, bitwise. ``partition``: which rows each rank owns, ``world + 1`` row boundaries (rank ``r``:
    ``[partition[r], partition[r + 1])``), the same on every rank; default ranges of ``ceil(N / world)`` rows; a
    DistGraph's: :func:`dgl_oac.dgl_frontend.distgraph.row_partition`.
    """

    def __init__(self, num_embeddings: int, embedding_dim: int, name: str,
                 init_func: Optional[Callable[[torch.Tensor], torch.Tensor]] = None, device: Any = None,
                 *, storage: Storage = "memory", sharding: str = "replicated",
                 partition: Optional[Sequence[int]] = None, cache: CacheSize = "auto") -> None:
        if not isinstance(name, str) or not name:
            raise ValueError(f"name must be a non-empty string, got {name!r}")
        if device is not None and torch.device(device).type != "cpu":
            raise ValueError("dgl_oac.NodeEmbedding keeps its table on the CPU; pass the compute device to the "
                             "DataLoader (device=...) instead")
        self.name = name
        self.num_embeddings, self.embedding_dim = int(num_embeddings), int(embedding_dim)
        if sharding not in ("replicated", "rows"):
            raise ValueError(f"sharding must be 'replicated' or 'rows', got {sharding!r}")
        self.group: Optional[Group] = current_group()
        self.sharded = sharding == "rows" and self.group is not None  # one process: the whole table is its share
        if self.group is None:
            self.store = RowStore(self.num_embeddings, self.embedding_dim, init_func, storage, cache)
        elif storage != "memory":
            raise ValueError("a NodeEmbedding trained by several ranks (torch.distributed is initialised) lives in "
                             "shared memory; storage=path is not supported there")
        elif self.sharded:
            self.store = ShardedRowStore(RowPartition(self.num_embeddings, self.group.world, partition),
                                         self.embedding_dim, init_func, name, self.group)
        else:
            self.store = SharedRowStore(self.num_embeddings, self.embedding_dim, init_func, name, self.group)
        self._optimizer: "Optional[weakref.ref[Any]]" = None  # weakly: no emb <-> optimizer reference cycle
        #: runs this table's steps (given it by its optimizer's ``step()``): this process's alone, or the trainers'
        self.committer: Committer = LOCAL if self.group is None else committer_for(self.group)
        self.pipeline = TablePipeline(name, self.store, None if self.group is None else DistTable.make(
            getattr(self.store, "partition", None) or RowPartition(self.num_embeddings, self.group.world, partition),
            self.group.rank, self.sharded))
        self._closed = False
        self._warned_unpipelined = False
        self._warned_bypass = False
        self._fresh_reads = 0  # emb(ids) calls with grad that read the table directly (not a batch's rows)

    # --- DGL surface ----------------------------------------------------------------------------------------
    @property
    def weight(self) -> torch.Tensor:
        """``float32[N, D]``, CPU: the table's values after every committed step (waits for write-backs).

        Written as DGL's weight is: ``torch.nn.init.uniform_(emb.weight, 0, 1)``, ``emb.weight[ids] = rows``,
        ``emb.weight.data.copy_(t)``, ... give the values they give on a plain tensor (the same random draws), and
        each such write is one logged step of the table (:meth:`write_rows`; :mod:`dgl_oac.engine.table_view`):
        batches read ahead are patched, so oac stays equal to sync with writes before, between or during epochs.
        A write copies the rows it covers (the whole table for a ``torch.nn.init`` call): for a few rows each step,
        :meth:`write_rows` is cheaper. Reshaping in place is refused. Single-process; a sharded table has none.
        """
        self._refuse_if_sharded("weight")
        self.flush()
        return table_view(self.store.value(), f"NodeEmbedding {self.name!r}.weight", table=self)

    def write_rows(self, ids: torch.Tensor, values: torch.Tensor) -> None:
        """Set the values of rows ``ids: int64[n]`` (unique) to ``values: float32[n, D]`` (any device); their
        optimizer state is kept.

        The write is a step of its own, like an optimizer's: it takes the next step number and goes through the
        table's one write path (write-back in step order, write log), so batches already read ahead are patched
        at hand-out, and held batches at commit, exactly as for a training step: every mode reads what sync
        reads, bitwise. For a max-norm constraint (as TransE codes apply to the rows just trained):

            with torch.no_grad():
                rows = emb.weight[ids]
                emb.write_rows(ids, rows.renorm(2, 0, max_norm))

        Call it between steps (after ``opt.step()``), as a DGL loop writes ``emb.weight``; single-process only.
        While a loader reads ahead (oac), the rows are logged on the compute device like a step's: a write of
        many rows (a whole table) costs log memory like a batch of that many rows.
        """
        check_ids(ids, self.num_embeddings, f"ids passed to NodeEmbedding {self.name!r}.write_rows")
        ids = ids.cpu()
        if not isinstance(values, torch.Tensor) or tuple(values.shape) != (ids.numel(), self.embedding_dim):
            got = tuple(values.shape) if isinstance(values, torch.Tensor) else type(values).__name__
            raise ValueError(f"values for NodeEmbedding {self.name!r}.write_rows must be a float tensor of shape "
                             f"{(ids.numel(), self.embedding_dim)}, got {got}")
        if torch.unique(ids).numel() != ids.numel():
            raise ValueError(f"ids passed to NodeEmbedding {self.name!r}.write_rows repeat a row: which value "
                             f"wins would be undefined; pass each row once")
        with torch.no_grad():
            values = values.detach().to(device="cpu", dtype=torch.float32)
            self.pipeline.write_values(ids, values.as_subclass(torch.Tensor))

    @property
    def rank(self) -> int:
        """This process's rank among the trainers (-1 when not distributed, as in DGL)."""
        return -1 if self.group is None else self.group.rank

    @property
    def world_size(self) -> int:
        """Number of trainers (0 when not distributed, as in DGL)."""
        return 0 if self.group is None else self.group.world

    def all_set_embedding(self, values: torch.Tensor) -> None:
        """Set the whole table's values to ``values: float32[N, D]`` (collective when distributed: every rank
        calls it; rank 0's values are written, on every machine). DGL's API."""
        if tuple(values.shape) != (self.num_embeddings, self.embedding_dim):
            raise ValueError(f"values for {self.name!r} have shape {tuple(values.shape)}, expected "
                             f"{(self.num_embeddings, self.embedding_dim)}")
        if self.sharded:
            self.pipeline.reset()
            self.store.set_all(values)
            self.group.barrier(f"NodeEmbedding {self.name!r}: all_set_embedding")
            return
        if self.group is None or self.group.rank == 0:
            self.load_state_dict({"weight": values})
        if self.group is not None:
            self.group.barrier(f"NodeEmbedding {self.name!r}: all_set_embedding")
            self.store.replicate()

    def all_get_embedding(self) -> torch.Tensor:
        """The whole table's values, ``float32[N, D]`` (the shared table itself when replicated; a copy gathered
        from every owner, a collective, when sharded). DGL's API."""
        if self.sharded:
            return self.store.all_rows()[:, : self.embedding_dim]
        return self.weight

    def local_rows(self) -> "tuple[int, torch.Tensor]":
        """``(lo, values)``: this rank's own rows ``lo <= id < lo + len(values)``, ``float32[n, D]`` (read-only),
        after every committed step; the whole table in one process."""
        self.flush()
        lo, rows = self._owned_rows()
        return lo, table_view(rows[:, : self.embedding_dim], f"NodeEmbedding {self.name!r}.local_rows()")

    @property
    def optm_state(self) -> torch.Tensor:
        """``float32[N, S]``, CPU: each row's optimizer state after every committed step (``S`` columns as the
        optimizer's ``state_names`` say: 0 for SGD, D for Adagrad, 1 for SparseRowWiseAdagrad, 2D + 1 for Adam,
        D + 1 with its ``dtype=torch.float16``). Written as :attr:`weight` is: each write a logged step that
        keeps the rows' values."""
        self._refuse_if_sharded("optm_state")
        self.flush()
        return table_view(self.store.state(), f"NodeEmbedding {self.name!r}.optm_state", table=_StateColumns(self))

    def _refuse_if_sharded(self, what: str) -> None:
        if self.sharded:
            raise RuntimeError(f"NodeEmbedding {self.name!r} is sharded (sharding='rows'): no rank holds the whole "
                               f"table, so it has no .{what}. Read rows with emb(ids) (any rank, any time), the whole "
                               f"table with emb.all_get_embedding() (collective), or this rank's own rows with "
                               f"emb.local_rows()")

    def __call__(self, node_ids: torch.Tensor, device: Any = torch.device("cpu")) -> torch.Tensor:
        """Rows ``float32[n, D]`` for ``node_ids: int64[n]`` on ``device``, current as of this call.

        The input nodes of a batch the loader handed out (``emb(input_nodes, device)``, or any of their
        subsets) resolve to the batch's rows: differentiable, committed with the batch. So do ids that all lie
        in a batch still out (newest first: output nodes, a :class:`dgl_oac.BatchLoader` batch's ids), in every
        mode. Other ids are read from the table now; with grad enabled the read is committed by the next
        ``step()``, as in DGL.

        As in DGL, every call is one trace: a row's gradient is averaged over every occurrence of it in the
        step, across and within calls (``emb(input_nodes)`` and ``emb(output_nodes)`` of a skip connection,
        heads and tails with repeated ids). The first ``emb(input_nodes)`` call returns the batch's hand-out
        leaf (``blocks[0].srcdata[name]``): reading the rows that way and through that call is one occurrence.
        """
        table = self.pipeline
        hit = table.find(node_ids)
        leaf = None if hit is None else table.read_held(hit, torch.is_grad_enabled())
        if leaf is not None:  # the common case, emb(input_nodes, device): no id check, no host-device sync
            return leaf
        check_ids(node_ids, self.num_embeddings, f"ids passed to NodeEmbedding {self.name!r}")
        dev = torch.device(device)
        ids = node_ids.cpu()
        if not torch.is_grad_enabled():
            self.flush()
            if self.sharded or self.store.row_cache() is not None:  # from the owners (once they have applied every
                # step this rank has), or through the row cache (the file lacks its dirty rows)
                return self.store.gather(ids, at=self.pipeline.steps - 1)[:, : self.embedding_dim].to(dev)
            return self.store.value().index_select(0, ids).to(dev)  # values only: no optimizer state copied
        for batch in reversed(table.pending()):  # newest first: usually the batch out now, or a fresh read
            pos = None if batch.live_leaf() is None else batch.gathered.positions(ids)
            leaf = None if pos is None else table.current_leaf(batch)
            if leaf is not None:  # rows of a batch (output nodes, heads and tails, a BatchLoader's ids): a read
                whole = bool(torch.bincount(pos, minlength=batch.ids.numel()).all())  # pos is on the CPU: no sync
                rows = table.read(batch, pos, whole)  # pos stays on the host: read() copies it without a wait
                return rows if normalize_device(dev) == rows.device else rows.to(dev)
        warn_if_unpipelined(self, node_ids)
        self._fresh_reads += 1  # a BatchLoader counts these (its ids did not name them): dgl_oac.loading.batch_loader
        return table.read_now(ids, dev)

    # --- optimizer and pipeline -----------------------------------------------------------------------------
    @property
    def optimizer(self) -> Any:
        """The sparse optimizer attached to this table (None if none, or if it was garbage-collected)."""
        return None if self._optimizer is None else self._optimizer()

    def _attach_optimizer(self, opt: Any) -> None:
        if self.optimizer is not None and self.optimizer is not opt:
            raise RuntimeError(f"NodeEmbedding {self.name!r} already has a sparse optimizer")
        self.store.widen(opt.state_width(self.embedding_dim))
        self._optimizer = weakref.ref(opt)

    def flush(self) -> None:
        """Wait until every committed step is in the CPU table."""
        self.pipeline.flush()

    def close(self) -> None:
        """Drop uncommitted reads, apply pending write-backs and stop the write-back thread; a sharded table stops
        serving its rows (collective: every rank closes it). Idempotent."""
        self.pipeline.close()
        if self.sharded and not self._closed:
            self._closed = True
            self.group.barrier(f"NodeEmbedding {self.name!r}: closed on every rank")
            self.store.close()

    # --- state ----------------------------------------------------------------------------------------------
    def _owned_rows(self) -> "tuple[int, torch.Tensor]":
        """``(lo, rows)``: this rank's own rows ``lo <= id < lo + len(rows)``, a view ``float32[n, D + S]`` of the
        table (value ‖ optimizer state; the whole table in one process). What a checkpoint saves per rank."""
        if self.group is None:
            return 0, self.store.table
        lo, hi = self.pipeline.dist.partition.range_of(self.group.rank)
        return lo, self.store.owned(lo, hi)

    def _store_state_copy(self) -> torch.Tensor:
        """``float32[N, S]``: every row's optimizer state (collective when sharded)."""
        self.flush()
        if self.sharded:
            return self.store.all_rows()[:, self.embedding_dim:].clone()
        return self.store.state().clone()

    def _load_store_state(self, state: torch.Tensor) -> None:
        want = (self.num_embeddings, self.store.state_width)
        if tuple(state.shape) != want:
            raise ValueError(f"optimizer state for {self.name!r} has shape {tuple(state.shape)}, expected {want}")
        self.pipeline.reset()
        lo, rows = self._owned_rows() if self.sharded else (0, self.store.table)
        rows[:, self.embedding_dim:].copy_(state[lo:lo + rows.shape[0]])

    def state_dict(self) -> Dict[str, Any]:
        """``{"weight": float32[N, D]}`` (a copy, CPU; collective when sharded: :meth:`all_get_embedding`)."""
        return {"weight": self.all_get_embedding().clone() if self.sharded else self.weight.clone()}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Replace the values (e.g. on resume). No batch may be in flight."""
        w = state["weight"]
        if tuple(w.shape) != (self.num_embeddings, self.embedding_dim):
            raise ValueError(f"weight for {self.name!r} has shape {tuple(w.shape)}, "
                             f"expected {(self.num_embeddings, self.embedding_dim)}")
        self.pipeline.reset()
        if self.sharded:  # every rank passes the whole table; each keeps its rows
            lo, rows = self._owned_rows()
            rows[:, : self.embedding_dim].copy_(w[lo:lo + rows.shape[0]])
            return
        self.store.value().copy_(w)

    def __repr__(self) -> str:
        return (f"NodeEmbedding(num_embeddings={self.num_embeddings}, embedding_dim={self.embedding_dim}, "
                f"name={self.name!r}, state_width={self.store.state_width})")


class _StateColumns:
    """:attr:`NodeEmbedding.optm_state`'s writer for :func:`~dgl_oac.engine.table_view.table_view`: a write of
    state rows is one logged step that keeps the rows' values."""

    def __init__(self, emb: NodeEmbedding) -> None:
        self.emb = emb

    def flush(self) -> None:
        self.emb.flush()

    def write_rows(self, ids: torch.Tensor, values: torch.Tensor) -> None:
        """``values: float32[n, S]``, CPU, the new state of rows ``ids: int64[n]`` (unique)."""
        self.emb.pipeline.write_values(ids, values, start=self.emb.embedding_dim)
