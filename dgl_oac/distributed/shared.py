"""The table of a distributed :class:`~dgl_oac.NodeEmbedding`: one copy in shared memory, mapped by every rank.

Why shared and not sharded: on one machine this is what DGL does, so ``emb.weight`` (and ``emb(ids)`` under
``no_grad``, an evaluation on rank 0 alone) sees the whole table on every rank without a collective, and a read
never waits for another rank. Each row is still written by one rank only, its owner (:mod:`.owners`), which
is what the commit protocol relies on; a sharded table (several machines) would change where rows are read
from, not who writes them.

The file lives in ``/dev/shm`` (else the temp dir). Rank 0 creates and fills it; the others map it; then rank 0
unlinks it, so nothing is left behind when the ranks exit, whatever way they do.
"""
from __future__ import annotations

import os
import re
import tempfile
import uuid
from pathlib import Path
from typing import Callable, Optional

import torch

from ..store import RowStore, map_table
from .group import Group


def _shm_dir() -> Path:
    return Path("/dev/shm") if os.path.isdir("/dev/shm") else Path(tempfile.gettempdir())


class SharedRowStore(RowStore):
    """A :class:`~dgl_oac.store.RowStore` whose ``table`` every rank of ``group`` maps. Building it and
    widening it are collectives (every rank calls them, in the same order)."""

    def __init__(self, num_rows: int, dim: int, init_func: Optional[Callable[[torch.Tensor], torch.Tensor]],
                 name: str, group: Group) -> None:
        if num_rows <= 0 or dim <= 0:
            raise ValueError(f"a table needs num_rows > 0 and dim > 0, got {num_rows} x {dim}")
        self.num_rows, self.dim, self.state_width = int(num_rows), int(dim), 0
        self.path = None  # a memory table to everything else (checkpoints stream it like one)
        self.group = group
        self.name = re.sub(r"[^A-Za-z0-9_.-]", "_", name)[:64]
        self.table = self._shared(self.dim, lambda: self._init_values(init_func) if init_func else None)

    def _shared(self, width: int, fill: Callable[[], None]) -> torch.Tensor:
        """A new zeroed ``float32[N, width]`` shared table; rank 0 runs ``fill()`` (with ``self.table`` = the
        new table) before any other rank maps it."""
        path = self.group.broadcast_object(
            str(_shm_dir() / f"dgl-oac-{self.name}-{uuid.uuid4().hex}") if self.group.rank == 0 else None,
            what=f"NodeEmbedding {self.name!r}: table file name")
        old = getattr(self, "table", None)
        try:
            if self.group.rank == 0:
                self.table = map_table(Path(path), self.num_rows, width, create=True)
                fill()
            self.group.barrier(f"NodeEmbedding {self.name!r}: table filled")
            if self.group.rank != 0:
                self.table = map_table(Path(path), self.num_rows, width, create=False)
            self.group.barrier(f"NodeEmbedding {self.name!r}: table mapped")
        finally:
            if self.group.rank == 0 and os.path.exists(path):
                os.unlink(path)  # mapped by every rank (or failed): the memory lives as long as a mapping
        table, self.table = self.table, old
        return table

    def widen(self, state_width: int) -> None:
        """Collective: every rank gets the same new shared table, values copied by rank 0, state zeroed."""
        if not self.needs_widening(state_width):
            return
        old = self.table
        self.table = self._shared(self.dim + state_width,
                                  lambda: self.table[:, : self.dim].copy_(old[:, : self.dim]))
        self.state_width = state_width

