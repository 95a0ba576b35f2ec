"""Writing a checkpoint: every rank's rows, then rank 0's main file, atomically (the package docstring)."""
from __future__ import annotations

import shutil
import uuid
from pathlib import Path
from typing import Any, Dict, Mapping, Optional

import torch

from .collective import Tables, group_of, tables_of, together
from .file import FORMAT, PathLike, fsync_dir, remove_stale, tables_folder, write_main
from .rng import rng_state
from .tables import save_tables


def save_checkpoint(path: PathLike, embeddings: Tables, sparse_opt: Any = None,
                    dense_modules: Optional[Mapping[str, torch.nn.Module]] = None,
                    dense_optimizers: Optional[Mapping[str, torch.optim.Optimizer]] = None, loader: Any = None,
                    extra: Optional[Dict[str, Any]] = None) -> Path:
    """Write a checkpoint atomically; returns its path. Call it between steps (after ``opt.step()``).

    embeddings: the dgl_oac.NodeEmbedding objects (or dgl_oac.nn.Embedding modules), or a heterograph's
    ``{ntype: NodeEmbedding}`` (their write-backs are flushed first: every committed step is saved, a batch
    handed out but not stepped is not). ``extra``: plain data (dicts, lists, numbers, strings, tensors)
    returned by :func:`~dgl_oac.checkpoint.load_checkpoint`. With several trainers every rank calls it; each
    writes its rows, rank 0 the main file (:mod:`dgl_oac.checkpoint`).
    """
    embs = tables_of(embeddings)
    group = group_of(embs)
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

    together(group, write, "checkpoint: rank 0 writes the main file", lead_only=True)
    return path


def _next_epoch(state: Dict[str, int], loader: Any) -> Optional[int]:
    """The epoch a loader with another number of trainers resumes at: this one when none of its batches is done,
    the next when all are, None mid-epoch."""
    if state["position"] == 0:
        return state["epoch"]
    return state["epoch"] + 1 if hasattr(loader, "__len__") and state["position"] >= len(loader) else None

