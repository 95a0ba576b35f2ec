"""``dgl-oac train`` once its options parsed: train (:func:`train`), print the report (:func:`report`). Imported by
:func:`dgl_oac.app.cli.main` only after parsing, since it imports torch, DGL and the tasks; ``main`` turns what
:func:`train` raises into one line and an exit status."""
from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

import torch

from ..engine.runtime import follow_load
from .tasks import TrainConfig, build_task, launch
from .tasks.common import run


def train(opts: Dict[str, Any]) -> Tuple[TrainConfig, Dict[str, Any], bool]:
    """Train the TrainConfig ``opts``; returns ``(config, summary, whether this process reports)`` (under torchrun,
    rank 0 reports). The task is closed (threads stopped, pending writes flushed) however it ends
    (:func:`~dgl_oac.app.tasks.common.run`).

    Raises ValueError, FileNotFoundError or TypeError for a bad configuration or a missing dataset;
    FloatingPointError for a step that would write NaN or Inf, its message naming the step and the table (the
    table and optimizer state are as before that step); KeyboardInterrupt (Ctrl-C), its one argument saying
    how far training got."""
    cfg = TrainConfig(**opts)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)  # --seed also fixes the model and embedding initialisation
    task = None
    try:
        launch.start(cfg)  # under torchrun: this process is one of N trainers
        try:
            with follow_load():  # evaluations too: libgomp's spin cut short beside a busy process
                task = build_task(cfg)
                result = run(cfg, task)
            return cfg, result, launch.is_lead()
        finally:
            launch.stop()
    except FloatingPointError as exc:  # the commit's NaN/Inf check: its message names the table and the rows
        step = _steps_done(task)
        at = f" at step {step + 1}" if step is not None else ""
        raise FloatingPointError(f"training stopped{at}: {exc} (a smaller --lr or --dense-lr may help)") from None
    except KeyboardInterrupt:
        step = _steps_done(task)
        done = f" after {step} steps" if step is not None else ""
        resume = f"; --resume continues from the last checkpoint in {cfg.checkpoint_dir}" if cfg.checkpoint_dir else ""
        raise KeyboardInterrupt(done + resume) from None


def _steps_done(task: Any) -> Optional[int]:
    """Steps this process committed (the loader's count), None before the task's loader exists or for DGL's."""
    stats = getattr(getattr(task, "loader", None), "stats", None)
    return getattr(stats, "committed", None)


def report(cfg: TrainConfig, result: Dict[str, Any]) -> None:
    """Print the run's summary: best and last epoch, throughput, the pipeline's statistics, what was written."""
    name = f"{cfg.task} on {result['dataset']['name']} [{cfg.mode}]"
    if result["curve"]:
        best, final = result["best"], result["final"]
        print(f"{name}, best validation at epoch {best['epoch']} of {final['epoch']}: {_metrics(best)}")
        note = " (test on a subset: --eval-limit)" if final.get("partial_test") else ""
        print(f"{name}, last epoch {final['epoch']}: {_metrics(final)}{note}")
    trainers = f" on each of {result['trainers']} trainers" if result["trainers"] > 1 else ""
    print(f"throughput: {result['batches_per_s']:.2f} batches/s, {result['rows_per_s']:,.0f} embedding rows/s "
          f"({result['steps']} steps{trainers} in {result['train_seconds']:.1f}s of training)")
    line = pipeline_line(cfg.mode, cfg.prefetch, result["loader_stats"])
    if line:
        print(line)
    if cfg.out:
        from .plot import plot_curves

        png = plot_curves({cfg.mode: result}, cfg.out)
        print(f"wrote {cfg.out}" + (f" and {png}" if png else ""))


def pipeline_line(mode: str, prefetch: Any, stats: Optional[Dict[str, Any]]) -> str:
    """The report's ``pipeline:`` line for a run that read ahead (async, oac; '' otherwise): oac's conflict rate
    with the depths it was measured at (it grows with the depth, and ``prefetch="auto"`` picks the depth from
    step times, so two runs of one seed can differ); async's is unknown, since async does not validate."""
    if not stats or mode not in ("async", "oac"):
        return ""
    depths = stats.get("depths") or {}
    if depths:
        chosen = ", ".join(f"{d} for {n} batch{'' if n == 1 else 'es'}" for d, n in sorted(depths.items()))
        where = f"at the depths prefetch=auto chose ({chosen})"
    else:
        where = f"at prefetch {prefetch}"
    if mode == "async":
        return (f"pipeline: conflict rate unknown (async does not validate its reads) {where}, max in flight "
                f"{stats['max_in_flight']}")
    return (f"pipeline: conflict rate {stats['conflict_rate']:.3f} ({stats['rows_patched']:,} of "
            f"{stats['rows_read']:,} rows read stale, all patched) {where}; it grows with the depth, max in flight "
            f"{stats['max_in_flight']}")


def _metrics(point: Dict[str, Any]) -> str:
    """``test_* ..., valid_* ...`` of a curve point, test first."""
    keys = sorted((k for k in point if k.startswith(("test_", "valid_"))),
                  key=lambda k: not k.startswith("test_"))
    return ", ".join(f"{k}={point[k]:.4f}" for k in keys)
