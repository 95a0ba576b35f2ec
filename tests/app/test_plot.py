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


def test_plot_marks_the_best_validation_point_and_ogbs_baseline():
    """ogbl_ddi_default.png (issue 38): the epoch whose test metric the run reports as best is marked where it
    lies, and OGB's 0.539 GraphSAGE baseline is drawn, both named in the legend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from dgl_oac.app.plot import draw_curves

    curve = [{"epoch": e, "train_seconds": 17.0 * e, "valid_hits@20": v, "test_hits@20": t}
             for e, v, t in ((1, 0.2, 0.1), (2, 0.6, 0.55), (3, 0.4, 0.62))]
    run = {"curve": curve, "best": curve[1], "dataset": {"name": "ogbl-ddi"}}
    fig, ax = plt.subplots()
    try:
        assert draw_curves(ax, {"oac": run}) == "test_hits@20"
        lines = {line.get_label(): line for line in ax.lines}
        star = lines["oac: best validation, epoch 2: test_hits@20 0.550"]
        assert list(star.get_xdata()) == [34.0] and list(star.get_ydata()) == [0.55] and star.get_marker() == "*"
        baseline = lines["OGB leaderboard, GraphSAGE: 0.539 +- 0.047"]
        assert list(baseline.get_ydata()) == [0.539, 0.539]
        ax.clear()
        draw_curves(ax, {"oac": dict(run, dataset={"name": "synthetic"})})  # no published reference there
        assert not any("OGB" in line.get_label() for line in ax.lines)
    finally:
        plt.close(fig)
