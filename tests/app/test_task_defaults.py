"""Per-task defaults (``resolve_defaults``) and best-validation reporting (``best_epoch``, the driver's summary)."""
from __future__ import annotations

import math

import pytest
import torch

from dgl_oac.app.cli import build_parser, main
from dgl_oac.app.tasks import TrainConfig, build_task, resolve_defaults, task_defaults
from dgl_oac.app.tasks.common import best_epoch, check_config, run

KG = {"model": "complex", "dim": 256, "negatives": 1024, "lr": 0.1, "dense_lr": 0.1, "optimizer": "adagrad",
      "reg_weight": 0.05}
NODE = {"model": "sage", "dim": 64, "negatives": 64, "lr": 0.05, "dense_lr": 0.01, "optimizer": "adam",
        "reg_weight": 0.0}


def resolved(argv):
    """The TrainConfig ``dgl-oac train ARGV`` trains with."""
    args = vars(build_parser().parse_args(["train", *argv]))
    args.pop("command")
    return resolve_defaults(TrainConfig(**args))


@pytest.fixture(autouse=True)
def _restore_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_kg_defaults():
    cfg = resolved(["--task", "kg", "--dataset", "FB15k-237", "--epochs", "10"])
    assert {k: getattr(cfg, k) for k in KG} == KG
    assert cfg.loss == "auto" and cfg.regularizer == "n3" and cfg.batch_size == 1024 and cfg.eval_limit is None


@pytest.mark.parametrize("task", ["node", "link"])
def test_node_and_link_defaults_unchanged(task):
    cfg = resolved(["--task", task])
    assert {k: getattr(cfg, k) for k in NODE} == NODE
    assert resolved([]).task == "node" and {k: getattr(resolved([]), k) for k in NODE} == NODE


def test_explicit_flags_win():
    cfg = resolved(["--task", "kg", "--model", "distmult", "--dim", "32", "--lr", "0.5", "--optimizer", "adam",
                    "--reg-weight", "0", "--negatives", "7", "--dense-lr", "0.2"])
    assert (cfg.model, cfg.dim, cfg.lr, cfg.optimizer, cfg.reg_weight, cfg.negatives, cfg.dense_lr) == (
        "distmult", 32, 0.5, "adam", 0.0, 7, 0.2)
    # a node flag on a kg run keeps the kg defaults for the rest
    cfg = resolved(["--task", "kg", "--dim", "64"])
    assert cfg.dim == 64 and cfg.model == "complex" and cfg.lr == 0.1


def test_per_model_kg_defaults():
    assert task_defaults("kg", "transe")["reg_weight"] == 0.0
    distmult = task_defaults("kg", "distmult")
    assert {k: distmult[k] for k in KG} == KG | {"model": "complex"}
    assert resolved(["--task", "kg", "--model", "transe"]).reg_weight == 0.0
    assert resolved(["--task", "kg", "--model", "transe", "--reg-weight", "0.01"]).reg_weight == 0.01


DDI = {"dim": 256, "hidden": 256, "fanouts": "-1,-1", "message_passing": "full", "negatives": 1,
       "batch_size": 65536, "dropout": 0.5, "scorer": "mlp", "scorer_layers": 2, "scorer_hidden": 256,
       "clip_grad_norm": 1.0, "init_scale": 0.0364, "lr": 0.005, "dense_lr": 0.005, "optimizer": "adam", "epochs": 100,
       "autocast": "auto"}


@pytest.mark.parametrize("name", ["ogbl-ddi", "OGBL-DDI"])
def test_link_ogbl_ddi_defaults(name):
    """``dgl-oac train --task link --dataset ogbl-ddi`` alone trains the ddi recipe; flags still win; another
    task or dataset keeps its own defaults."""
    cfg = resolved(["--task", "link", "--dataset", name])
    assert {k: getattr(cfg, k) for k in DDI} == DDI
    assert task_defaults("link", dataset=name) == {**task_defaults("link"), **DDI}
    cfg = resolved(["--task", "link", "--dataset", name, "--epochs", "3", "--scorer", "dot", "--dropout", "0"])
    assert (cfg.epochs, cfg.scorer, cfg.dropout, cfg.dim) == (3, "dot", 0.0, 256)
    node = resolved(["--task", "node", "--dataset", name])
    assert (node.dim, node.epochs, node.batch_size, node.fanouts) == (64, 2, 1024, "10,5")
    link = resolved(["--task", "link", "--dataset", "synthetic"])
    assert (link.message_passing, link.scorer, link.epochs, link.hidden) == ("sampled", "dot", 2, 64)


def test_resolution_errors():
    with pytest.raises(ValueError, match="unknown task 'graph'"):
        task_defaults("graph")
    with pytest.raises(ValueError, match="unresolved per-task defaults"):
        check_config(TrainConfig(task="kg"))


def test_help_shows_per_task_defaults(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "embedding dimension (default: 64; kg 256, link on ogbl-ddi 256)" in text
    assert "(default: node sage, link sage, hetero-node rgcn, kg complex)" in text  # no value has a majority
    assert "(default: 0.05; kg --model transe 0.0)" in text
    assert "(default: 2; link on ogbl-ddi 100)" in text


def test_best_epoch_selection():
    """Highest validation metric; the earlier epoch on ties; NaN never wins; no valid metric: the last
    epoch; empty curve: {}."""
    curve = [{"epoch": e, "valid_mrr": v, "test_mrr": t}
             for e, v, t in [(1, 0.20, 0.19), (2, 0.31, 0.30), (3, 0.29, 0.33), (4, 0.31, 0.32),
                             (5, math.nan, 0.9)]]
    assert best_epoch(curve)["epoch"] == 2 and best_epoch(curve)["test_mrr"] == 0.30
    assert best_epoch([{"epoch": 1, "valid_acc": math.nan}, {"epoch": 2, "valid_acc": 0.1}])["epoch"] == 2
    assert best_epoch([]) == {}
    assert best_epoch([{"epoch": 1, "test_acc": 0.5}, {"epoch": 2, "test_acc": 0.4}])["epoch"] == 2


@pytest.mark.hang_timeout(120)
def test_default_node_run_reports_best_valid_epoch():
    """The default ``dgl-oac train`` run: ``best`` is the best-valid epoch with its test accuracy, ``final``
    the last epoch."""
    cfg = TrainConfig(progress=False)
    res = run(cfg, build_task(cfg))
    curve = res["curve"]
    assert len(curve) == 2 and res["final"] == curve[-1]
    top = max(p["valid_acc"] for p in curve)
    pick = next(p for p in curve if p["valid_acc"] == top)
    assert res["best"] == pick and res["best"]["test_acc"] == pick["test_acc"]
    assert res["best"]["test_acc"] > 0.85


@pytest.mark.hang_timeout(60)
@pytest.mark.parametrize("task", ["kg", "link"])
def test_eval_limit_best_epoch_has_full_test(task):
    """With --eval-limit, valid is the same subset every epoch and the best-valid epoch's test metrics are on
    every test item (equal to a run without the limit: evaluation does not change training)."""
    small = dict(task=task, mode="sync", num_nodes=300, epochs=3, batch_size=256, dim=16, hidden=16,
                 negatives=16, fanouts="3,3", seed=2, progress=False, threads=1)
    torch.set_num_threads(1)
    limited_cfg = TrainConfig(eval_limit=20, **small)
    limited = run(limited_cfg, build_task(limited_cfg))
    whole_cfg = TrainConfig(**small)
    whole = run(whole_cfg, build_task(whole_cfg))
    curve = limited["curve"]
    assert limited["best"]["partial_test"] is False and limited["final"]["partial_test"] is False
    for i, point in enumerate(curve):
        new_best = best_epoch(curve[:i + 1]) is point
        assert point["partial_test"] == (not new_best and i < len(curve) - 1)
        if not point["partial_test"]:  # scored on every test item: the unlimited run's test metrics
            assert {k: v for k, v in point.items() if k.startswith("test_")} == \
                {k: v for k, v in whole["curve"][i].items() if k.startswith("test_")}


@pytest.mark.hang_timeout(60)
def test_cli_prints_best_and_last(capsys):
    argv = ["train", "--num-nodes", "300", "--dim", "8", "--hidden", "8", "--batch-size", "64", "--fanouts", "3,3",
            "--threads", "1", "--no-progress"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "node on synthetic [oac], best validation at epoch " in out and " of 2: test_acc=" in out
    assert "node on synthetic [oac], last epoch 2: test_acc=" in out
