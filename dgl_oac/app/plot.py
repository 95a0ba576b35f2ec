"""Plots next to JSON results (matplotlib, headless). Missing matplotlib is not an error: no PNG then."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, Optional


def metric_key(point: Dict[str, Any]) -> Optional[str]:
    """The headline metric of a curve point: test/valid accuracy or MRR, whichever the task reports, else its
    first other test (then valid) metric (e.g. OGB's ``test_hits@20`` on ogbl-ddi)."""
    for key in ("test_acc", "valid_acc", "test_mrr", "valid_mrr", "test_hits@10", "valid_hits@10"):
        if key in point:
            return key
    for prefix in ("test_", "valid_"):
        for key, value in point.items():
            if key.startswith(prefix) and isinstance(value, (int, float)) and not isinstance(value, bool):
                return key
    return None


#: published results a plot shows as a reference line: (dataset, metric) -> (value, label). OGB's leaderboard entry
#: for the featureless GraphSAGE baseline that ``--task link --dataset ogbl-ddi`` trains (tasks/defaults.py).
REFERENCES = {("ogbl-ddi", "test_hits@20"): (0.539, "OGB leaderboard, GraphSAGE: 0.539 +- 0.047")}


def draw_curves(ax: Any, results: Dict[str, Dict[str, Any]]) -> Optional[str]:
    """Metric vs training seconds on ``ax``, one line per run label; each run's best-validation epoch marked (a
    star: the point whose test metric the run reports as best), and a published reference for the dataset and
    metric (:data:`REFERENCES`) as a dashed line. Returns the metric drawn (None: nothing to draw)."""
    key = None
    references = {}
    for label, res in results.items():
        curve = res.get("curve", [])
        key = key or (metric_key(curve[0]) if curve else None)
        if not key:
            continue
        line, = ax.plot([p["train_seconds"] for p in curve], [p[key] for p in curve], marker="o", ms=3, label=label)
        best = res.get("best") or {}
        if key in best and "train_seconds" in best:
            ax.plot([best["train_seconds"]], [best[key]], marker="*", ms=16, ls="none", color=line.get_color(),
                    markeredgecolor="k", zorder=3,
                    label=f"{label}: best validation, epoch {best.get('epoch', '?')}: {key} {best[key]:.3f}")
        name = str((res.get("dataset") or {}).get("name", "")).lower()
        if (name, key) in REFERENCES:
            references[(name, key)] = REFERENCES[(name, key)]
    for value, label in references.values():
        ax.axhline(value, color="k", lw=1.0, ls="--", label=label)
    return key


def plot_curves(results: Dict[str, Dict[str, Any]], json_path: str, title: str = "") -> Optional[str]:
    """:func:`draw_curves` of ``results`` (label -> a run's JSON summary); writes ``<json_path minus .json>.png``."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(6, 4))
    key = draw_curves(ax, results)
    ax.set_xlabel("training time (s)")
    ax.set_ylabel(key or "metric")
    ax.set_title(title or (key or ""))
    ax.grid(alpha=0.3)
    if ax.lines:
        ax.legend(fontsize=8)
    png = str(Path(json_path).with_suffix(".png"))
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return png
