"""Checkpoint and resume: every table row (value ‖ optimizer state), the sparse optimizer's hyperparameters, the
dense modules and optimizers, the loader's position (mid-epoch) and the RNG states.

A checkpoint is a main file naming a folder of tables (:mod:`dgl_oac.checkpoint.file`). The tables go through
``torch.distributed.checkpoint`` (:mod:`dgl_oac.checkpoint.tables`): each rank writes its own rows, streamed in chunks,
never pickled or copied whole (a file-backed table, ``storage=path``, is copied rather than referenced: training
goes on writing its file). The small state is a ``torch.save`` payload of the main file, read back with
``weights_only=True`` (a checkpoint never runs code). The main file is written last, atomically, so a save killed
at any moment leaves the previous checkpoint whole. Loading checks the main file, the objects, and the sha256 of
every table file it reads before it changes anything, so a truncated, corrupted or mismatched checkpoint raises
:class:`CheckpointError` naming what is wrong (a table file and the rank that wrote it) and leaves the objects
untouched.

Resume is exact for sync and oac: the batch stream is a pure function of (seed, epoch, batch index) and the
loader restarts at the saved position, so a resumed run's table equals an uninterrupted run's bit for bit.

Several trainers (tables built after ``init_process_group``): saving and loading are collectives on the tables'
gloo group, and no step runs meanwhile. Rank 0 writes the main file: the dense state (equal on every rank:
DDP's average), every rank's RNG state and the loader's position. The folder must be one every rank sees (on
several machines, a shared file system).

Another number of trainers (written by N, loaded by M): the tables reshard (each rank loads the rows it holds
now), and the sparse optimizer, the dense modules and optimizers and ``extra`` are restored. What cannot carry
over is refused with a :class:`CheckpointError` rather than silently changed: each trainer's RNG state (pass
``restore_rng=False`` and seed the RNGs), and a mid-epoch loader position (N and M trainers split an epoch's
batches differently; a checkpoint saved at the end of an epoch resumes the loader at the next epoch's start).
"""
from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Union

import torch

from ..embedding import NodeEmbedding
from .file import FORMAT, CheckpointReader, fsync_dir, remove_stale, tables_folder, write_main
from .rng import rng_state, set_rng_state
from .tables import CheckpointError, check_files, load_tables, save_tables

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
    tensors) returned by :func:`load_checkpoint`. With several trainers every rank calls it; each writes its
    rows, rank 0 the main file (module docstring).
    """
    embs = _embeddings(embeddings)
    group = _group(embs)
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"checkpoint path {path} is a directory; pass a file name inside it")
    for emb in embs:
        emb.flush()
    rank_rng = [rng_state()] if group is None else group.all_gather_object(rng_state(), what="checkpoint: RNGs")
    cid = uuid.uuid4().hex
    folder = tables_folder(path, cid if group is None else group.broadcast_object(cid, what="checkpoint: its id"))
    lead = group is None or group.rank == 0
    try:
        files = save_tables(folder, embs, group)  # a collective: every rank's rows, then every file's sha256
    except BaseException:
        if lead:
            shutil.rmtree(folder, ignore_errors=True)
        raise
    state = None if loader is None else loader.state_dict()
    meta = {"format": FORMAT, "extra": extra or {}, "rank_rng": rank_rng, "world_size": len(rank_rng),
            "loader": state, "loader_next_epoch": None if state is None else _next_epoch(state, loader),
            "sparse": None if sparse_opt is None else {"class": sparse_opt.class_key(),
                                                        "hyper": dict(sparse_opt.defaults),
                                                        "state_names": list(sparse_opt.state_names),
                                                        "tensor_state": sparse_opt.tensor_state()},
            "dense_modules": {k: m.state_dict() for k, m in (dense_modules or {}).items()},
            "dense_optimizers": {k: o.state_dict() for k, o in (dense_optimizers or {}).items()},
            "embeddings": [{"name": e.name, "num_rows": e.num_embeddings, "dim": e.embedding_dim,
                            "state_width": e.store.state_width} for e in embs],
            "tables": {"folder": folder.name, "files": files}}

    def write() -> None:
        try:
            fsync_dir(folder)  # the files' names are durable before the main file names the folder
            write_main(path, meta)
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise
        remove_stale(path, folder)

    _together(group, write, "checkpoint: rank 0 writes the main file", lead_only=True)
    return path


def _next_epoch(state: Dict[str, int], loader: Any) -> Optional[int]:
    """The epoch a loader with another number of trainers resumes at: this one when none of its batches is done,
    the next when all are, None mid-epoch."""
    if state["position"] == 0:
        return state["epoch"]
    return state["epoch"] + 1 if hasattr(loader, "__len__") and state["position"] >= len(loader) else None


# --- load -----------------------------------------------------------------------------------------------------------
def load_checkpoint(path: PathLike, embeddings: Tables, sparse_opt: Any = None,
                    dense_modules: Optional[Mapping[str, torch.nn.Module]] = None,
                    dense_optimizers: Optional[Mapping[str, torch.optim.Optimizer]] = None, loader: Any = None,
                    restore_rng: bool = True) -> Dict[str, Any]:
    """Restore what :func:`save_checkpoint` wrote into freshly built objects; returns its ``extra``.

    Build the objects as for the original run (same names, sizes and optimizer classes: the sparse optimizer
    before loading, since it decides the rows' width), then load. Everything is checked first (checksums,
    names, shapes, classes): on any :class:`CheckpointError` nothing has been changed. With several trainers
    every rank calls it (and raises if the checks fail on any rank). Written by another number of trainers: the
    tables reshard; ``restore_rng`` must be False, and a ``loader`` resumes only from the end of an epoch
    (module docstring).
    """
    embs = _embeddings(embeddings)
    group = _group(embs)
    world = 1 if group is None else group.world
    readers: List[CheckpointReader] = []
    _together(group, lambda: readers.append(CheckpointReader(path)), "checkpoint: every rank reads the main file")
    reader = readers[0]
    where = f"checkpoint {reader.path}"
    _together(group, lambda: _check_fits(reader, embs, sparse_opt, dense_modules or {}, dense_optimizers or {},
                                         world, loader, restore_rng), "checkpoint: fits")
    _together(group, lambda: check_files(reader.folder, reader.meta["tables"]["files"], embs, group, where),
              "checkpoint: each rank checks the files it reads")
    return _restore(reader, embs, sparse_opt, dense_modules or {}, dense_optimizers or {}, loader, restore_rng,
                    group)


def _restore(reader: CheckpointReader, embs: List[NodeEmbedding], sparse_opt: Any,
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
        state = meta["loader"]
        if meta["world_size"] != (1 if group is None else group.world):  # resharded: from an epoch's start
            state = {**state, "epoch": meta["loader_next_epoch"], "position": 0}
        loader.load_state_dict(state)
    for emb in embs:
        emb.pipeline.reset()  # waits for write-backs, forgets the write log (it holds rows of the old table)
    load_tables(reader.folder, embs, group)  # a collective; every rank's rows are in place when it returns
    if sparse_opt is not None:
        sparse_opt.defaults.update(meta["sparse"]["hyper"])
        sparse_opt._check_hyper()
        sparse_opt.load_tensor_state(meta["sparse"].get("tensor_state", {}))
    for k, module in dense_modules.items():
        module.load_state_dict(meta["dense_modules"][k])
    for k, opt in dense_optimizers.items():
        opt.load_state_dict(meta["dense_optimizers"][k])
    if restore_rng:
        set_rng_state(meta["rank_rng"][0 if group is None else group.rank])
    return meta["extra"]


def _check_fits(reader: CheckpointReader, embs: List[NodeEmbedding], sparse_opt: Any,
                dense_modules: Mapping[str, torch.nn.Module], dense_optimizers: Mapping[str, Any],
                world: int, loader: Any, restore_rng: bool) -> None:
    meta, where = reader.meta, f"checkpoint {reader.path}"
    saved = meta["world_size"]
    if saved != world and restore_rng:
        raise CheckpointError(f"{where} was written by {saved} trainer(s), this run has {world}: its tables reshard, "
                              f"but each trainer's RNG state cannot be carried to another number of trainers; "
                              f"resume with {saved} (torchrun --nproc_per_node), or load with restore_rng=False "
                              f"and seed the RNGs yourself")
    if loader is not None and meta["loader"] is None:
        raise CheckpointError(f"{where} holds no loader position (it was saved without loader=)")
    if saved != world and loader is not None and meta["loader_next_epoch"] is None:
        raise CheckpointError(f"{where} was saved mid-epoch (epoch {meta['loader']['epoch']}, "
                              f"{meta['loader']['position']} batches done) by {saved} trainer(s), this run has "
                              f"{world}: another number of trainers splits an epoch's batches differently, so the "
                              f"loader cannot resume there; resume with {saved}, from a checkpoint saved at the end "
                              f"of an epoch, or load without loader=")
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


class Checkpointer:
    """The training driver's checkpoints (``dgl-oac train --checkpoint-dir D --checkpoint-every N --resume``):
    ``D/checkpoint.ckpt`` (and the tables folder it names), replaced atomically every N steps, after each epoch
    and at the end.
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


__all__ = ["save_checkpoint", "load_checkpoint", "CheckpointReader", "CheckpointError", "Checkpointer"]
