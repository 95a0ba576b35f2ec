"""Loader behaviour on tiny hand-made files: exact parsing, format sniffing and the error contract."""
from __future__ import annotations

import gzip
import pickle
import tarfile
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from dgl_oac.app.data import DatasetFormatError, DatasetNotFoundError, KGDataset, NodeDataset, load

TRIPLES = {
    "train": "a\tr1\tb\r\nb\tr2\tc\r\nc\tr1\ta\r\n",  # CRLF as in the ConvE archives
    "valid": "a\tr2\tc\n",
    "test": "d\tr3\ta\n",
}


def _kg_folder(folder: Path, gz: bool = True) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for split, text in TRIPLES.items():
        if gz:
            (folder / f"{split}.txt.gz").write_bytes(gzip.compress(text.encode()))
        else:
            (folder / f"{split}.txt").write_text(text)
    return folder


def test_kg_folder_ids_follow_first_appearance(tmp_path):
    folder = _kg_folder(tmp_path / "tiny")
    (folder / "valid_negatives.txt.gz").write_bytes(gzip.compress(b"a\tr3\tb\n"))
    ds = load(folder)
    assert isinstance(ds, KGDataset) and ds.name == "tiny"
    assert ds.entity_names == ["a", "b", "c", "d"] and ds.relation_names == ["r1", "r2", "r3"]
    assert ds.train.tolist() == [[0, 0, 1], [1, 1, 2], [2, 0, 0]]
    assert ds.valid.tolist() == [[0, 1, 2]] and ds.test.tolist() == [[3, 2, 0]]
    assert ds.negatives == {"valid_false": ds.negatives["valid_false"]}
    assert ds.negatives["valid_false"].tolist() == [[0, 2, 1]]
    assert ds.graph.num_nodes() == 4 and ds.graph.edata["etype"].tolist() == [0, 1, 0]


def test_kg_archive(tmp_path):
    src = _kg_folder(tmp_path / "plain", gz=False)
    archive = tmp_path / "Tiny.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        for split in TRIPLES:
            tar.add(src / f"{split}.txt", arcname=f"{split}.txt")
    ds = load(archive)
    assert ds.name == "Tiny" and ds.num_entities == 4 and ds.train.shape == (3, 3)
    holder = tmp_path / "holder"
    holder.mkdir()
    archive.rename(holder / archive.name)
    assert load(str(holder)).valid.tolist() == [[0, 1, 2]]  # folder holding only the archive


def test_kg_truncated_gzip_names_the_file(tmp_path):
    folder = _kg_folder(tmp_path / "kg")
    blob = gzip.compress(("x\tr\ty\n" * 5000).encode())
    (folder / "train.txt.gz").write_bytes(blob[: len(blob) // 2])
    with pytest.raises(DatasetFormatError) as err:
        load(folder)
    assert str(folder / "train.txt.gz") in str(err.value) and "truncated" in str(err.value)


@pytest.mark.parametrize("bad", ["a\tr1\n", "a\tr1\tb\tc\n", "a\t\tb\n"])
def test_kg_wrong_columns(tmp_path, bad):
    folder = _kg_folder(tmp_path / "kg")
    (folder / "test.txt.gz").write_bytes(gzip.compress(("a\tr1\tb\n" + bad).encode()))
    with pytest.raises(DatasetFormatError, match="test.txt.gz"):
        load(folder)


def test_kg_missing_split(tmp_path):
    folder = _kg_folder(tmp_path / "kg")
    (folder / "test.txt.gz").unlink()
    with pytest.raises(DatasetNotFoundError, match="test.txt"):
        load(folder)


def _planetoid(folder: Path, drop: str = "") -> Path:
    """5 nodes: 0,1 train; 2 the only non-test rest; test ids 4,3 (unsorted in test.index)."""
    folder.mkdir(parents=True)
    eye = np.eye(3, dtype=np.int32)
    feats = sp.csr_matrix(np.arange(5 * 2, dtype=np.float32).reshape(5, 2))
    parts = {"x": feats[:2], "allx": feats[:3], "tx": feats[3:], "y": eye[[0, 1]], "ally": eye[[0, 1, 2]],
             "ty": eye[[1, 2]],  # rows follow sorted test ids: node 3 -> class 1, node 4 -> class 2
             "graph": defaultdict(list, {0: [1, 1, 0], 1: [0], 2: [3], 3: [2, 4], 4: [3]})}
    for key, obj in parts.items():
        if key != drop:
            with open(folder / f"ind.tiny.{key}", "wb") as f:
                pickle.dump(obj, f, protocol=2)
    (folder / "ind.tiny.test.index").write_text("4\n3\n")
    return folder


def test_planetoid_reorders_test_rows(tmp_path):
    ds = load(_planetoid(tmp_path / "p"))
    assert isinstance(ds, NodeDataset) and ds.name == "tiny"
    assert ds.labels.tolist() == [0, 1, 2, 1, 2] and ds.num_classes == 3
    assert ds.features[:, 0].tolist() == [0, 2, 4, 6, 8]
    edges = sorted(zip(*[t.tolist() for t in ds.graph.edges()]))
    assert edges == [(0, 1), (1, 0), (2, 3), (3, 2), (3, 4), (4, 3)]  # duplicate 0-1 and loop 0-0 dropped
    assert ds.train_idx.tolist() == [0, 1] and ds.test_idx.tolist() == [3, 4]


def test_planetoid_missing_allx_keeps_labels(tmp_path):
    ds = load(_planetoid(tmp_path / "p", drop="allx"))
    assert ds.features is None and ds.labels.tolist() == [0, 1, 2, 1, 2]
    filled = load(tmp_path / "p", zero_fill_missing=True)
    assert filled.graph.ndata["has_feat"].tolist() == [True, True, False, True, True]
    assert filled.features[:, 0].tolist() == [0, 2, 0, 6, 8]


def test_planetoid_truncated_pickle(tmp_path):
    folder = _planetoid(tmp_path / "p")
    path = folder / "ind.tiny.ally"
    path.write_bytes(path.read_bytes()[:20])
    with pytest.raises(DatasetFormatError, match="ind.tiny.ally"):
        load(folder)


def test_planetoid_missing_required_file(tmp_path):
    with pytest.raises(DatasetNotFoundError, match="ind.tiny.ty"):
        load(_planetoid(tmp_path / "p", drop="ty"))


def _npz(path: Path, **overrides) -> Path:
    adj = sp.csr_matrix(np.array([[0, 1, 0], [1, 0, 1], [0, 1, 0]], dtype=np.float32))
    arrays = {"adj_matrix": np.array(adj, dtype=object),
              "node_attr": np.array(sp.csr_matrix(np.eye(3)), dtype=object),
              "node_label": np.array([0, 1, 1], dtype=np.int32)}
    arrays.update(overrides)
    np.savez(path, **{k: v for k, v in arrays.items() if v is not None})
    return path


def test_npz_pickled_and_csr_part_layouts(tmp_path):
    ds = load(_npz(tmp_path / "g.npz"))
    assert ds.name == "g" and ds.graph.num_edges() == 4 and ds.features.tolist() == np.eye(3).tolist()
    assert ds.labels.tolist() == [0, 1, 1] and ds.num_classes == 2
    adj = sp.csr_matrix(np.array([[0, 1], [0, 0]]))
    np.savez(tmp_path / "parts.npz", adj_data=adj.data, adj_indices=adj.indices, adj_indptr=adj.indptr,
             adj_shape=adj.shape, labels=np.array([1, 0]))
    parts = load(tmp_path / "parts.npz", features=False)
    assert parts.graph.num_edges() == 2 and parts.labels.tolist() == [1, 0]  # symmetrised


def test_npz_missing_key_and_truncation(tmp_path):
    with pytest.raises(DatasetFormatError, match="nolabels.npz"):
        load(_npz(tmp_path / "nolabels.npz", node_label=None))
    path = _npz(tmp_path / "cut.npz")
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(DatasetFormatError, match="cut.npz"):
        load(path)


def _csv_folder(folder: Path, edges: str = "id_1,id_2\n0,1\n1,2\n2,0\n3,0\n",
                target: str = "id,target\n0,1\n1,0\n2,1\n") -> Path:
    folder.mkdir(parents=True)
    (folder / "edges.csv.gz").write_bytes(gzip.compress(edges.encode()))
    (folder / "target.csv").write_text(target)
    return folder


def test_csv_edges_folder(tmp_path):
    ds = load(_csv_folder(tmp_path / "gh"), seed=5)
    assert ds.name == "gh" and ds.graph.num_nodes() == 4 and ds.graph.num_edges() == 8
    assert ds.labels.tolist() == [1, 0, 1, -1] and ds.num_classes == 2  # node 3 has no target row
    split = torch.cat([ds.train_idx, ds.valid_idx, ds.test_idx]).sort().values
    assert split.tolist() == [0, 1, 2]  # only labelled nodes are split


@pytest.mark.parametrize("edges,target,bad", [
    ("id_1,id_2\n0,1\n1,x\n", "id,target\n0,1\n", "edges.csv.gz"),
    ("id_1,id_2\n0,1\n", "id,label\n0,1\n", "target.csv"),
    ("id_1,id_2\n0,1\n1,2,3\n", "id,target\n0,1\n", "edges.csv.gz"),
])
def test_csv_edges_malformed(tmp_path, edges, target, bad):
    with pytest.raises(DatasetFormatError, match=bad):
        load(_csv_folder(tmp_path / "gh", edges, target))


def test_missing_directory_names_the_path(tmp_path):
    missing = tmp_path / "nope"
    with pytest.raises(DatasetNotFoundError, match=str(missing)):
        load(str(missing))
    with pytest.raises(FileNotFoundError):  # the subclass relationship callers may rely on
        load(missing)


def test_unrecognised_folder(tmp_path):
    (tmp_path / "readme.txt").write_text("hello")
    with pytest.raises(DatasetFormatError, match="not a recognised dataset"):
        load(tmp_path)


def test_unknown_name_lists_known_names():
    with pytest.raises(ValueError) as err:
        load("no-such-dataset")
    msg = str(err.value)
    assert not isinstance(err.value, DatasetFormatError)
    for name in ("synthetic", "cora", "FB15k-237", "ogbn-arxiv", "ogbl-citation2"):
        assert name in msg


def test_shared_name_with_empty_root(tmp_path):
    with pytest.raises(DatasetNotFoundError) as err:
        load("fb15k-237", root=tmp_path)
    assert str(tmp_path / "FB15k-237") in str(err.value) and "TimDettmers/ConvE" in str(err.value)
