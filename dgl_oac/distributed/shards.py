"""Checkpoints of distributed tables: each owner writes its own rows, rank 0 the rest.

A checkpoint of N trainers is N + 1 files (:mod:`dgl_oac.ckptfile`): ``owner r`` writes ``path.<id>.owner<r>of<N>``
(its range of rows of every table, :mod:`.partition`, value ‖ optimizer state, :func:`save_shard`), then rank 0 writes ``path``
(the small state: dense modules and optimizers, every rank's RNG, the loader's position) naming ``<id>``. Each
file is written atomically, and ``path`` last, after every owner has written: a save killed at any moment leaves
``path`` naming the previous checkpoint's shards, which are removed only once the new ``path`` is in place
(:func:`remove_stale`). So a checkpoint is replaced as one, as a single file is.

On load every owner checks its shard (checksums, the checkpoint it belongs to, its rows' count) and writes its
rows into its machine's replica; with several machines it then sends them to the others
(:func:`~dgl_oac.distributed.committer.mirror_rows`, in chunks).
"""
from __future__ import annotations

import io
import uuid
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List

import torch

from ..ckptfile import FORMAT, CheckpointError, CheckpointReader, shard_path, write_file
from .group import Group
from .shared import REPLICATE_CHUNK
from .committer import mirror_rows

if TYPE_CHECKING:
    from ..embedding import NodeEmbedding


class _Owned:
    """An owner's rows of a table, as :func:`~dgl_oac.ckptfile.write_file` streams a store."""

    def __init__(self, table: torch.Tensor, lo: int, hi: int) -> None:
        self.table = table[lo:hi]  # a view: streamed a chunk at a time
        self.num_rows, self.width, self.path = self.table.shape[0], table.shape[1], None


def _info(emb: "NodeEmbedding", group: Group) -> Dict[str, Any]:
    """What a shard records of a table: its name, this owner's row count and the row layout."""
    return {"name": emb.name, "num_rows": emb.pipeline.dist.partition.size_of(group.rank),
            "dim": emb.embedding_dim, "state_width": emb.store.state_width}


def new_id(group: Group) -> str:
    """Collective: one fresh checkpoint id, rank 0's."""
    return group.broadcast_object(uuid.uuid4().hex if group.rank == 0 else None, what="checkpoint: its id")


def save_shard(path: Path, checkpoint_id: str, embs: "List[NodeEmbedding]", group: Group) -> None:
    """Write this owner's rows of every table of ``embs`` to its shard of checkpoint ``checkpoint_id``."""
    meta = {"format": FORMAT, "checkpoint_id": checkpoint_id, "owner": group.rank, "world_size": group.world,
            "embeddings": [_info(e, group) for e in embs]}
    buf = io.BytesIO()
    torch.save(meta, buf)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_file(shard_path(path, checkpoint_id, group.rank, group.world), memoryview(buf.getbuffer()),
               [(e.name, _Owned(e.store.table, *e.pipeline.dist.partition.range_of(group.rank))) for e in embs])


def remove_stale(path: Path, checkpoint_id: str, group: Group) -> None:
    """Remove this owner's shards of earlier checkpoints at ``path`` (``path`` now names ``checkpoint_id``), and
    the temporary file of one a killed save left."""
    keep = shard_path(path, checkpoint_id, group.rank, group.world).name
    for old in path.parent.glob(f"{path.name}.*.owner{group.rank}of*"):
        if old.name != keep:
            try:
                old.unlink()
            except OSError as exc:  # a leftover costs disk, not correctness: the main file names its shards
                warnings.warn(f"could not remove the old checkpoint shard {old}: {exc}", RuntimeWarning)


def open_shard(path: Path, shards: Dict[str, Any], embs: "List[NodeEmbedding]", group: Group) -> CheckpointReader:
    """This owner's shard of the checkpoint whose main file ``path`` names ``shards``, verified and checked
    against ``embs``; raises :class:`CheckpointError` if it is missing, corrupted or belongs elsewhere."""
    part = shard_path(path, shards["id"], group.rank, group.world)
    if not part.is_file():
        raise CheckpointError(f"checkpoint {path}: owner {group.rank}'s rows, {part.name}, are missing (every "
                              f"machine must see the checkpoint's folder)")
    reader = CheckpointReader(part)
    try:
        reader.verify()
        meta = reader.meta
        if (meta.get("checkpoint_id"), meta.get("owner"), meta.get("world_size")) != \
                (shards["id"], group.rank, group.world):
            raise CheckpointError(f"{part} belongs to another checkpoint or owner")
        for e in embs:
            want = _info(e, group)
            if want not in meta["embeddings"]:
                raise CheckpointError(f"{part} holds no rows {want} (it holds {meta['embeddings']})")
    except BaseException:
        reader.close()
        raise
    return reader


def load_shard(reader: CheckpointReader, embs: "List[NodeEmbedding]", group: Group) -> None:
    """Collective: each owner's rows from its shard into its machine's replica, then into the other machines'."""
    for e in embs:
        part = e.pipeline.dist.partition
        lo, hi = part.range_of(group.rank)
        rows = torch.empty(hi - lo, e.store.width)
        reader._read_into(e.name, rows, None)
        e.store.table[lo:hi] = rows
        if len(group.machines) > 1:
            ids = torch.arange(lo, hi)
            step = max(1, REPLICATE_CHUNK // e.store.width)
            most = max(part.size_of(r) for r in range(group.world))
            for start in range(0, most, step):  # as many on every rank
                mirror_rows(group, e.store, ids[start:start + step], rows[start:start + step],
                            f"checkpoint: owners' rows of {e.name!r} to the other machines")
    group.barrier("checkpoint: every owner's rows are in every replica")
