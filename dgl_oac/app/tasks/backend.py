"""Build the embedding, sparse optimizer and loader for a mode: dgl-oac's (sync/async/oac) or plain DGL's.

Plain DGL (``mode="dgl"``: ``dgl.nn.NodeEmbedding`` + ``dgl.optim`` + ``dgl.dataloading.DataLoader``) is the
baseline a user has today. Task code reads rows with ``emb(input_nodes, device)``, which both backends serve
(dgl-oac returns the batch's validated rows), so one training step runs unchanged on either. DGL is imported
only where a mode or a loader needs it: the KG task's edge batches run without it (:func:`make_edge_loader`).
"""
from __future__ import annotations

import os
from typing import Any, Callable, Optional, Tuple

import torch

import dgl_oac
from dgl_oac.distributed import current_group
from dgl_oac.needs_dgl import require_dgl
from dgl_oac.sampling.edge_batch import EdgeBatches, EdgeBatchMaker

BACKEND_MODES = ("sync", "async", "oac", "dgl")
_DGL_EMBEDDINGS = 0
OPTIMIZERS = ("sgd", "adagrad", "adam", "rowwise_adagrad")


def make_embedding(mode: str, num: int, dim: int, name: str, init: Callable[[torch.Tensor], torch.Tensor],
                   storage: str = "memory", sharding: str = "replicated") -> Any:
    if mode == "dgl":
        import dgl

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
        import dgl

        if name in ("sgd", "rowwise_adagrad"):
            raise ValueError(f"dgl.optim has no sparse {name}; use --optimizer adagrad or adam with --mode dgl")
        return (dgl.optim.SparseAdagrad if name == "adagrad" else dgl.optim.SparseAdam)(embs, lr=lr)
    cls = {"sgd": dgl_oac.SparseSGD, "adagrad": dgl_oac.SparseAdagrad, "adam": dgl_oac.SparseAdam,
           "rowwise_adagrad": dgl_oac.SparseRowWiseAdagrad}[name]
    return cls(embs, lr=lr)


def make_loader(cfg: Any, graph: Any, indices: torch.Tensor, sampler: Any, embs: list,
                device: torch.device, shuffle: bool = True) -> Any:
    """The training loader of ``cfg.mode`` (a :class:`~dgl_oac.app.tasks.common.TrainConfig`); with several trainers
    (:mod:`dgl_oac.app.tasks.launch`) each takes its block of ``indices`` (``use_ddp``)."""
    if cfg.mode == "dgl":
        import dgl

        return dgl.dataloading.DataLoader(graph, indices, sampler, device=device, batch_size=cfg.batch_size,
                                          shuffle=shuffle, drop_last=False)
    return dgl_oac.DataLoader(graph, indices, sampler, embeddings=embs, mode=cfg.mode, device=device,
                              batch_size=cfg.batch_size, shuffle=shuffle, seed=cfg.seed, prefetch=cfg.prefetch,
                              background_priority=cfg.background_priority, num_workers=cfg.num_workers,
                              staleness=cfg.staleness, use_ddp=current_group() is not None)


def has_dgl() -> bool:
    """Whether DGL imports here (the KG task then runs on DGL's loader: several trainers, checkpoints)."""
    try:
        import dgl  # noqa: F401
    except ImportError:
        return False
    return True


def make_edge_loader(cfg: Any, ds: Any, maker: EdgeBatchMaker, embs: list, device: torch.device) -> Tuple[Any, Any]:
    """``(loader, sampler)`` over the edges of a KG dataset ``ds``: with DGL, :func:`make_loader` over DGL's
    :class:`~dgl_oac.dgl_frontend.sampling.edge.EdgeBatchSampler`; without, :class:`dgl_oac.BatchLoader` over
    :class:`~dgl_oac.sampling.edge_batch.EdgeBatches` made by ``maker``: the same batches (same seeds), one
    trainer, no loader position to checkpoint. ``sampler.unpack`` reads a batch's negatives either way."""
    if cfg.mode == "dgl" or has_dgl():
        from dgl_oac.dgl_frontend.sampling.edge import EdgeBatchSampler

        sampler = EdgeBatchSampler(maker.negative_sampler, materialize_negatives=maker.materialize_negatives)
        indices = torch.arange(ds.train.shape[0], dtype=torch.int64)
        return make_loader(cfg, ds.graph, indices, sampler, embs, device), sampler
    needs = [what for what, asked in (("several trainers", current_group() is not None),
                                      ("checkpoints", bool(cfg.checkpoint_dir)), ("--staleness", cfg.staleness),
                                      ("--num-workers", cfg.num_workers)) if asked]
    if needs:  # BatchLoader: one process, no position to save, no staleness rule, no sampling processes
        require_dgl(f"--task kg with {', '.join(needs)} (dgl_oac.DataLoader)")
    batches = EdgeBatches(ds.edge_list, maker, cfg.batch_size, cfg.seed)
    loader = dgl_oac.BatchLoader(batches, ids={embs[0]: _input_nodes}, mode=cfg.mode, device=device,
                                 prefetch=cfg.prefetch, seed=cfg.seed, background_priority=cfg.background_priority)
    return loader, maker


def _input_nodes(batch: Tuple[Any, ...]) -> torch.Tensor:
    return batch[0]


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


def ours(loader: Any) -> bool:
    """Whether ``loader`` is dgl-oac's (DataLoader or BatchLoader), not DGL's."""
    return type(loader).__module__.startswith("dgl_oac.")


def close(loader: Any, embs: list) -> None:
    if ours(loader):
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
    return loader.stats.as_dict() if ours(loader) else None
