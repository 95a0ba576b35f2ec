"""Per-task (and, for ``--task kg``, per-model) defaults of the ``dgl-oac train`` options left unset (None).

The KG recipe (256 columns, sampled softmax over 1024 shared negatives, N3 0.05, Adagrad 0.1) with ComplEx
reaches filtered test MRR 0.327 on FB15k-237 in 10 epochs (benchmarks/QUALITY.md, 2026-11-23); DistMult gets
the same settings (not measured), TransE no N3. Node and link keep the small GraphSAGE settings (hetero-node: the same for its R-GCN) that the
default ``dgl-oac train`` runs in seconds.
"""
from __future__ import annotations

from typing import Any, Dict

#: options whose default depends on the task; None in TrainConfig means "the task's default"
TASK_DEFAULTS: Dict[str, Dict[str, Any]] = {
    "node": {"model": "sage", "dim": 64, "negatives": 64, "lr": 0.05, "dense_lr": 0.01, "optimizer": "adam",
             "reg_weight": 0.0},
    "link": {"model": "sage", "dim": 64, "negatives": 64, "lr": 0.05, "dense_lr": 0.01, "optimizer": "adam",
             "reg_weight": 0.0},
    "hetero-node": {"model": "rgcn", "dim": 64, "negatives": 64, "lr": 0.05, "dense_lr": 0.01,
                    "optimizer": "adam", "reg_weight": 0.0},
    "kg": {"model": "complex", "dim": 256, "negatives": 1024, "lr": 0.1, "dense_lr": 0.1, "optimizer": "adagrad",
           "reg_weight": 0.05},
}
#: --task kg: what differs from TASK_DEFAULTS["kg"] per --model (TransE: no N3 on translations' distances)
KG_MODEL_DEFAULTS: Dict[str, Dict[str, Any]] = {"complex": {}, "distmult": {}, "transe": {"reg_weight": 0.0}}


def task_defaults(task: str, model: Any = None) -> Dict[str, Any]:
    """The defaults of ``--task task`` (with ``--model model`` for kg; None: the task's default model)."""
    if task not in TASK_DEFAULTS:
        raise ValueError(f"unknown task {task!r}: expected one of {', '.join(TASK_DEFAULTS)}")
    out = dict(TASK_DEFAULTS[task])
    if task == "kg":
        out.update(KG_MODEL_DEFAULTS.get(model or out["model"], {}))
    return out


def resolve_defaults(cfg: Any) -> Any:
    """Fill ``cfg``'s unset (None) per-task options from :func:`task_defaults` in place and return ``cfg``;
    options given explicitly are kept."""
    for name, value in task_defaults(cfg.task, cfg.model).items():
        if getattr(cfg, name) is None:
            setattr(cfg, name, value)
    return cfg


def describe(name: str) -> str:
    """``--help`` text of an option's per-task defaults, e.g. ``node 64, link 64, kg 256``."""
    parts = [f"{task} {d[name]}" for task, d in TASK_DEFAULTS.items()]
    parts += [f"kg --model {m} {d[name]}" for m, d in KG_MODEL_DEFAULTS.items() if name in d]
    return ", ".join(parts)
