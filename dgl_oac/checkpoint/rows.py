"""Which rows of a table each rank writes and reads in a checkpoint, as ``torch.distributed.checkpoint`` plans.

Each table is one logical tensor ``float32[N, D + S]`` (value ‖ optimizer state) named by the table. On save every
rank contributes its own rows (``emb._owned_rows()``: its range of the row partition, the whole table in one
process) in chunks of at most :data:`CHUNK_BYTES` (:class:`TableSavePlanner`). On load each rank asks for a range
of rows (:func:`load_target`) and DCP reads the saved chunks that overlap it, whatever number of ranks wrote them
(:class:`TableLoadPlanner`, DCP's ``create_read_items_for_chunk_list``):

- a sharded table (``sharding="rows"``: this rank holds only its rows): its own range of the current partition;
- a table every machine holds whole (the replicated layout; one process): an even split of the table among the
  machine's ranks, so every machine's replica gets every row from the files and no row crosses the network.

Memory: a memory table is written from its own memory (a zero-copy view whose storage is exactly the chunk, which
DCP does not clone) and read into it in place; a file-backed table (``storage=path``, possibly larger than RAM) is
read with ``pread`` from its file and written with ``pwrite``, never through its map, so save and load add a
chunk or two to the process, not the table. :class:`CheckpointError` lives here, the lowest checkpoint module.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, List, Optional

import torch
from torch.distributed.checkpoint.default_planner import create_default_global_save_plan
from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, Metadata, MetadataIndex, TensorProperties
from torch.distributed.checkpoint.planner import (LoadPlan, LoadPlanner, ReadItem, SavePlan, SavePlanner,
                                                  TensorWriteData, WriteItem, WriteItemType)
from torch.distributed.checkpoint.planner_helpers import create_read_items_for_chunk_list

from ..distributed.group import Group
from ..distributed.partition import RowPartition

if TYPE_CHECKING:
    from ..embedding import NodeEmbedding

#: rows move in chunks of this size, one file each: it bounds what save and load add to the process. DCP reads a
#: chunk through torch.load (the file's record, then a tensor) and freed blocks of that size linger in the
#: allocator: loading a 256 MB file-backed table raised peak RSS by 145 MB with 16 MiB chunks, 33 MB with 4 MiB.
CHUNK_BYTES = 4 << 20


class CheckpointError(ValueError):
    """A checkpoint that is truncated, corrupted, not a checkpoint, or does not fit the objects."""


class RowBlock:
    """Rows ``[lo, lo + len(rows))`` of table ``name`` (``num_rows`` rows of ``rows.shape[1]`` floats) on this
    rank. ``file``: the table's file when it is file-backed; it holds exactly ``rows``, which are then read and
    written there, not through the map."""

    def __init__(self, name: str, num_rows: int, lo: int, rows: torch.Tensor, file: Optional[Path]) -> None:
        if not rows.is_contiguous():
            raise ValueError(f"table {name!r}: a rank's rows must be one contiguous block")
        self.name, self.num_rows, self.lo, self.rows, self.file = name, num_rows, lo, rows, file
        self.width = rows.shape[1]

    def chunks(self, most_bytes: Optional[int] = None) -> List[ChunkStorageMetadata]:
        """The rows as chunks of at most ``most_bytes`` (one chunk without)."""
        n = self.rows.shape[0]
        step = n if most_bytes is None else max(1, most_bytes // (self.width * 4))
        return [ChunkStorageMetadata(torch.Size([self.lo + a, 0]), torch.Size([min(step, n - a), self.width]))
                for a in range(0, n, max(step, 1))]

    def read(self, start: int, n: int) -> torch.Tensor:
        """Rows ``[start, start + n)`` as a tensor whose storage is exactly those rows (DCP clones any other)."""
        nbytes, offset = n * self.width * 4, (start - self.lo) * self.width * 4
        if self.file is None:
            flat = memoryview(self.rows.numpy()).cast("B")
            return torch.frombuffer(flat[offset:offset + nbytes], dtype=torch.float32).view(n, self.width)
        buf = bytearray(nbytes)
        with open(self.file, "rb", buffering=0) as f:
            view, done = memoryview(buf), 0
            while done < nbytes:
                got = os.preadv(f.fileno(), [view[done:]], offset + done)
                if not got:
                    raise CheckpointError(f"table file {self.file} ends before row {start + n}")
                done += got
        return torch.frombuffer(buf, dtype=torch.float32).view(n, self.width)

    def target(self, start: int, n: int) -> torch.Tensor:
        """Where DCP copies rows ``[start, start + n)``: the table itself, or a buffer :meth:`commit` writes."""
        if self.file is None:
            return self.rows[start - self.lo:start - self.lo + n]
        return torch.empty(n, self.width)

    def commit(self, start: int, rows: torch.Tensor) -> None:
        if self.file is None:
            return
        data, offset = memoryview(rows.numpy()).cast("B"), (start - self.lo) * self.width * 4
        fd = os.open(self.file, os.O_WRONLY)
        try:
            done = 0
            while done < len(data):
                done += os.pwrite(fd, data[done:], offset + done)
        finally:
            os.close(fd)


def own_rows(emb: "NodeEmbedding") -> RowBlock:
    """What this rank saves of ``emb``: its own rows."""
    lo, rows = emb._owned_rows()
    return RowBlock(emb.name, emb.num_embeddings, lo, rows, emb.store.path)


def load_target(emb: "NodeEmbedding", group: Optional[Group]) -> RowBlock:
    """The rows this rank loads of ``emb`` (see the module docstring) and where they go."""
    if group is None:
        return RowBlock(emb.name, emb.num_embeddings, 0, emb.store.table, emb.store.path)
    if emb.sharded:  # sharding="rows": the table holds this rank's rows only
        lo, rows = emb._owned_rows()
        return RowBlock(emb.name, emb.num_embeddings, lo, rows, None)
    ranks = group.machines[group.machine]  # the machine's replica, split among its ranks
    lo, hi = RowPartition(emb.num_embeddings, len(ranks)).range_of(ranks.index(group.rank))
    return RowBlock(emb.name, emb.num_embeddings, lo, emb.store.table[lo:hi], None)


class TableSavePlanner(SavePlanner):
    """Each rank writes its rows of every table as chunks of one logical ``float32[N, D + S]`` tensor."""

    def __init__(self, parts: List[RowBlock]) -> None:
        self.parts = {p.name: p for p in parts}

    def set_up_planner(self, state_dict: Any, storage_meta: Any = None, is_coordinator: bool = False) -> None:
        pass  # the tables are the planner's own, not a state dict

    def create_local_plan(self) -> SavePlan:
        return SavePlan([WriteItem(index=MetadataIndex(p.name, c.offsets), type=WriteItemType.SHARD,
                                   tensor_data=TensorWriteData(chunk=c, properties=TensorProperties(torch.float32),
                                                               size=torch.Size([p.num_rows, p.width])))
                         for p in self.parts.values() for c in p.chunks(CHUNK_BYTES)])

    def create_global_plan(self, all_plans: List[SavePlan]) -> Any:
        return create_default_global_save_plan(all_plans)

    def finish_plan(self, new_plan: SavePlan) -> SavePlan:
        return new_plan

    def resolve_data(self, write_item: WriteItem) -> torch.Tensor:
        chunk = write_item.tensor_data.chunk
        return self.parts[write_item.index.fqn].read(chunk.offsets[0], chunk.sizes[0])


class TableLoadPlanner(LoadPlanner):
    """Each rank reads its range of rows of every table (:func:`load_target`) from the chunks that hold them."""

    def __init__(self, parts: List[RowBlock]) -> None:
        self.parts = {p.name: p for p in parts}

    def set_up_planner(self, state_dict: Any, metadata: Optional[Metadata] = None,
                       is_coordinator: bool = False) -> None:
        self.metadata = metadata

    def create_local_plan(self) -> LoadPlan:
        return LoadPlan([item for p in self.parts.values() if p.rows.shape[0]
                         for item in read_items(self.metadata, p)])

    def create_global_plan(self, global_plan: List[LoadPlan]) -> List[LoadPlan]:
        return global_plan

    def finish_plan(self, central_plan: LoadPlan) -> LoadPlan:
        return central_plan

    def load_bytes(self, read_item: ReadItem, value: Any) -> None:
        raise CheckpointError(f"a checkpoint's tables hold no objects, found {read_item.dest_index.fqn!r}")

    def _start(self, item: ReadItem) -> int:
        return item.dest_index.offset[0] + item.dest_offsets[0]

    def resolve_tensor(self, read_item: ReadItem) -> torch.Tensor:
        return self.parts[read_item.dest_index.fqn].target(self._start(read_item), read_item.lengths[0])

    def commit_tensor(self, read_item: ReadItem, tensor: torch.Tensor) -> None:
        self.parts[read_item.dest_index.fqn].commit(self._start(read_item), tensor)


def read_items(md: Metadata, part: RowBlock) -> List[ReadItem]:
    saved = md.state_dict_metadata.get(part.name)
    if saved is None:
        raise CheckpointError(f"the checkpoint's tables hold no table {part.name!r} (they hold "
                              f"{sorted(md.state_dict_metadata)})")
    if tuple(saved.size) != (part.num_rows, part.width):
        raise CheckpointError(f"table {part.name!r} was saved as {tuple(saved.size)}, the one given is "
                              f"{(part.num_rows, part.width)}")
    return create_read_items_for_chunk_list(part.name, saved, part.chunks())
