"""The real datasets in the shared data folder load with the counts stated in its INDEX.md."""
from __future__ import annotations

import pytest
import torch

from dgl_oac.app.data import DatasetNotFoundError, KGDataset, NodeDataset, data_root, load

ROOT = data_root()  # <repo>/../shared/data or $DGL_OAC_DATA
pytestmark = pytest.mark.skipif(not (ROOT / "INDEX.md").exists(), reason=f"shared data not found at {ROOT}")


def _undirected_ok(ds: NodeDataset) -> None:
    src, dst = ds.graph.edges()
    n = ds.graph.num_nodes()
    assert not bool((src == dst).any())
    keys = src * n + dst
    assert torch.unique(keys).numel() == keys.numel()
    assert torch.equal(torch.sort(keys).values, torch.sort(dst * n + src).values)
    assert ds.graph.idtype == torch.int64


def test_cora_public_split():
    ds = load("cora")
    assert isinstance(ds, NodeDataset) and ds.name == "cora"
    assert ds.graph.num_nodes() == 2708 and ds.graph.num_edges() == 2 * 5278
    assert ds.features.shape == (2708, 1433) and ds.features.dtype == torch.float32
    assert ds.num_classes == 7 and ds.labels.dtype == torch.int64 and int(ds.labels.min()) == 0
    assert torch.equal(ds.train_idx, torch.arange(140)) and torch.equal(ds.valid_idx, torch.arange(140, 640))
    assert ds.test_idx.numel() == 1000 and int(ds.test_idx.min()) >= 1708 and int(ds.test_idx.max()) == 2707
    assert ds.labels.bincount().tolist() == [351, 217, 418, 818, 426, 298, 180]  # standard Cora class sizes
    _undirected_ok(ds)


def test_pubmed_without_allx():
    ds = load("PubMed")
    assert ds.graph.num_nodes() == 19717 and ds.graph.num_edges() == 2 * 44324
    assert ds.features is None and ds.num_classes == 3 and int(ds.labels.min()) == 0  # every node labelled
    assert [t.numel() for t in (ds.train_idx, ds.valid_idx, ds.test_idx)] == [60, 500, 1000]
    filled = load("pubmed", zero_fill_missing=True)
    assert filled.features.shape == (19717, 500)
    has = filled.graph.ndata["has_feat"]
    assert int(has.sum()) == 1060 and bool(has[:60].all()) and bool(has[ds.test_idx].all())
    assert float(filled.features[~has].abs().sum()) == 0.0 and float(filled.features[has].abs().sum()) > 0
    _undirected_ok(ds)


def test_coauthor_physics():
    ds = load("coauthor_physics", features=False)  # '_' alias; skip the 1.2 GB dense feature matrix
    assert ds.graph.num_nodes() == 34493 and ds.graph.num_edges() == 2 * 247962
    assert ds.num_classes == 5 and ds.features is None
    assert [t.numel() for t in (ds.train_idx, ds.valid_idx, ds.test_idx)] == [20695, 6899, 6899]
    every = torch.cat([ds.train_idx, ds.valid_idx, ds.test_idx])
    assert torch.equal(torch.sort(every).values, torch.arange(34493))
    _undirected_ok(ds)


def test_coauthor_physics_features():
    ds = load("coauthor-physics", seed=0)
    assert ds.features.shape == (34493, 8415) and ds.features.dtype == torch.float32
    assert int(torch.count_nonzero(ds.features)) == 1137311


def test_github_social_split_is_seeded():
    ds = load("github-social", seed=0)
    assert ds.graph.num_nodes() == 37700 and ds.graph.num_edges() == 2 * 289003
    assert ds.num_classes == 2 and ds.features is None and int(ds.labels.min()) == 0
    assert [t.numel() for t in (ds.train_idx, ds.valid_idx, ds.test_idx)] == [22620, 7540, 7540]
    assert torch.equal(load("github-social", seed=0).train_idx, ds.train_idx)
    assert not torch.equal(load("github-social", seed=1).train_idx, ds.train_idx)
    _undirected_ok(ds)


@pytest.mark.parametrize("name,ents,rels,sizes,first", [
    ("FB15k-237", 14541, 237, (272115, 17535, 20466),
     ("/m/027rn", "/location/country/form_of_government", "/m/06cx9")),
    ("wn18rr", 40943, 11, (86835, 3034, 3134), None),
    ("CODEX-M", 17050, 51, (185584, 10310, 10311), ("Q108946", "P161", "Q39792")),
])
def test_kg_counts_and_id_order(name, ents, rels, sizes, first):
    ds = load(name)
    assert isinstance(ds, KGDataset)
    assert (ds.num_entities, ds.num_relations) == (ents, rels)
    assert (ds.train.shape[0], ds.valid.shape[0], ds.test.shape[0]) == sizes
    assert all(t.dtype == torch.int64 and t.shape[1] == 3 for t in (ds.train, ds.valid, ds.test))
    assert len(ds.entity_names) == ents and len(ds.relation_names) == rels
    assert ds.train[0].tolist() == [0, 0, 1]  # ids follow first appearance: first train row is (0, 0, 1)
    if first is not None:
        assert (ds.entity_names[0], ds.relation_names[0], ds.entity_names[1]) == first
    assert ds.graph.num_nodes() == ents and ds.graph.num_edges() == sizes[0]
    assert torch.equal(ds.graph.edata["etype"], ds.train[:, 1])
    everything = torch.cat([ds.train, ds.valid, ds.test])
    assert int(everything[:, [0, 2]].max()) == ents - 1 and int(everything[:, 1].max()) == rels - 1


def test_codex_negatives_share_the_vocabulary():
    ds = load("codex-m")
    assert ds.negatives["valid_false"].shape == (10310, 3) and ds.negatives["test_false"].shape == (10311, 3)
    assert int(ds.negatives["valid_false"][:, [0, 2]].max()) < ds.num_entities


def test_folder_and_archive_paths_are_sniffed():
    ds = load(ROOT / "cora")
    assert isinstance(ds, NodeDataset) and ds.graph.num_nodes() == 2708
    kg = load(str(ROOT / "WN18RR" / "WN18RR.tar.gz"))
    assert kg.name == "WN18RR" and kg.num_entities == 40943


def test_root_and_env_override(tmp_path, monkeypatch):
    assert load("cora", root=ROOT).graph.num_nodes() == 2708
    monkeypatch.setenv("DGL_OAC_DATA", str(tmp_path))
    with pytest.raises(DatasetNotFoundError) as err:
        load("cora")
    assert str(tmp_path / "cora") in str(err.value) and "kimiyoung/planetoid" in str(err.value)
    # the one rule, said the same way by every message: the CLI flag first, then the variable, then the default
    assert "--root DIR (Python: root=DIR), else $DGL_OAC_DATA, else ../shared/data" in str(err.value)
    assert "pass root=" not in str(err.value)
