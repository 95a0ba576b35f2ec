"""Defaults of the ``dgl-oac train`` options left unset (None): per task, per ``--model`` for ``--task kg``, and
per ``(task, dataset)`` where a dataset has a recipe of its own.

The KG recipe (256 columns, sampled softmax over 1024 shared negatives, N3 0.05, Adagrad 0.1) with ComplEx
reaches filtered test MRR 0.327 on FB15k-237 in 10 epochs (benchmarks/QUALITY.md, 2026-11-23); DistMult gets
the same settings (not measured), TransE no N3. Node and link keep the small GraphSAGE settings (hetero-node: the
same for its R-GCN) that the default ``dgl-oac train`` runs in seconds. ``--task link --dataset ogbl-ddi`` trains
OGB's featureless GraphSAGE baseline (``examples/linkproppred/ddi/gnn.py``: 256-wide embeddings and 2 SAGE
layers, dropout 0.5, full-graph message passing, 64K positive edges and as many random non-edges a batch, a
2-layer MLP on the Hadamard product (``--num_layers 2`` sets both in OGB's script), Xavier-uniform embeddings,
gradients clipped to norm 1, Adam 0.005 for everything; OGB's leaderboard: test Hits@20 0.539 +- 0.047), with
two changes that fit it into 30 minutes of a 2-core CPU: 100 epochs instead of 200, and the dense model's matrix
products in bfloat16 where the device computes bfloat16 natively (``--autocast auto``: bf16, 1.6x cheaper a step
on a CPU with AVX512-BF16; on one without, float32, since DGL's bfloat16 message passing there is about 20x
slower: ``dgl_oac.app.tasks.link``). What it reaches is in benchmarks/QUALITY.md. What was measured on this machine (a dot-product scorer, 3x cheaper a batch, plateaued far below) is in
benchmarks/QUALITY.md.
"""
from __future__ import annotations

from typing import Any, Dict, Tuple

#: options every task has, with a default that only a dataset recipe changes
COMMON_DEFAULTS: Dict[str, Any] = {"epochs": 2, "batch_size": 1024, "hidden": 64, "dropout": 0.0,
                                   "fanouts": "10,5"}
#: options whose default depends on the task; None in TrainConfig means "the task's default"
TASK_DEFAULTS: Dict[str, Dict[str, Any]] = {
    "node": {"model": "sage", "dim": 64, "negatives": 64, "lr": 0.05, "dense_lr": 0.01, "optimizer": "adam",
             "reg_weight": 0.0, **COMMON_DEFAULTS},
    "link": {"model": "sage", "dim": 64, "negatives": 64, "lr": 0.05, "dense_lr": 0.01, "optimizer": "adam",
             "reg_weight": 0.0, **COMMON_DEFAULTS, "scorer": "dot", "scorer_layers": 2, "scorer_hidden": 64,
             "message_passing": "sampled", "autocast": "off"},
    "hetero-node": {"model": "rgcn", "dim": 64, "negatives": 64, "lr": 0.05, "dense_lr": 0.01,
                    "optimizer": "adam", "reg_weight": 0.0, **COMMON_DEFAULTS},
    "kg": {"model": "complex", "dim": 256, "negatives": 1024, "lr": 0.1, "dense_lr": 0.1, "optimizer": "adagrad",
           "reg_weight": 0.05, **COMMON_DEFAULTS},
}
#: --task kg: what differs from TASK_DEFAULTS["kg"] per --model (TransE: no N3 on translations' distances)
KG_MODEL_DEFAULTS: Dict[str, Dict[str, Any]] = {"complex": {}, "distmult": {}, "transe": {"reg_weight": 0.0}}
#: Xavier-uniform's bound for ogbl-ddi's 4,267 x 256 embedding, sqrt(6 / (4267 + 256)): OGB's initialisation
DDI_XAVIER = 0.0364
#: (task, lower-case dataset name): what differs from the task's defaults for that dataset
DATASET_DEFAULTS: Dict[Tuple[str, str], Dict[str, Any]] = {
    ("link", "ogbl-ddi"): {"dim": 256, "hidden": 256, "fanouts": "-1,-1", "message_passing": "full",
                           "negatives": 1, "batch_size": 64 * 1024, "dropout": 0.5, "scorer": "mlp", "scorer_layers": 2,
                           "scorer_hidden": 256, "clip_grad_norm": 1.0, "init_scale": DDI_XAVIER,
                           "lr": 0.005, "dense_lr": 0.005, "optimizer": "adam", "epochs": 100, "autocast": "auto"},
}


def task_defaults(task: str, model: Any = None, dataset: Any = None) -> Dict[str, Any]:
    """The defaults of ``--task task`` (with ``--model model`` for kg; None: the task's default model) on
    ``--dataset dataset`` (a name with a recipe in DATASET_DEFAULTS, any case; other names change nothing)."""
    if task not in TASK_DEFAULTS:
        raise ValueError(f"unknown task {task!r}: expected one of {', '.join(TASK_DEFAULTS)}")
    out = dict(TASK_DEFAULTS[task])
    if task == "kg":
        out.update(KG_MODEL_DEFAULTS.get(model or out["model"], {}))
    if isinstance(dataset, str):
        out.update(DATASET_DEFAULTS.get((task, dataset.lower()), {}))
    return out


def resolve_defaults(cfg: Any) -> Any:
    """Fill ``cfg``'s unset (None) per-task options from :func:`task_defaults` in place and return ``cfg``;
    options given explicitly are kept."""
    for name, value in task_defaults(cfg.task, cfg.model, cfg.dataset).items():
        if getattr(cfg, name) is None:
            setattr(cfg, name, value)
    return cfg


def per_task_options() -> set:
    """Every option whose default :func:`resolve_defaults` fills for some task."""
    return {name for d in TASK_DEFAULTS.values() for name in d}


def describe(name: str, tasks: Any = None) -> str:
    """``--help`` text of an option's per-task defaults, for the ``tasks`` that read it (None: all): the value of
    most of them first, then the exceptions, e.g. ``64; kg 256; link on ogbl-ddi 256`` (or each task's value
    when no value has a majority: ``link 64, kg 1024``)."""
    chosen = [t for t in TASK_DEFAULTS if name in TASK_DEFAULTS[t] and (tasks is None or t in tasks)]
    values = [TASK_DEFAULTS[t][name] for t in chosen]
    common = max(values, key=values.count)
    majority = len(values) == 1 or 2 * values.count(common) > len(values)
    parts = [str(common)] if majority else []
    parts += [f"{t} {v}" for t, v in zip(chosen, values) if not majority or v != common]
    if "kg" in chosen:
        parts += [f"kg --model {m} {d[name]}" for m, d in KG_MODEL_DEFAULTS.items()
                  if name in d and d[name] != TASK_DEFAULTS["kg"][name]]
    parts += [f"{t} on {ds} {d[name]}" for (t, ds), d in DATASET_DEFAULTS.items()
              if name in d and t in chosen and d[name] != TASK_DEFAULTS[t][name]]
    return (parts[0] + "; " + ", ".join(parts[1:]) if majority and len(parts) > 1 else ", ".join(parts))
