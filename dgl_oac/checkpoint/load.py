"""Resuming from a checkpoint: every check first (the main file, the objects, the table files' sha256), then the
restore; on any :class:`~dgl_oac.checkpoint.CheckpointError` nothing has changed."""
from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional

import torch

from ..embedding import NodeEmbedding
from .collective import Tables, group_of, tables_of, together
from .file import CheckpointReader, PathLike
from .rng import set_rng_state
from .rows import CheckpointError
from .tables import check_files, load_tables


def load_checkpoint(path: PathLike, embeddings: Tables, sparse_opt: Any = None,
                    dense_modules: Optional[Mapping[str, torch.nn.Module]] = None,
                    dense_optimizers: Optional[Mapping[str, torch.optim.Optimizer]] = None, loader: Any = None,
                    restore_rng: bool = True) -> Dict[str, Any]:
    """Restore what :func:`~dgl_oac.checkpoint.save_checkpoint` wrote into freshly built objects; returns its
    ``extra``.

    Build the objects as for the original run (same names, sizes and optimizer classes: the sparse optimizer
    before loading, since it decides the rows' width), then load. Everything is checked first (checksums,
    names, shapes, classes): on any :class:`CheckpointError` nothing has been changed. With several trainers
    every rank calls it (and raises if the checks fail on any rank). Written by another number of trainers: the
    tables reshard; ``restore_rng`` must be False, and a ``loader`` resumes only from the end of an epoch
    (:mod:`dgl_oac.checkpoint`).
    """
    embs = tables_of(embeddings)
    group = group_of(embs)
    world = 1 if group is None else group.world
    readers: List[CheckpointReader] = []
    together(group, lambda: readers.append(CheckpointReader(path)), "checkpoint: every rank reads the main file")
    reader = readers[0]
    where = f"checkpoint {reader.path}"
    together(group, lambda: _check_fits(reader, embs, sparse_opt, dense_modules or {}, dense_optimizers or {},
                                        world, loader, restore_rng), "checkpoint: fits")
    together(group, lambda: check_files(reader.folder, reader.meta["tables"]["files"], embs, group, where),
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
