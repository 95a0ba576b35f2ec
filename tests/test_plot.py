"""dgl_oac.app.plot: the PNG beside a run's JSON shows the task's headline metric, whatever the task reports."""
from __future__ import annotations

from pathlib import Path

from dgl_oac.app.plot import metric_key, plot_curves


def test_metric_key_takes_the_tasks_headline_metric():
    assert metric_key({"epoch": 1, "train_seconds": 1.0, "valid_acc": 0.5, "test_acc": 0.4}) == "test_acc"
    assert metric_key({"valid_mrr": 0.2, "test_mrr": 0.3, "test_hits@10": 0.5}) == "test_mrr"
    # ogbl-ddi reports OGB's Hits@20 only: its plot was empty before (regression)
    ddi = {"epoch": 1, "train_seconds": 17.0, "train_loss": 0.9, "valid_hits@20": 0.03, "test_hits@20": 0.02,
           "partial_test": False}
    assert metric_key(ddi) == "test_hits@20"
    assert metric_key({"epoch": 1, "train_loss": 0.9, "partial_test": False}) is None


def test_plot_draws_the_ddi_curve(tmp_path: Path):
    curve = [{"epoch": e, "train_seconds": 17.0 * e, "valid_hits@20": 0.1 * e, "test_hits@20": 0.05 * e}
             for e in (1, 2, 3)]
    png = plot_curves({"oac": {"curve": curve}}, str(tmp_path / "run.json"))
    assert png == str(tmp_path / "run.png") and Path(png).stat().st_size > 0
    import matplotlib.pyplot as plt

    assert not plt.get_fignums()  # the figure was closed
    assert plot_curves({"oac": {"curve": []}}, str(tmp_path / "empty.json")) == str(tmp_path / "empty.png")
