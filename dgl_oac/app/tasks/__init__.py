"""Training tasks behind ``dgl-oac train``: one module per task, one shared driver."""
from __future__ import annotations

from typing import Any, Dict

from ...distributed import current_group
from ...needs_dgl import require_dgl
from .common import TrainConfig, check_config, run
from .defaults import resolve_defaults, task_defaults

TASK_NAMES = ("node", "link", "kg", "hetero-node")
#: tasks that train on DGL's graphs and samplers (the KG task's edge batches need no DGL)
DGL_TASKS = ("node", "link", "hetero-node")


def build_task(cfg: TrainConfig) -> Any:
    """Load the dataset and build the task object for ``cfg.task``."""
    from ..data import load

    if cfg.task not in TASK_NAMES:
        raise ValueError(f"unknown task {cfg.task!r}: expected one of {', '.join(TASK_NAMES)}")
    resolve_defaults(cfg)
    check_config(cfg)
    if cfg.task in DGL_TASKS:
        require_dgl(f"dgl-oac train --task {cfg.task}")
    elif cfg.mode == "dgl":
        require_dgl("dgl-oac train --mode dgl")
    kwargs: Dict[str, Any] = dict(cfg.extra)
    if cfg.dataset in ("synthetic", "synthetic-mag"):
        if cfg.dataset == "synthetic":
            kwargs.setdefault("task", cfg.task)
        kwargs.setdefault("seed", cfg.seed)
        if cfg.num_nodes:
            kwargs["num_nodes"] = cfg.num_nodes
    group = current_group()  # several trainers: rank 0 loads first (it may fill a cache the others then read)
    if group is not None and group.rank != 0:
        group.barrier("rank 0 loads the dataset")
    ds = load(cfg.dataset, root=cfg.root, **kwargs)
    if group is not None and group.rank == 0:
        group.barrier("rank 0 loads the dataset")
    import torch

    torch.manual_seed(cfg.seed)  # --seed fixes the model initialisation too, whatever ran before in the process
    if cfg.task == "node":
        from .node import NodeTask
        return NodeTask(cfg, ds)
    if cfg.task == "hetero-node":
        from .hetero import HeteroNodeTask
        return HeteroNodeTask(cfg, ds)
    if cfg.task == "link":
        from .link import LinkTask
        return LinkTask(cfg, ds)
    from .kg import KGTask
    return KGTask(cfg, ds)


def train(cfg: TrainConfig) -> Dict[str, Any]:
    """Build the task for ``cfg`` and train it; returns the JSON-able summary."""
    return run(cfg, build_task(cfg))


__all__ = ["TrainConfig", "train", "build_task", "resolve_defaults", "task_defaults", "TASK_NAMES", "DGL_TASKS"]
