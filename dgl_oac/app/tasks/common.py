"""The training driver shared by every task: epochs, progress bar, evaluation after each epoch, JSON result.

A task object supplies ``loader``, ``step(batch) -> loss``, ``evaluate() -> {metric: value}``,
``partial_test()``, ``full_test()`` and ``close()``; the driver times epochs (training only: evaluation is
timed apart), builds the curve and reports the best-validation epoch's test metrics (OGB's convention) next
to the last epoch's.
"""
from __future__ import annotations

import json
import math
import os
import sys
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import torch
from tqdm.auto import tqdm

from ...config import check_staleness
from ...distributed import current_group
from ...distributed.dense import broadcast_module
from ...baselines.shadow import ShadowSync
from .backend import BACKEND_MODES, loader_stats, rows_per_batch
from .base import EpochLosses
from .defaults import task_defaults


# allreduce: DDP's average of the dense gradients before every step (exact); shadow: each trainer steps its own
# copy, averaged in the background every --shadow-every steps (ShadowSync; not exact)
DENSE_SYNCS = ("allreduce", "shadow")
SHARDINGS = ("replicated", "rows")
PROGRESS_EVERY = 20  # steps between the progress bar's loss updates (each reads the losses: one host sync)


@dataclass
class TrainConfig:
    """Every option of ``dgl-oac train`` (see ``dgl-oac train --help``). None in an option of
    :func:`dgl_oac.app.tasks.defaults.per_task_options` (``model``, ``dim``, ``epochs``, ...): the default of the task
    (and dataset) (:func:`dgl_oac.app.tasks.defaults.resolve_defaults`, applied by ``build_task``)."""

    task: str = "node"
    dataset: str = "synthetic"
    root: Optional[str] = None
    model: Optional[str] = None
    mode: str = "oac"
    prefetch: str = "auto"
    background_priority: str = "auto"
    staleness: Optional[str] = None
    num_workers: Optional[int] = None  # DataLoader's: 0, the caller's thread (loader.resolve_num_workers)
    epochs: Optional[int] = None
    batch_size: Optional[int] = None
    fanouts: Optional[str] = None
    negatives: Optional[int] = None
    dim: Optional[int] = None
    hidden: Optional[int] = None
    lr: Optional[float] = None
    dense_lr: Optional[float] = None
    optimizer: Optional[str] = None
    dropout: Optional[float] = None
    seed: int = 0
    device: str = "auto"
    eval_batch_size: int = 4096
    max_steps: Optional[int] = None
    num_nodes: Optional[int] = None
    threads: Optional[int] = None
    progress: bool = True
    out: Optional[str] = None
    # link / kg tasks
    neg_dist: str = "uniform"
    scorer: Optional[str] = None
    scorer_layers: Optional[int] = None
    scorer_hidden: Optional[int] = None
    message_passing: Optional[str] = None
    autocast: Optional[str] = None
    loss: str = "auto"
    regularizer: str = "n3"
    reg_weight: Optional[float] = None
    init_scale: Optional[float] = None
    clip_grad_norm: Optional[float] = None
    adv_temperature: Optional[float] = None
    eval_limit: Optional[int] = None
    # checkpoints (dgl_oac.checkpoint): every N steps, after each epoch and at the end, into checkpoint_dir
    checkpoint_dir: Optional[str] = None
    checkpoint_every: Optional[int] = None
    resume: bool = False
    # several trainers (torchrun): how the dense parameters are kept in step (DENSE_SYNCS)
    dense_sync: str = "allreduce"
    shadow_every: int = 8
    sharding: str = "replicated"  # where the tables' rows live (SHARDINGS; NodeEmbedding's sharding=)
    extra: Dict[str, Any] = field(default_factory=dict)

    def fanout_list(self) -> List[int]:
        """``--fanouts`` as integers (-1 = every neighbour); raises ``ValueError`` naming a malformed value."""
        try:
            fan = [int(x) for x in self.fanouts.split(",") if x.strip()]
        except ValueError as exc:
            raise ValueError(f"--fanouts must be comma-separated integers, got {self.fanouts!r}") from exc
        if any(f == 0 or f < -1 for f in fan):
            raise ValueError(f"--fanouts entries must be positive (or -1 for all neighbours), got {fan}")
        return fan


def check_config(cfg: TrainConfig) -> None:
    needed = task_defaults(cfg.task, cfg.model)
    unresolved = [f.name for f in fields(cfg) if f.name in needed and getattr(cfg, f.name) is None]
    if unresolved:
        raise ValueError(f"unresolved per-task defaults {unresolved}: call resolve_defaults(cfg) first")
    if cfg.mode not in BACKEND_MODES:
        raise ValueError(f"unknown mode {cfg.mode!r}: expected one of {', '.join(BACKEND_MODES)}")
    check_staleness(cfg.staleness, cfg.mode)
    if cfg.prefetch != "auto":
        try:
            cfg.prefetch = int(cfg.prefetch)
        except (TypeError, ValueError):
            raise ValueError(f"--prefetch must be 'auto' or a positive integer, got {cfg.prefetch!r}") from None
    for name in ("epochs", "batch_size", "dim", "hidden", "eval_batch_size") + (
            () if cfg.prefetch == "auto" else ("prefetch",)):
        value = getattr(cfg, name)
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be a positive integer, got {value!r}")
    if not cfg.lr > 0 or not cfg.dense_lr > 0:
        raise ValueError("--lr and --dense-lr must be positive")
    if cfg.checkpoint_every is not None and (not isinstance(cfg.checkpoint_every, int) or cfg.checkpoint_every < 1):
        raise ValueError(f"--checkpoint-every must be a positive integer, got {cfg.checkpoint_every!r}")
    if (cfg.checkpoint_every or cfg.resume) and not cfg.checkpoint_dir:
        raise ValueError("--checkpoint-every and --resume need --checkpoint-dir")
    if cfg.checkpoint_dir and cfg.mode == "dgl":
        raise ValueError("checkpoints need a dgl-oac mode (sync, async or oac), not --mode dgl")
    if cfg.clip_grad_norm is not None and (cfg.task != "link" or not cfg.clip_grad_norm > 0):
        raise ValueError(f"--clip-grad-norm must be a positive number and is for --task link, got "
                         f"{cfg.clip_grad_norm!r} with --task {cfg.task}")
    if cfg.dense_sync not in DENSE_SYNCS:
        raise ValueError(f"unknown --dense-sync {cfg.dense_sync!r}: expected one of {', '.join(DENSE_SYNCS)}")
    if not isinstance(cfg.shadow_every, int) or isinstance(cfg.shadow_every, bool) or cfg.shadow_every < 1:
        raise ValueError(f"--shadow-every must be a positive integer (steps between averagings), "
                         f"got {cfg.shadow_every!r}")
    if cfg.dense_sync == "shadow" and cfg.checkpoint_dir:
        raise ValueError("--dense-sync shadow cannot checkpoint (--checkpoint-dir): between averagings each "
                         "trainer's dense parameters and optimizer state are its own, and a checkpoint holds rank 0's")


def run(cfg: TrainConfig, task: Any) -> Dict[str, Any]:
    """Train ``task`` for ``cfg.epochs`` epochs; returns the summary (also written to ``cfg.out``). The task is
    closed (threads stopped, pending writes flushed) however the run ends: an error, Ctrl-C."""
    shadow = None
    try:
        group = current_group()  # several trainers (dgl_oac.app.tasks.launch): rank 0 evaluates, prints and writes
        if group is not None:
            for module in task.checkpoint_parts()["dense_modules"].values():
                broadcast_module(module, group)
        shadow = _shadow_sync(cfg, task, group)
        return _train(cfg, task, shadow)
    finally:
        try:
            if shadow is not None:
                shadow.close()
        finally:
            task.close()


def _shadow_sync(cfg: TrainConfig, task: Any, group: Any) -> Optional[ShadowSync]:
    """With ``--dense-sync shadow``: the background averaging of the task's dense parameters (collective)."""
    if cfg.dense_sync != "shadow":
        return None
    if group is None:
        raise ValueError("--dense-sync shadow averages the dense parameters of several trainers: run under "
                         "torchrun with --nproc_per_node 2 or more (one process has nothing to average with)")
    params = [p for opt in task.checkpoint_parts()["dense_optimizers"].values()
              for g in opt.param_groups for p in g["params"]]
    return ShadowSync(params, group, cfg.shadow_every)


def _train(cfg: TrainConfig, task: Any, shadow: Optional[ShadowSync]) -> Dict[str, Any]:
    curve: List[Dict[str, Any]] = []
    train_s, steps, rows = 0.0, 0, 0
    started = time.perf_counter()
    group = current_group()
    lead = group is None or group.rank == 0
    ckpt, start_epoch, carried = _checkpoints(cfg, task)
    if carried:  # resumed: the driver's counters and the interrupted epoch's losses and time so far
        curve, train_s, steps, rows = carried["curve"], carried["train_s"], carried["steps"], carried["rows"]

    def progress(epoch_s: float) -> Dict[str, Any]:
        return {"curve": curve, "train_s": train_s, "steps": steps, "rows": rows, "losses": losses.values(),
                "epoch_s": epoch_s}

    for epoch in range(start_epoch, cfg.epochs):
        if cfg.max_steps is not None and steps >= cfg.max_steps:
            break
        # each step's loss stays on the device until read: at the bar's update, the epoch's end, a checkpoint
        losses = EpochLosses(done=carried.pop("losses", []) if carried else [])
        t0 = time.perf_counter() - (carried.pop("epoch_s", 0.0) if carried else 0.0)
        bar = tqdm(task.loader, desc=f"epoch {epoch + 1}/{cfg.epochs} [{cfg.mode}]",
                   disable=not (cfg.progress and lead), leave=False, dynamic_ncols=True)
        for batch in bar:
            loss = task.step(batch)
            if shadow is not None:
                shadow.after_step()
            losses.add(loss)
            steps += 1
            rows += rows_per_batch(batch)
            if steps % PROGRESS_EVERY == 0 and not bar.disable:
                bar.set_postfix(loss=f"{losses.mean(PROGRESS_EVERY):.4f}")
            if ckpt is not None:
                ckpt.after_step(steps, lambda: progress(time.perf_counter() - t0))
            if cfg.max_steps is not None and steps >= cfg.max_steps:
                break
        task.sync()  # every step in the table and run by the device: the epoch's time is its work's
        if shadow is not None:  # every rank's dense parameters equal, for rank 0's evaluation and the end
            shadow.average()
        epoch_s = time.perf_counter() - t0
        train_s += epoch_s
        if lead:  # with several trainers rank 0 evaluates alone: a no_grad read of the shared table
            curve.append(_evaluate(cfg, task, curve, epoch, epoch_s, train_s, losses))
        if group is not None:
            group.barrier(f"rank 0 evaluates epoch {epoch + 1}")  # the table does not change meanwhile
        if ckpt is not None:
            losses = EpochLosses()
            ckpt.save(progress(0.0))
        if cfg.max_steps is not None and steps >= cfg.max_steps:
            break
    result = {"config": {k: v for k, v in asdict(cfg).items() if k != "extra"}, "dataset": task.dataset_info(),
              "curve": curve, "final": curve[-1] if curve else {}, "best": best_epoch(curve), "steps": steps,
              "train_seconds": train_s, "wall_seconds": time.perf_counter() - started,
              "batches_per_s": steps / train_s if train_s else 0.0,
              "rows_per_s": rows / train_s if train_s else 0.0, "loader_stats": loader_stats(task.loader),
              "torch_threads": torch.get_num_threads(), "trainers": 1 if group is None else group.world,
              "bytes_sent": {} if group is None else dict(group.sent)}  # this rank's collectives, by kind
    if ckpt is not None:
        result["checkpoint"] = {"path": str(ckpt.path), "saves": ckpt.saves, "resumed_at_step": ckpt.resumed_at}
    if cfg.out and lead:
        write_json(cfg.out, result)
    return result


def _evaluate(cfg: TrainConfig, task: Any, curve: List[Dict[str, Any]], epoch: int, epoch_s: float,
              train_s: float, losses: EpochLosses) -> Dict[str, Any]:
    """The curve point of ``epoch``: the task's metrics after it (the whole test set at a new best validation
    epoch whose test was a subset), shown under the progress bar."""
    t1 = time.perf_counter()
    metrics = task.evaluate()
    point = {"epoch": epoch + 1, "train_seconds": train_s, "epoch_seconds": epoch_s,
             "eval_seconds": time.perf_counter() - t1, "train_loss": losses.mean(),
             **metrics, "partial_test": task.partial_test()}
    if task.partial_test() and best_epoch(curve + [point]) is point:
        t2 = time.perf_counter()
        point.update(task.full_test(), partial_test=False)  # a new best: its test metrics on every item
        point["eval_seconds"] += time.perf_counter() - t2
    if cfg.progress:
        shown = ", ".join(f"{k}={point[k]:.4f}" for k in metrics)
        tqdm.write(f"epoch {epoch + 1}: loss={point['train_loss']:.4f} {shown} ({epoch_s:.1f}s)")
    return point


def best_epoch(curve: List[Dict[str, Any]]) -> Dict[str, Any]:
    """The point of ``curve`` with the highest validation metric (its first ``valid_*`` key; NaN counts as
    the lowest), the earliest on ties, as OGB reports; the last point when there is no validation metric (an
    empty valid split); ``{}`` for an empty curve."""
    keys = [k for k in curve[0] if k.startswith("valid_")] if curve else []
    if not keys:
        return curve[-1] if curve else {}
    best = curve[0]
    for point in curve[1:]:
        value, top = point[keys[0]], best[keys[0]]
        if not math.isnan(value) and (math.isnan(top) or value > top):
            best = point
    return best


def _checkpoints(cfg: TrainConfig, task: Any) -> Tuple[Any, int, Optional[Dict[str, Any]]]:
    """``(checkpointer or None, first epoch, the driver's saved progress or None)``; with ``--resume``, loads
    the latest checkpoint in ``--checkpoint-dir`` into the task (none there yet: start from scratch)."""
    if not cfg.checkpoint_dir:
        return None, 0, None
    from ...checkpoint import Checkpointer

    ckpt = Checkpointer(cfg.checkpoint_dir, cfg.checkpoint_every, task)
    carried = ckpt.resume() if cfg.resume else None
    ckpt.resumed_at = None if carried is None else carried["steps"]
    if cfg.resume and carried is None:
        print(f"dgl-oac: no checkpoint in {cfg.checkpoint_dir} yet; starting from scratch", file=sys.stderr)
    start_epoch = task.loader.state_dict()["epoch"] if carried is not None else 0
    return ckpt, start_epoch, carried


def write_json(path: str, obj: Any) -> None:
    """Write atomically (temporary file, fsync, rename): a crash never leaves half a JSON."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=2, default=float)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, out)
