"""Checkpoint and resume: every table row (value ‖ optimizer state), the sparse optimizer's hyperparameters, the
dense modules and optimizers, the loader's position (mid-epoch) and the RNG states, in one file
(format, checksums and atomic writes: :mod:`dgl_oac.ckptfile`).

The small state is a ``torch.save`` section read back with ``weights_only=True`` (a checkpoint never runs
code); tables are streamed in chunks, never pickled or copied whole. A file-backed table (``storage=path``) is
copied rather than referenced: training goes on writing its file after the checkpoint, and a resume must see
the rows as they were. Loading verifies every checksum and checks every name, shape and class before it
changes anything, so a truncated, corrupted or mismatched file raises :class:`CheckpointError` and leaves the
objects untouched.

Resume is exact for sync and oac: the batch stream is a pure function of (seed, epoch, batch index) and the
loader restarts at the saved position, so a resumed run's table equals an uninterrupted run's bit for bit.

Several trainers (tables built after ``init_process_group``): saving and loading are collectives, and no step
runs meanwhile. Each owner writes its own rows of every table (value ‖ optimizer state) to a shard file of its
own, in parallel; then rank 0 writes ``path``: the dense state (equal on every rank: DDP's average), every
rank's RNG state and the loader's position, naming the shards (:mod:`dgl_oac.distributed.shards`: the order
that keeps the checkpoint atomic as a whole). On resume each owner checks its shard and writes its rows (on
several machines, into every machine's replica), every rank restores its own RNG state and position, and the
number of trainers must be the one that saved (the batch stream and the owners depend on it). The folder must
be one every rank sees (on several machines, a shared file system). :meth:`CheckpointReader.table` reassembles
a table from the shards.
"""
from __future__ import annotations

import io
import os
import random
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Union

import numpy as np
import torch

from .ckptfile import CHUNK_BYTES, FORMAT, CheckpointError, CheckpointReader, write_file
from .distributed import shards
from .embedding import NodeEmbedding

PathLike = Union[str, os.PathLike]
Tables = Union[NodeEmbedding, Sequence[NodeEmbedding], Mapping[str, NodeEmbedding]]


# --- save -----------------------------------------------------------------------------------------------------------
def save_checkpoint(path: PathLike, embeddings: Tables, sparse_opt: Any = None,
                    dense_modules: Optional[Mapping[str, torch.nn.Module]] = None,
                    dense_optimizers: Optional[Mapping[str, torch.optim.Optimizer]] = None, loader: Any = None,
                    extra: Optional[Dict[str, Any]] = None) -> Path:
    """Write a checkpoint atomically; returns its path. Call it between steps (after ``opt.step()``).

    embeddings: the dgl_oac.NodeEmbedding objects (or dgl_oac.nn.Embedding modules), or a heterograph's
    ``{ntype: NodeEmbedding}`` (their write-backs are flushed first: every committed step is saved, a batch
    handed out but not stepped is not). ``extra``: plain data (dicts, lists, numbers, strings,
    tensors) returned by :func:`load_checkpoint`. With several trainers every rank calls it; each owner writes its
    rows, rank 0 the rest (module docstring).
    """
    embs = _embeddings(embeddings)
    group = _group(embs)
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"checkpoint path {path} is a directory; pass a file name inside it")
    for emb in embs:
        emb.flush()
    rank_rng = [] if group is None else group.all_gather_object(_rng_state(), what="checkpoint: RNG states")
    meta = {"format": FORMAT, "extra": extra or {}, "rng": _rng_state(), "rank_rng": rank_rng,
            "world_size": 1 if group is None else group.world,
            "loader": None if loader is None else loader.state_dict(),
            "sparse": None if sparse_opt is None else {"class": sparse_opt.class_key(),
                                                        "hyper": dict(sparse_opt.defaults),
                                                        "state_names": list(sparse_opt.state_names),
                                                        "tensor_state": sparse_opt.tensor_state()},
            "dense_modules": {k: m.state_dict() for k, m in (dense_modules or {}).items()},
            "dense_optimizers": {k: o.state_dict() for k, o in (dense_optimizers or {}).items()},
            "embeddings": [{"name": e.name, "num_rows": e.num_embeddings, "dim": e.embedding_dim,
                            "state_width": e.store.state_width} for e in embs]}

    tables = [(e.name, e.store) for e in embs]
    if group is not None:  # each owner's rows in its own shard, written first; the main file names them
        cid = shards.new_id(group)
        _together(group, lambda: shards.save_shard(path, cid, embs, group), "checkpoint: each owner writes its rows")
        meta["shards"], tables = {"id": cid, "world": group.world}, []

    def write() -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        buf = io.BytesIO()
        torch.save(meta, buf)
        write_file(path, memoryview(buf.getbuffer()), tables)

    _together(group, write, "checkpoint: rank 0 writes", lead_only=True)
    if group is not None:
        shards.remove_stale(path, meta["shards"]["id"], group)
        group.barrier("checkpoint: written")
    return path


# --- load -----------------------------------------------------------------------------------------------------------
def load_checkpoint(path: PathLike, embeddings: Tables, sparse_opt: Any = None,
                    dense_modules: Optional[Mapping[str, torch.nn.Module]] = None,
                    dense_optimizers: Optional[Mapping[str, torch.optim.Optimizer]] = None, loader: Any = None,
                    restore_rng: bool = True) -> Dict[str, Any]:
    """Restore what :func:`save_checkpoint` wrote into freshly built objects; returns its ``extra``.

    Build the objects as for the original run (same names, sizes and optimizer classes: the sparse optimizer
    before loading, since it decides the rows' width), then load. Everything is checked first (checksums,
    names, shapes, classes, the number of trainers): on any :class:`CheckpointError` nothing has been changed.
    With several trainers every rank calls it (and raises if the checks fail on any rank).
    """
    embs = _embeddings(embeddings)
    group = _group(embs)
    with CheckpointReader(path) as reader:
        _together(group, reader.verify, "checkpoint: rank 0 verifies", lead_only=True)
        _together(group, lambda: _check_fits(reader, embs, sparse_opt, dense_modules or {}, dense_optimizers or {},
                                             1 if group is None else group.world), "checkpoint: fits")
        owned: List[CheckpointReader] = []
        if reader.meta.get("shards") is not None:
            _together(group, lambda: owned.append(shards.open_shard(reader.path, reader.meta["shards"], embs, group)),
                      "checkpoint: each owner checks its rows")
        try:
            return _restore(reader, owned[0] if owned else None, embs, sparse_opt, dense_modules or {},
                            dense_optimizers or {}, loader, restore_rng, group)
        finally:
            for r in owned:
                r.close()


def _restore(reader: CheckpointReader, shard: Optional[CheckpointReader], embs: List[NodeEmbedding], sparse_opt: Any,
             dense_modules: Mapping[str, torch.nn.Module], dense_optimizers: Mapping[str, Any], loader: Any,
             restore_rng: bool, group: Any) -> Dict[str, Any]:
    meta = reader.meta
    if loader is not None:
        loader.close()  # its epoch's prefetched reads and unstepped batch go
    for emb in embs:
        if not emb.pipeline.idle():
            raise RuntimeError(f"cannot load into NodeEmbedding {emb.name!r} while batches are in flight; close "
                               f"its loader first (or pass it as loader=...), and commit or drop its batches")
    if loader is not None:
        loader.load_state_dict(meta["loader"])
    for emb in embs:
        emb.pipeline.reset()  # waits for write-backs, forgets the write log (it holds rows of the old table)
    if shard is not None:  # several trainers: each owner's rows from its shard
        shards.load_shard(shard, embs, group)
    elif group is None or group.rank == group.leader:  # one file holds the tables: each machine's first rank
        for emb in embs:
            reader._read_into(emb.name, emb.store.table, emb.store.path)
    if shard is None and group is not None:
        group.barrier("checkpoint: the tables are read")
    if sparse_opt is not None:
        sparse_opt.defaults.update(meta["sparse"]["hyper"])
        sparse_opt._check_hyper()
        sparse_opt.load_tensor_state(meta["sparse"].get("tensor_state", {}))
    for k, module in dense_modules.items():
        module.load_state_dict(meta["dense_modules"][k])
    for k, opt in dense_optimizers.items():
        opt.load_state_dict(meta["dense_optimizers"][k])
    if restore_rng:
        _set_rng_state(meta["rng"] if group is None else meta["rank_rng"][group.rank])
    return meta["extra"]


def _check_fits(reader: CheckpointReader, embs: List[NodeEmbedding], sparse_opt: Any,
                dense_modules: Mapping[str, torch.nn.Module], dense_optimizers: Mapping[str, Any],
                world: int) -> None:
    meta, where = reader.meta, f"checkpoint {reader.path}"
    if meta.get("world_size", 1) != world:
        raise CheckpointError(f"{where} was written by {meta.get('world_size', 1)} trainer(s), this run has {world}: "
                              f"resume with the same number (torchrun --nproc_per_node), the batch stream and the "
                              f"rows' owners depend on it")
    for emb in embs:
        info = reader.table_info(emb.name)
        want = (info["num_rows"], info["dim"], info["state_width"])
        have = (emb.num_embeddings, emb.embedding_dim, emb.store.state_width)
        if want != have:
            raise CheckpointError(f"{where}: embedding {emb.name!r} was saved as (rows, dim, state columns) = "
                                  f"{want}, the one given is {have} (attach the same sparse optimizer before "
                                  f"loading)")
    if sparse_opt is not None:
        saved = meta["sparse"]
        if saved is None or saved["class"] != sparse_opt.class_key():
            raise CheckpointError(f"{where} was written with sparse optimizer "
                                  f"{None if saved is None else saved['class']}, not {sparse_opt.class_key()}")
    for kind, given in (("dense_modules", dense_modules), ("dense_optimizers", dense_optimizers)):
        missing = sorted(set(given) - set(meta[kind]))
        if missing:
            raise CheckpointError(f"{where} holds no {kind} {missing} (it holds {sorted(meta[kind])})")
    for k, module in dense_modules.items():
        have = {n: tuple(t.shape) for n, t in module.state_dict().items()}
        want = {n: tuple(t.shape) for n, t in meta["dense_modules"][k].items()}
        if have != want:
            diff = sorted(set(have.items()) ^ set(want.items()))[:4]
            raise CheckpointError(f"{where}: dense module {k!r} does not match the saved one (differs in {diff})")


def _group(embs: List[NodeEmbedding]) -> Any:
    """The trainers' :class:`~dgl_oac.distributed.Group` of distributed tables, None in one process."""
    return embs[0].group if embs else None


def _together(group: Any, fn: Any, what: str, lead_only: bool = False) -> None:
    """Run ``fn()`` (on rank 0 only with ``lead_only``) and decide together: if it fails on any rank, every rank
    raises (the failing one its own error), so no rank is left waiting for the others."""
    if group is None:
        fn()
        return
    error: Optional[BaseException] = None
    if not lead_only or group.rank == 0:
        try:
            fn()
        except Exception as exc:  # noqa: BLE001 - re-raised below, after the ranks agree
            error = exc
    failing = group.ranks_flagging(error is not None, what=what)
    if error is not None:
        raise error
    if failing:
        raise CheckpointError(f"{what} failed on rank(s) {failing} (see their error); rank {group.rank} stops too")


def _embeddings(embeddings: Tables) -> List[NodeEmbedding]:
    if isinstance(embeddings, Mapping):  # a heterograph's {ntype: table}, as the loader takes them
        embeddings = list(embeddings.values())
    embs = [embeddings] if isinstance(embeddings, (NodeEmbedding, torch.nn.Module)) else list(embeddings)
    # a dgl_oac.nn.Embedding stands for its table (found by attribute: this module imports nothing of dgl_oac.nn)
    embs = [e.node_embedding if isinstance(getattr(e, "node_embedding", None), NodeEmbedding) else e for e in embs]
    for e in embs:
        if not isinstance(e, NodeEmbedding):
            raise TypeError(f"checkpoints hold dgl_oac.NodeEmbedding tables, got {type(e).__name__}")
    names = [e.name for e in embs]
    if len(set(names)) != len(names):
        raise ValueError(f"embedding names must be unique in a checkpoint, got {names}")
    return embs


def _rng_state() -> Dict[str, Any]:
    name, keys, pos, has_gauss, gauss = np.random.get_state()
    return {"torch": torch.get_rng_state(), "numpy": (name, torch.from_numpy(keys.astype(np.int64)), pos,
                                                      has_gauss, gauss),
            "python": random.getstate(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []}


def _set_rng_state(state: Dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    name, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    random.setstate(_tuples(state["python"]))
    if state["cuda"] and torch.cuda.is_available() and len(state["cuda"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(state["cuda"])


def _tuples(x: Any) -> Any:
    """random.setstate needs tuples; a round trip may turn them into lists."""
    return tuple(_tuples(v) for v in x) if isinstance(x, (list, tuple)) else x


class Checkpointer:
    """The training driver's checkpoints (``dgl-oac train --checkpoint-dir D --checkpoint-every N --resume``):
    one file, ``D/checkpoint.ckpt``, replaced atomically every N steps, after each epoch and at the end.
    ``progress`` is the driver's own state (curve, counters, the current epoch's losses so far)."""

    FILE = "checkpoint.ckpt"

    def __init__(self, folder: PathLike, every: Optional[int], task: Any) -> None:
        self.path = Path(folder) / self.FILE
        self.every = every
        self.parts = task.checkpoint_parts()  # what the task's checkpoint holds (TaskBase)
        self.saves = 0
        self.resumed_at: Optional[int] = None  # the step the run resumed after (set by the driver)

    def save(self, progress: Dict[str, Any]) -> None:
        """Write the checkpoint now (atomically replacing the previous one), ``progress`` as its ``extra``."""
        save_checkpoint(self.path, extra=progress, **self.parts)
        self.saves += 1

    def after_step(self, steps: int, progress: Any) -> None:
        """Save when ``steps`` is a multiple of ``every``; ``progress`` is a callable (built only then)."""
        if self.every and steps % self.every == 0:
            self.save(progress())

    def resume(self) -> Optional[Dict[str, Any]]:
        """Load the latest checkpoint into the task; its ``progress``, or None when there is none yet."""
        if not self.path.exists():
            return None
        return load_checkpoint(self.path, **self.parts)


__all__ = ["save_checkpoint", "load_checkpoint", "CheckpointReader", "CheckpointError", "Checkpointer", "CHUNK_BYTES"]
