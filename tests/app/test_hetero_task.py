"""``dgl-oac train --task hetero-node --dataset synthetic-mag`` end to end in every mode, and the generator.

The task: an R-GCN over sampled blocks with paper features and learnable author/institution/topic tables;
oac's per-epoch metrics equal sync's exactly, accuracy rises well above chance, a resumed run reproduces the
uninterrupted one. The generator: ogbn-mag's shape (types, relations, features and labels on papers only),
deterministic per seed.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Dict

import pytest
import torch

from dgl_oac.app.cli import main
from dgl_oac.app.data import HeteroNodeDataset, load
from dgl_oac.app.data.synthetic_mag import generate_mag

SMALL = ["--num-nodes", "3000", "--batch-size", "64", "--fanouts", "4,4", "--dim", "8", "--hidden", "16"]
TIMING = {"epoch", "train_seconds", "epoch_seconds", "eval_seconds"}
STALE = ["--background-priority", "normal"]  # gathers run when queued: batches really read rows steps then write


@pytest.fixture(autouse=True)
def _restore_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def train_cli(tmp_path: Path, mode: str, *extra: str, epochs: int = 2, name: str = "") -> Dict:
    out = tmp_path / f"hetero-{mode}{name}.json"
    argv = ["train", "--task", "hetero-node", "--dataset", "synthetic-mag", "--mode", mode, "--epochs", str(epochs),
            "--seed", "3", "--threads", "1", "--no-progress", "--out", str(out), *SMALL, *extra]
    assert main(argv) == 0
    return json.loads(out.read_text())


def metrics(res: Dict) -> list:
    return [{k: v for k, v in p.items() if k not in TIMING} for p in res["curve"]]


@pytest.mark.hang_timeout(120)
def test_cli_trains_hetero_node_in_every_mode_and_oac_equals_sync(tmp_path):
    runs = {m: train_cli(tmp_path, m, *STALE, "--prefetch", "3") if m != "dgl" else train_cli(tmp_path, m)
            for m in ("sync", "oac", "async", "dgl")}
    for mode, res in runs.items():
        assert res["config"]["task"] == "hetero-node" and res["config"]["mode"] == mode
        assert res["dataset"]["learned"] == ["author", "field_of_study", "institution"]
        assert res["dataset"]["features"] == {"paper": 64}
        assert [p["epoch"] for p in res["curve"]] == [1, 2]
        assert all(math.isfinite(p["train_loss"]) for p in res["curve"])
        # 8 classes (chance 0.125): the tables and the R-GCN learn the planted communities
        assert res["final"]["test_acc"] > 0.5, (mode, res["final"])
    assert metrics(runs["oac"]) == metrics(runs["sync"])
    assert runs["oac"]["loader_stats"]["rows_patched"] > 0
    assert runs["oac"]["loader_stats"]["committed"] == runs["sync"]["loader_stats"]["committed"]


@pytest.mark.hang_timeout(120)
def test_hetero_resume_from_checkpoint_equals_uninterrupted(tmp_path):
    whole = train_cli(tmp_path, "oac", name="whole")
    ck = str(tmp_path / "ck")
    train_cli(tmp_path, "oac", "--checkpoint-dir", ck, epochs=1, name="first")
    resumed = train_cli(tmp_path, "oac", "--checkpoint-dir", ck, "--resume", name="resumed")
    assert metrics(resumed) == metrics(whole)


def test_the_node_task_refuses_a_heterograph_naming_the_task_that_fits(capsys, tmp_path):
    assert main(["train", "--task", "node", "--dataset", "synthetic-mag", "--num-nodes", "500", "--no-progress",
                 "--out", str(tmp_path / "x.json")]) != 0
    assert "--task hetero-node" in capsys.readouterr().err


def test_synthetic_mag_has_the_shape_of_ogbn_mag():
    ds = load("synthetic-mag", num_nodes=20_000, seed=5)
    assert isinstance(ds, HeteroNodeDataset) and ds.target_ntype == "paper"
    g = ds.graph
    assert sorted(g.ntypes) == ["author", "field_of_study", "institution", "paper"]
    rels = {r for _, r, _ in g.canonical_etypes}
    assert {"writes", "affiliated_with", "cites", "has_topic"} <= rels and len(rels) == 8
    assert ("author", "writes", "paper") in g.canonical_etypes
    n = {nt: g.num_nodes(nt) for nt in g.ntypes}
    assert abs(sum(n.values()) - 20_000) <= 4
    assert n["author"] > n["paper"] > n["field_of_study"] > n["institution"] > 0  # ogbn-mag's order
    assert list(ds.features) == ["paper"] and ds.features["paper"].shape == (n["paper"], 64)
    assert ds.labels.shape == (n["paper"],) and int(ds.labels.max()) < ds.num_classes
    parts = torch.cat([ds.train_idx, ds.valid_idx, ds.test_idx])
    assert torch.equal(parts.sort().values, torch.arange(n["paper"]))
    for (s, r, d) in g.canonical_etypes:  # reverses mirror their relation
        if not r.startswith("rev_"):
            a, b = g.edges(etype=(s, r, d))
            ra, rb = g.edges(etype=(d, "rev_" + r, s))
            assert torch.equal(a, rb) and torch.equal(b, ra)
    # homophily 0.5: a citation stays inside its community w.p. 0.5 + 0.5 / 8 (chance: 1 / 8)
    src, dst = g.edges(etype="cites")
    assert abs(float((ds.labels[src] == ds.labels[dst]).float().mean()) - 0.5625) < 0.02
    again = generate_mag(20_000, seed=5)
    assert torch.equal(again.features["paper"], ds.features["paper"])
    assert all(torch.equal(torch.stack(again.graph.edges(etype=e)), torch.stack(g.edges(etype=e)))
               for e in g.canonical_etypes)


def test_synthetic_mag_bad_sizes():
    with pytest.raises(ValueError, match="num_nodes >= 16"):
        generate_mag(3)
    with pytest.raises(ValueError, match="homophily"):
        generate_mag(100, homophily=1.5)
