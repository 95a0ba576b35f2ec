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


def plot_curves(results: Dict[str, Dict[str, Any]], json_path: str, title: str = "") -> Optional[str]:
    """Metric vs training seconds, one line per run label; writes ``<json_path minus .json>.png``."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(6, 4))
    key = None
    for label, res in results.items():
        curve = res.get("curve", [])
        key = key or (metric_key(curve[0]) if curve else None)
        if key:
            ax.plot([p["train_seconds"] for p in curve], [p[key] for p in curve], marker="o", label=label)
    ax.set_xlabel("training time (s)")
    ax.set_ylabel(key or "metric")
    ax.set_title(title or (key or ""))
    ax.grid(alpha=0.3)
    if ax.lines:
        ax.legend()
    png = str(Path(json_path).with_suffix(".png"))
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return png
