"""Build the embedding, sparse optimizer and loader for a mode: dgl-oac's (sync/async/oac) or plain DGL's.

Plain DGL (``mode="dgl"``: ``dgl.nn.NodeEmbedding`` + ``dgl.optim`` + ``dgl.dataloading.DataLoader``) is the
baseline a user has today. Task code reads rows with ``emb(input_nodes, device)``, which both backends serve
(dgl-oac returns the batch's validated rows), so one training step runs unchanged on either.
"""
from __future__ import annotations

import os
from typing import Any, Callable, Optional, Tuple

import dgl
import torch

import dgl_oac
from dgl_oac.distributed import current_group

BACKEND_MODES = ("sync", "async", "oac", "dgl")
_DGL_EMBEDDINGS = 0
OPTIMIZERS = ("sgd", "adagrad", "adam", "rowwise_adagrad")


def make_embedding(mode: str, num: int, dim: int, name: str, init: Callable[[torch.Tensor], torch.Tensor],
                   storage: str = "memory", sharding: str = "replicated") -> Any:
    if mode == "dgl":
        # DGL names a shared-memory segment after the embedding: keep it unique per process and call
        global _DGL_EMBEDDINGS
        _DGL_EMBEDDINGS += 1
        return dgl.nn.NodeEmbedding(num, dim, f"{name}_{os.getpid()}_{_DGL_EMBEDDINGS}", init_func=init)
    if sharding != "replicated" and mode != "dgl" and current_group() is not None:
        # every owner draws its own rows: make the tables equal to the replicated layout's (rank 0's draw)
        emb = dgl_oac.NodeEmbedding(num, dim, name, storage=storage, sharding=sharding)
        emb.all_set_embedding(init(torch.empty(num, dim)) if current_group().rank == 0 else torch.empty(num, dim))
        return emb
    return dgl_oac.NodeEmbedding(num, dim, name, init_func=init, storage=storage, sharding=sharding)


def make_sparse_optimizer(mode: str, name: str, embs: list, lr: float) -> Any:
    if name not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {name!r}: expected one of {', '.join(OPTIMIZERS)}")
    if mode == "dgl":
        if name in ("sgd", "rowwise_adagrad"):
            raise ValueError(f"dgl.optim has no sparse {name}; use --optimizer adagrad or adam with --mode dgl")
        return (dgl.optim.SparseAdagrad if name == "adagrad" else dgl.optim.SparseAdam)(embs, lr=lr)
    cls = {"sgd": dgl_oac.SparseSGD, "adagrad": dgl_oac.SparseAdagrad, "adam": dgl_oac.SparseAdam,
           "rowwise_adagrad": dgl_oac.SparseRowWiseAdagrad}[name]
    return cls(embs, lr=lr)


def make_loader(cfg: Any, graph: dgl.DGLGraph, indices: torch.Tensor, sampler: Any, embs: list,
                device: torch.device, shuffle: bool = True) -> Any:
    """The training loader of ``cfg.mode`` (a :class:`~dgl_oac.app.tasks.common.TrainConfig`); with several trainers
    (:mod:`dgl_oac.app.tasks.launch`) each takes its block of ``indices`` (``use_ddp``)."""
    if cfg.mode == "dgl":
        return dgl.dataloading.DataLoader(graph, indices, sampler, device=device, batch_size=cfg.batch_size,
                                          shuffle=shuffle, drop_last=False)
    return dgl_oac.DataLoader(graph, indices, sampler, embeddings=embs, mode=cfg.mode, device=device,
                              batch_size=cfg.batch_size, shuffle=shuffle, seed=cfg.seed, prefetch=cfg.prefetch,
                              background_priority=cfg.background_priority, num_workers=cfg.num_workers,
                              staleness=cfg.staleness, use_ddp=current_group() is not None)


def table_of(emb: Any, chunk: int = 1 << 20) -> torch.Tensor:
    """The full ``float32[N, D]`` table of either backend's embedding (CPU); a sharded table's rows are read
    from their owners (this rank alone: rank 0 evaluates while the others wait)."""
    if not getattr(emb, "sharded", False):
        return emb.weight
    out = torch.empty(emb.num_embeddings, emb.embedding_dim)
    with torch.no_grad():
        for lo in range(0, emb.num_embeddings, chunk):
            ids = torch.arange(lo, min(lo + chunk, emb.num_embeddings))
            out[lo:lo + ids.numel()] = emb(ids)
    return out


def close(loader: Any, embs: list) -> None:
    if isinstance(loader, dgl_oac.DataLoader):
        loader.close()
    for e in embs:
        if isinstance(e, dgl_oac.NodeEmbedding):
            e.close()


def rows_per_batch(batch: Tuple[Any, ...]) -> int:
    ids = batch[0]  # a heterograph's input_nodes: {ntype: ids}
    return int(sum(v.numel() for v in ids.values())) if isinstance(ids, dict) else int(ids.numel())


def step_sparse(opt: Any) -> None:
    # dgl.optim collects the traced gradients at step() and clears the trace there only if zero_grad() was
    # called first; after step() it would re-apply this batch at the next step. A no-op for dgl-oac.
    opt.zero_grad()
    opt.step()


def loader_stats(loader: Any) -> Optional[dict]:
    return loader.stats.as_dict() if isinstance(loader, dgl_oac.DataLoader) else None
