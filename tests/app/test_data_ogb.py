"""OGB loading through the real ``ogb`` code path, on tiny folders in the exact layout ogb reads.

Layout (ogb 1.3.6, ``ogb/io/read_graph_raw.py`` and ``*/dataset_dgl.py``): ``<root>/<name_with_>/`` holding
``RELEASE_v<master.csv version>.txt``, ``raw/{edge,num-node-list,num-edge-list}.csv.gz`` (+ optional
``node-feat.csv.gz``, the master.csv "additional" ``node_*``/``edge_*`` files, ``node-label.csv.gz`` for
ogbn) and ``split/<master.csv split>/``: ``{train,valid,test}.csv.gz`` (ogbn) or ``.pt`` dicts (ogbl).
"""
from __future__ import annotations

import builtins
from pathlib import Path
from typing import Dict, Optional

import numpy as np
import pandas as pd
import pytest
import torch

from dgl_oac.app.data import (DatasetFormatError, DatasetNotFoundError, KGDataset, LinkDataset, NodeDataset,
                          data_root, load, load_ogb, ogb_names, ogb_root)
from dgl_oac.app.data.ogb_data import ogb_cache


def _csv(path: Path, rows: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_csv(path, compression="gzip", header=False, index=False)


def _write_graph(folder: Path, edges: np.ndarray, num_nodes: int, node_files: Optional[Dict] = None,
                 edge_files: Optional[Dict] = None, feat: Optional[np.ndarray] = None) -> None:
    """raw/ files of a single-graph OGB dataset plus RELEASE_v1.txt."""
    raw = folder / "raw"
    _csv(raw / "edge.csv.gz", edges)
    _csv(raw / "num-node-list.csv.gz", np.array([[num_nodes]]))
    _csv(raw / "num-edge-list.csv.gz", np.array([[len(edges)]]))
    if feat is not None:
        _csv(raw / "node-feat.csv.gz", feat)
    for fname, rows in {**(node_files or {}), **(edge_files or {})}.items():
        _csv(raw / f"{fname}.csv.gz", rows)
    (folder / "RELEASE_v1.txt").write_text("v1\n")


@pytest.fixture(autouse=True)
def _private_cache(monkeypatch, tmp_path_factory):
    """Each test's ogb processed files in a cache of its own."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("cache")))


@pytest.fixture(autouse=True)
def _no_stdin(monkeypatch):
    """ogb must never prompt: any input() call fails the test."""
    def refuse(*args, **kwargs):
        raise AssertionError("ogb tried to read stdin")
    monkeypatch.setattr(builtins, "input", refuse)


def make_arxiv(root: Path) -> Path:
    """ogbn-arxiv layout: 6 nodes, 7 directed edges, 3 features, node_year, 40-class labels, split 'time'."""
    folder = root / "ogbn_arxiv"
    edges = np.array([[0, 1], [1, 2], [2, 0], [3, 4], [4, 5], [5, 3], [0, 5]])
    rng = np.random.default_rng(0)
    _write_graph(folder, edges, 6, node_files={"node_year": np.arange(2010, 2016)[:, None]},
                 feat=rng.standard_normal((6, 3)).astype(np.float32))
    _csv(folder / "raw" / "node-label.csv.gz", np.array([[0], [0], [0], [39], [39], [7]]))
    for part, ids in (("train", [0, 1, 3]), ("valid", [2, 4]), ("test", [5])):
        _csv(folder / "split" / "time" / f"{part}.csv.gz", np.array(ids)[:, None])
    return folder


def make_citation2(root: Path) -> Path:
    """ogbl-citation2 layout: graph = train edges; valid/test carry target_node_neg [n, K] (numpy, as ogb)."""
    folder = root / "ogbl_citation2"
    train = np.array([[0, 1], [1, 2], [2, 3], [3, 4], [4, 0]])
    _write_graph(folder, train, 5, node_files={"node_year": np.arange(5)[:, None]},
                 feat=np.ones((5, 2), dtype=np.float32))
    split = folder / "split" / "time"
    split.mkdir(parents=True)
    torch.save({"source_node": train[:, 0], "target_node": train[:, 1]}, split / "train.pt")
    for part, (s, t) in (("valid", (0, 2)), ("test", (1, 3))):
        torch.save({"source_node": np.array([s]), "target_node": np.array([t]),
                    "target_node_neg": np.array([[3, 4, 4]])}, split / f"{part}.pt")
    return folder


def make_wikikg2(root: Path) -> Path:
    """ogbl-wikikg2 layout: edge_reltype edge file; valid/test with head_neg/tail_neg [n, K]."""
    folder = root / "ogbl_wikikg2"
    triples = np.array([[0, 0, 1], [1, 1, 2], [2, 2, 3], [3, 0, 0]])
    _write_graph(folder, triples[:, [0, 2]], 4, edge_files={"edge_reltype": triples[:, 1:2]})
    split = folder / "split" / "time"
    split.mkdir(parents=True)
    torch.save({"head": triples[:, 0], "relation": triples[:, 1], "tail": triples[:, 2]}, split / "train.pt")
    for part, row in (("valid", [1, 3, 0]), ("test", [2, 0, 1])):
        torch.save({"head": np.array([row[0]]), "relation": np.array([row[1]]), "tail": np.array([row[2]]),
                    "head_neg": np.array([[0, 2]]), "tail_neg": np.array([[1, 3]])}, split / f"{part}.pt")
    return folder


def make_collab(root: Path) -> Path:
    """ogbl-collab layout: inverse edges added by ogb, edge_weight/edge_year, 'edge'/'edge_neg' splits."""
    folder = root / "ogbl_collab"
    edges = np.array([[0, 1], [1, 2], [2, 3]])
    _write_graph(folder, edges, 4, feat=np.zeros((4, 2), dtype=np.float32),
                 edge_files={"edge_weight": np.ones((3, 1)), "edge_year": np.full((3, 1), 2019)})
    split = folder / "split" / "time"
    split.mkdir(parents=True)
    torch.save({"edge": torch.from_numpy(edges), "weight": torch.ones(3), "year": torch.full((3,), 2019)},
               split / "train.pt")
    for part in ("valid", "test"):
        torch.save({"edge": torch.tensor([[0, 3]]), "edge_neg": torch.tensor([[0, 2], [1, 3]])},
                   split / f"{part}.pt")
    return folder


def test_ogbn_arxiv_layout_loads_through_ogb(tmp_path):
    make_arxiv(tmp_path)
    ds = load("ogbn-arxiv", root=tmp_path)
    assert isinstance(ds, NodeDataset) and ds.ogb_name == "ogbn-arxiv"
    assert ds.graph.num_nodes() == 6 and ds.graph.num_edges() == 7  # ogbn-arxiv: no inverse edges added
    assert ds.graph.idtype == torch.int64
    assert ds.labels.tolist() == [0, 0, 0, 39, 39, 7] and ds.labels.dtype == torch.int64
    assert ds.num_classes == 40
    assert ds.train_idx.tolist() == [0, 1, 3] and ds.valid_idx.tolist() == [2, 4]
    assert ds.test_idx.tolist() == [5]
    assert ds.features.shape == (6, 3) and ds.features.dtype == torch.float32
    assert ds.graph.ndata["year"].view(-1).tolist() == list(range(2010, 2016))
    # ogb's processed file goes to the cache, never into the dataset folder (a read-only mount, shared data)
    assert not (tmp_path / "ogbn_arxiv" / "processed").exists()
    assert list(ogb_cache().glob("*/ogbn_arxiv/processed/dgl_data_processed"))
    again = load("OGBN-ARXIV", root=tmp_path)  # second load: ogb's processed cache, same content
    assert torch.equal(again.labels, ds.labels) and torch.equal(again.features, ds.features)


def test_ogb_root_from_env_and_folder_path(tmp_path, monkeypatch):
    folder = make_arxiv(tmp_path)
    monkeypatch.setenv("DGL_OAC_DATA", str(tmp_path))  # the one data root variable, as for the shared files
    assert load("ogbn-arxiv").graph.num_edges() == 7
    ds = load(folder)  # a dataset folder path is sniffed as OGB
    assert isinstance(ds, NodeDataset) and ds.ogb_name == "ogbn-arxiv"


def test_ogbl_citation2_layout(tmp_path):
    make_citation2(tmp_path)
    ds = load("ogbl-citation2", root=tmp_path)
    assert isinstance(ds, LinkDataset) and ds.ogb_name == "ogbl-citation2"
    assert ds.train_edges.tolist() == [[0, 1], [1, 2], [2, 3], [3, 4], [4, 0]]
    assert ds.valid_edges.tolist() == [[0, 2]] and ds.test_edges.tolist() == [[1, 3]]
    assert ds.valid_neg.tolist() == [[3, 4, 4]] and ds.test_neg.dtype == torch.int64
    assert ds.graph.num_edges() == 5 and ds.features.shape == (5, 2)
    assert ds.valid_neg_edges is None


def test_ogbl_wikikg2_layout(tmp_path):
    make_wikikg2(tmp_path)
    ds = load("ogbl-wikikg2", root=tmp_path)
    assert isinstance(ds, KGDataset) and ds.ogb_name == "ogbl-wikikg2"
    assert ds.num_entities == 4 and ds.num_relations == 4  # relation 3 occurs in valid only
    assert ds.train.tolist() == [[0, 0, 1], [1, 1, 2], [2, 2, 3], [3, 0, 0]]
    assert ds.valid.tolist() == [[1, 3, 0]] and ds.test.tolist() == [[2, 0, 1]]
    assert ds.negatives["valid_head_neg"].tolist() == [[0, 2]]
    assert ds.negatives["test_tail_neg"].tolist() == [[1, 3]]
    assert ds.graph.edata["etype"].tolist() == [0, 1, 2, 0]


def test_ogbl_collab_layout(tmp_path):
    make_collab(tmp_path)
    ds = load("ogbl-collab", root=tmp_path)
    assert ds.graph.num_edges() == 6  # ogb adds the inverse of each of the 3 edges
    assert ds.train_edges.tolist() == [[0, 1], [1, 2], [2, 3]]
    assert ds.valid_neg_edges.tolist() == [[0, 2], [1, 3]] and ds.valid_neg is None


def test_missing_ogb_folder_names_path_and_script(tmp_path):
    with pytest.raises(DatasetNotFoundError) as err:
        load("ogbn-products", root=tmp_path)
    msg = str(err.value)
    assert str(tmp_path / "ogbn_products") in msg and "prepare_ogb.py ogbn-products" in msg
    assert isinstance(err.value, FileNotFoundError)


def test_ogb_folder_without_release_file_does_not_prompt(tmp_path):
    folder = make_arxiv(tmp_path)
    (folder / "RELEASE_v1.txt").unlink()
    with pytest.raises(DatasetFormatError, match="RELEASE_v1.txt"):
        load("ogbn-arxiv", root=tmp_path)
    assert (folder / "raw" / "edge.csv.gz").exists()  # nothing was deleted


def test_ogb_folder_without_raw_files_does_not_download(tmp_path):
    folder = tmp_path / "ogbl_citation2"
    folder.mkdir()
    (folder / "RELEASE_v1.txt").write_text("v1\n")
    with pytest.raises(DatasetNotFoundError, match="edge.csv.gz"):
        load("ogbl-citation2", root=tmp_path)


def test_truncated_ogb_file_is_a_format_error(tmp_path):
    folder = make_arxiv(tmp_path)
    path = folder / "raw" / "node-label.csv.gz"
    path.write_bytes(path.read_bytes()[:12])
    with pytest.raises(DatasetFormatError, match="ogbn_arxiv"):
        load("ogbn-arxiv", root=tmp_path)


def test_ogb_names_and_hetero_rejected(tmp_path):
    names = ogb_names()
    for name in ("ogbn-arxiv", "ogbn-products", "ogbn-papers100M", "ogbl-citation2", "ogbl-wikikg2"):
        assert names[name.lower()] == name
    with pytest.raises(ValueError, match="heterogeneous"):
        load_ogb("ogbn-mag", root=tmp_path)


def _as_numpy1_pickle(path: Path) -> None:
    """Rewrite a torch.save file so its numpy globals carry numpy 1 names, as the published OGB splits do."""
    import zipfile

    entries = []
    with zipfile.ZipFile(path) as zin:
        for info in zin.infolist():
            data = zin.read(info.filename)
            if info.filename.endswith("data.pkl"):
                data = data.replace(b"numpy._core.multiarray", b"numpy.core.multiarray")
            entries.append((info, data))
    with zipfile.ZipFile(path, "w") as zout:
        for info, data in entries:
            zout.writestr(info, data)


def test_split_files_pickled_under_numpy1_load(tmp_path):
    folder = make_citation2(tmp_path)
    for part in ("train", "valid", "test"):
        _as_numpy1_pickle(folder / "split" / "time" / f"{part}.pt")
    names = torch.serialization.get_unsafe_globals_in_checkpoint(str(folder / "split" / "time" / "valid.pt"))
    assert "numpy.core.multiarray._reconstruct" in names
    ds = load("ogbl-citation2", root=tmp_path)
    assert ds.valid_neg.tolist() == [[3, 4, 4]] and ds.train_edges.shape == (5, 2)


def test_prepare_ogb_script_help():
    import subprocess
    import sys

    script = Path(__file__).resolve().parents[2] / "scripts" / "prepare_ogb.py"
    out = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "--root" in out.stdout and "NAME" in out.stdout


DDI = data_root() / "ogbl-ddi"


@pytest.mark.skipif(not (DDI / "ogbl_ddi").is_dir(), reason="shared data ogbl-ddi absent")
def test_ogbl_ddi_from_the_shared_data_loads_and_writes_nothing_there():
    """The real ogbl-ddi in OGB's layout: its split files are numpy pickles (allowed narrowly for these
    files), and ogb's processed file goes to the cache, never into ../shared/data."""
    def listing():
        return sorted(str(p.relative_to(DDI)) for p in DDI.rglob("*"))

    before = listing()
    ds = load("ogbl-ddi", root=DDI)
    assert isinstance(ds, LinkDataset) and ds.ogb_name == "ogbl-ddi"
    assert ds.graph.num_nodes() == 4267
    assert (len(ds.train_edges), len(ds.valid_edges), len(ds.test_edges)) == (1067911, 133489, 133489)
    assert (len(ds.valid_neg_edges), len(ds.test_neg_edges)) == (101882, 95599)
    assert listing() == before
    assert list(ogb_cache().glob("*/ogbl_ddi/processed/dgl_data_processed"))


def test_ogb_root_is_the_data_root_in_either_layout(tmp_path, monkeypatch):
    """One rule (root, else DGL_OAC_DATA, else ../shared/data) for OGB as for the shared files: in the data root
    either ``<name>/<name with _>/`` (``../shared/data/ogbl-ddi/ogbl_ddi``) or ogb's ``<name with _>/``. The
    error names the data root, how it is chosen (--root, not only root=) and both places looked in; neither
    ~/.dgl_oac/ogb nor DGL_OAC_OGB_ROOT is read any more."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    make_citation2(tmp_path / "home" / ".dgl_oac" / "ogb")  # the old default: no longer looked in
    monkeypatch.setenv("DGL_OAC_OGB_ROOT", str(tmp_path / "home" / ".dgl_oac" / "ogb"))  # nor the old variable
    monkeypatch.setenv("DGL_OAC_DATA", str(tmp_path / "shared"))
    with pytest.raises(DatasetNotFoundError) as err:
        load("ogbl-citation2")
    msg = str(err.value)
    for part in (tmp_path / "shared" / "ogbl_citation2", tmp_path / "shared" / "ogbl-citation2" / "ogbl_citation2",
                 "--root DIR", "$DGL_OAC_DATA", "../shared/data"):
        assert str(part) in msg, (part, msg)
    assert "DGL_OAC_OGB_ROOT" not in msg and ".dgl_oac" not in msg
    make_citation2(tmp_path / "shared" / "ogbl-citation2")
    assert ogb_root(name="ogbl-citation2") == tmp_path / "shared" / "ogbl-citation2"
    assert load("ogbl-citation2").ogb_name == "ogbl-citation2"
    assert ogb_root() == tmp_path / "shared" == ogb_root(name="ogbn-arxiv")
    make_arxiv(tmp_path / "other")  # --root wins over the variable; ogb's own layout directly under it
    assert load("ogbn-arxiv", root=tmp_path / "other").ogb_name == "ogbn-arxiv"
