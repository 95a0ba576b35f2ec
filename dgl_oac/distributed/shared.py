"""The table of a distributed :class:`~dgl_oac.NodeEmbedding`: one copy in shared memory per machine, mapped by
every rank of that machine.

Why shared and not sharded: on one machine this is what DGL does, so ``emb.weight`` (and ``emb(ids)`` under
``no_grad``, an evaluation on rank 0 alone) sees the whole table on every rank without a collective, and a read
never waits for another rank. Each row is still written by one rank only, its owner (:mod:`.partition`), which
is what the commit protocol relies on.

Several machines (:attr:`~.group.Group.machines`): each holds a replica, and every step's written rows reach
every replica before any rank reads again: the owner writes its machine's copy, and one rank of every other
machine replays the step on its copy (:func:`dgl_oac.distributed.committer.mirror_targets`, ``MIRROR``), inside
the step, before its closing barrier. A read on any machine therefore sees exactly what it would see on one machine (the
same versions, the same torn reads patched by the same forwarding), and training is bitwise the one-machine
run's. The cost is memory (the whole table on every machine: a larger table is sharded instead,
:mod:`.sharded`) and bytes (each step's written rows' ids and gradients, once per other machine).

The file lives in ``/dev/shm`` (else the temp dir). Each machine's lowest rank creates and fills it; the others
map it; then that rank unlinks it, so nothing is left behind when the ranks exit, whatever way they do.
"""
from __future__ import annotations

import os
import re
import tempfile
import uuid
from pathlib import Path
from typing import Callable, Optional

import torch

from ..engine.table import RowStore, map_table
from .group import Group


def _shm_dir() -> Path:
    return Path("/dev/shm") if os.path.isdir("/dev/shm") else Path(tempfile.gettempdir())


#: float32 elements per broadcast when a table is replicated to the other machines (64 MiB)
REPLICATE_CHUNK = 1 << 24


class SharedRowStore(RowStore):
    """A :class:`~dgl_oac.engine.table.RowStore` whose ``table`` every rank of a machine of ``group`` maps (one replica
    per machine). Building it, widening it and :meth:`replicate` are collectives (every rank calls them, in the
    same order)."""

    def __init__(self, num_rows: int, dim: int, init_func: Optional[Callable[[torch.Tensor], torch.Tensor]],
                 name: str, group: Group) -> None:
        if num_rows <= 0 or dim <= 0:
            raise ValueError(f"a table needs num_rows > 0 and dim > 0, got {num_rows} x {dim}")
        self.num_rows, self.dim, self.state_width = int(num_rows), int(dim), 0
        self.path = None  # a memory table to everything else (checkpoints stream it like one)
        self.group = group
        self.name = re.sub(r"[^A-Za-z0-9_.-]", "_", name)[:64]
        init = (lambda: self._init_values(init_func)) if init_func and group.rank == 0 else (lambda: None)
        self.table = self._shared(self.dim, init)
        if init_func:
            self.replicate()  # rank 0 ran init_func (it may draw from its RNG): its values on every machine

    def _shared(self, width: int, fill: Callable[[], None]) -> torch.Tensor:
        """A new zeroed ``float32[N, width]`` table per machine; each machine's lowest rank runs ``fill()`` (with
        ``self.table`` = the new table) before any other rank of the machine maps it."""
        g = self.group
        lead = g.rank == g.leader
        paths = g.all_gather_object(str(_shm_dir() / f"dgl-oac-{self.name}-{uuid.uuid4().hex}") if lead else None,
                                    what=f"NodeEmbedding {self.name!r}: table file names")
        path = paths[g.leader]
        old = getattr(self, "table", None)
        try:
            if lead:
                self.table = map_table(Path(path), self.num_rows, width, create=True)
                fill()
            g.barrier(f"NodeEmbedding {self.name!r}: table filled")
            if not lead:
                self.table = map_table(Path(path), self.num_rows, width, create=False)
            g.barrier(f"NodeEmbedding {self.name!r}: table mapped")
        finally:
            if lead and os.path.exists(path):
                os.unlink(path)  # mapped by every rank (or failed): the memory lives as long as a mapping
        table, self.table = self.table, old
        return table

    def widen(self, state_width: int) -> None:
        """Collective: every rank gets the same new shared table, values copied on each machine, state zeroed."""
        if not self.needs_widening(state_width):
            return
        old = self.table
        self.table = self._shared(self.dim + state_width,
                                  lambda: self.table[:, : self.dim].copy_(old[:, : self.dim]))
        self.state_width = state_width

    def owned(self, lo: int, hi: int) -> torch.Tensor:
        """This rank's rows ``[lo, hi)`` (its partition range), a view of the machine's replica."""
        return self.table[lo:hi]

    def replicate(self) -> None:
        """Collective: rank 0's table (values and optimizer state), which rank 0 alone has just written whole
        (initialisation, ``all_set_embedding``, a checkpoint's tables), into every other machine's replica. One
        machine: nothing to do. Broadcast in chunks of rows straight into the receiving replicas; the ranks that
        do not write a replica receive into a scratch buffer."""
        g = self.group
        if len(g.machines) < 2:
            return
        writes = g.rank == g.leader  # rank 0 (the leader of its machine) sends, the other leaders receive
        step = max(1, REPLICATE_CHUNK // self.table.shape[1])
        scratch = None if writes else torch.empty(min(step, self.num_rows), self.table.shape[1])
        for start in range(0, self.num_rows, step):
            part = self.table[start:start + step]
            g.broadcast(part if writes else scratch[: part.shape[0]],
                        what=f"NodeEmbedding {self.name!r}: rank 0's table to every machine", kind="replication")

