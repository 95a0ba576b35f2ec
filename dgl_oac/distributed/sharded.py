"""The table of a sharded :class:`~dgl_oac.NodeEmbedding` (``sharding="rows"``): each rank holds only the rows it
owns, values and optimizer state, and reads the others' from their owners (DGL's ``DistEmbedding`` layout).

Rank ``r`` holds rows ``[lo, hi)`` of its :class:`~.partition.RowPartition` in a ``float32[hi - lo, D + S]``
shard (anonymous shared memory: forked sampling workers never copy it), so a machine holds its trainers'
shares, about ``N / machines`` rows, where the replicated layout (:mod:`.shared`) holds all ``N`` on every
machine. A read (:meth:`ShardedRowStore.gather`) asks every other owner of its ids for their rows at once
through the row service (:mod:`.rowserver`), gathers its own rows while they answer, and assembles the batch;
it is made by whatever thread reads (the gather thread for batches read ahead), never as a collective. Writes
are an owner's, of its own rows only (the N-trainer step: :mod:`.committer`); nothing is mirrored.

What a sharded table does not offer: ``emb.weight`` and ``emb.optm_state`` (no rank has the whole table; read
rows with ``emb(ids)`` on any rank, or the whole table with ``all_get_embedding()``, a collective). Its
``init_func`` runs on each owner's shard (as DGL's ``DistEmbedding`` runs it on each server's part).
"""
from __future__ import annotations

from typing import Callable, Dict, Optional

import torch

from ..engine.table import RowStore, shared_zeros
from .exchange import exchange
from .group import Group
from .partition import RowPartition
from .rowserver import REPLY_TIMEOUT_S, RowService, service_for
from .shared import REPLICATE_CHUNK


class ShardedRowStore(RowStore):
    """This rank's rows of a table of ``partition.num_rows`` rows (see the module docstring). Building it and
    widening it are collectives (every rank, in the same order)."""

    def __init__(self, partition: RowPartition, dim: int,
                 init_func: Optional[Callable[[torch.Tensor], torch.Tensor]], name: str, group: Group) -> None:
        if partition.num_rows <= 0 or dim <= 0:
            raise ValueError(f"a table needs num_rows > 0 and dim > 0, got {partition.num_rows} x {dim}")
        self.num_rows, self.dim, self.state_width = partition.num_rows, int(dim), 0
        self.path = None
        self.name, self.group, self.partition = name, group, partition
        self.lo, self.hi = partition.range_of(group.rank)
        self.table = shared_zeros(self.hi - self.lo, self.dim)
        if init_func is not None and self.hi > self.lo:
            self._init_values(init_func)
        self._ready: Callable[[int, float], bool] = lambda step, timeout: True  # no step yet: see serve_versions
        self.service: RowService = service_for(group)
        self.index = self.service.add(self.table, self.lo, self._ready)
        group.barrier(f"NodeEmbedding {name!r}: every shard is served")

    def _init_values(self, init_func: Callable[[torch.Tensor], torch.Tensor], chunk: int = 0) -> None:
        """``init_func`` on this rank's shard ``float32[hi - lo, D]``, in place or returned, in one call (the shard
        is in memory: ``chunk``, RowStore's for file-backed tables, does not apply)."""
        block = self.table
        out = init_func(block)
        if out is not None and out is not block:
            if tuple(out.shape) != tuple(block.shape):
                raise ValueError(f"init_func returned shape {tuple(out.shape)}, expected {tuple(block.shape)}")
            block.copy_(out)

    def serve_versions(self, ready: Callable[[int, float], bool]) -> None:
        """``ready(step, timeout)``: whether step ``step`` is applied to this shard (waiting up to ``timeout`` s),
        the table's clock; reads at a step (here and from other ranks) wait for it."""
        self._ready = ready
        self.service.replace(self.index, ready=ready)

    def owned(self, lo: int, hi: int) -> torch.Tensor:
        """This rank's rows ``[lo, hi)``: the shard itself."""
        if (lo, hi) != (self.lo, self.hi):
            raise ValueError(f"rank {self.group.rank} holds rows [{self.lo}, {self.hi}), not [{lo}, {hi})")
        return self.table

    def widen(self, state_width: int) -> None:
        """Collective: zeroed optimizer-state columns on every shard (once, before training); no rank reads
        before every shard is wide (a read asks for rows of the new width)."""
        if not self.needs_widening(state_width):
            return
        new = shared_zeros(self.hi - self.lo, self.dim + state_width)
        new[:, : self.dim] = self.table[:, : self.dim]
        self.table, self.state_width = new, state_width
        self.service.replace(self.index, new)
        self.group.barrier(f"NodeEmbedding {self.name!r}: every shard is widened")

    def _local(self, ids: torch.Tensor) -> torch.Tensor:
        if ids.numel() and (int(ids.min()) < self.lo or int(ids.max()) >= self.hi):
            raise RuntimeError(f"rank {self.group.rank} writes only its own rows [{self.lo}, {self.hi}) of "
                               f"{self.name!r}")
        return ids - self.lo

    def gather(self, ids: torch.Tensor, out: Optional[torch.Tensor] = None, at: Optional[int] = None) -> torch.Tensor:
        """Rows ``float32[n, D+S]`` for ``ids: int64[n], CPU`` (into ``out``): this rank's from its shard, the
        others' from their owners (:meth:`.rowserver.RowService.fetch`, every owner asked at once).

        Of another owner's rows only the values travel, and their state columns here are zero: with several
        trainers the optimizer runs on each owner's own rows (:mod:`.committer`), never on a batch's, so a
        reader needs values alone (for Adam a third of the bytes). ``at``: the read's version; every owner
        (this rank too) returns its rows once step ``at`` is applied to them (None: as they are)."""
        n = ids.numel()
        rows = torch.empty(n, self.width) if out is None else out[:n]
        owner = self.partition.owner_of(ids)
        mine = owner == self.group.rank
        requests: Dict[int, torch.Tensor] = {}
        where: Dict[int, torch.Tensor] = {}
        if not bool(mine.all()):
            order, counts = self.partition.by_owner(ids, owner)
            for o, pos in enumerate(order.split(counts)):
                if pos.numel() and o != self.group.rank:
                    requests[o], where[o] = ids[pos], pos

        def local() -> None:
            if at is not None and not self._ready(at, REPLY_TIMEOUT_S):
                raise TimeoutError(f"a read of {self.name!r} at step {at} waited {REPLY_TIMEOUT_S}s for this rank "
                                   f"to apply it")
            pos = mine.nonzero().flatten()
            if pos.numel():
                rows.index_copy_(0, pos, self.table.index_select(0, ids[pos] - self.lo))

        if requests:
            for o, got in self.service.fetch(self.index, self.dim, -1 if at is None else at, requests,
                                             local).items():
                rows[:, : self.dim].index_copy_(0, where[o], got)
                if self.state_width:
                    rows[:, self.dim:].index_fill_(0, where[o], 0.0)
        else:
            local()
        return rows

    def write(self, ids: torch.Tensor, rows: torch.Tensor) -> None:
        """Overwrite owned rows (values and state). ``ids`` unique, all this rank's."""
        self.table.index_copy_(0, self._local(ids), rows)

    def add(self, ids: torch.Tensor, delta: torch.Tensor) -> None:
        self.table.index_add_(0, self._local(ids), delta)

    def set_all(self, values: Optional[torch.Tensor]) -> None:
        """Collective: the values of rank 0's ``values: float32[N, D]`` (other ranks: ignored, may be None) into
        every shard, optimizer state kept; sent in chunks of rows."""
        g, n = self.group, self.num_rows
        step = max(1, REPLICATE_CHUNK // self.dim)
        for start in range(0, n, step):
            stop = min(n, start + step)
            parts = []
            for r in range(g.world):
                lo_r, hi_r = self.partition.range_of(r)
                a, b = max(start, lo_r), min(stop, hi_r)
                parts.append(values[a:b].float() if g.rank == 0 and b > a else torch.empty(0, self.dim))
            got = exchange(g, parts, what=f"NodeEmbedding {self.name!r}: rank 0's values to every owner",
                           kind="replication")[0]
            a = max(start, self.lo)
            self.table[a - self.lo:a - self.lo + got.shape[0], : self.dim] = got

    def all_rows(self) -> torch.Tensor:
        """Collective: the whole table ``float32[N, D + S]`` on every rank (every shard sent to every rank)."""
        g = self.group
        got = exchange(g, [self.table] * g.world, what=f"NodeEmbedding {self.name!r}: every shard to every rank",
                       kind="replication")
        return torch.cat(got)

    def close(self) -> None:
        """Stop serving this shard (the row service stops with the last one). Idempotent."""
        if self.service.remove(self.index):
            self.service.close()
