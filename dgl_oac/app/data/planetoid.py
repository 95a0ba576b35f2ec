"""Planetoid citation graphs (Cora, CiteSeer, PubMed) in the ``ind.<name>.*`` format of Yang et al. 2016.

Files: ``x``/``tx``/``allx`` (scipy CSR features of train / test / all non-test nodes), ``y``/``ty``/
``ally`` (one-hot labels), ``graph`` (dict node -> neighbours), ``test.index`` (one test id per line).
Nodes ``0..len(ally)-1`` are the non-test nodes in file order; test nodes take the ids in ``test.index``,
whose rows in ``tx``/``ty`` follow the *sorted* test ids. Split = the public Planetoid split: train
``0..len(y)-1``, valid the next 500, test the ids in ``test.index``.

Missing pieces (the shared PubMed copy lacks ``allx``): ``x`` still covers the first ``len(x)`` nodes and
``tx`` the test nodes. By default ``features`` is then ``None`` (a mostly-zero matrix would mislead a
feature-based model); ``zero_fill_missing=True`` returns float32[N, F] with zero rows where no features
exist and sets ``graph.ndata["has_feat"]`` (bool[N]). Labels are complete whenever ``ally`` and ``ty``
exist; nodes without any label (CiteSeer's isolated test ids) get -1.
"""
from __future__ import annotations

from pathlib import Path
from typing import Dict, Optional

import numpy as np
import scipy.sparse as sp
import torch

from ._files import ROOT_RULE, find_file, format_error, read_pickle, reading, require_file
from ._graphs import undirected_graph
from .errors import DatasetNotFoundError
from .types import NodeDataset

NUM_VALID = 500  # the public split's validation size (Kipf & Welling)
HOW = ("Planetoid files come from github.com/kimiyoung/planetoid (data/ind.<name>.*): place "
       f"ind.<name>.{{x,tx,allx,y,ty,ally,graph,test.index}} in <data root>/<name>/; {ROOT_RULE}")


def planetoid_prefix(folder: Path) -> Optional[str]:
    """``cora`` for a folder holding ``ind.cora.graph``; ``None`` when it is no Planetoid folder."""
    hits = sorted(folder.glob("ind.*.graph"))
    return hits[0].name[len("ind."):-len(".graph")] if hits else None


def _edges_from_dict(adj: object, path: Path) -> np.ndarray:
    """dict node -> neighbour list -> int64[E,2]; one pass over the dict (a pickle gives no other form)."""
    if not isinstance(adj, dict):
        raise format_error(path, f"expected a pickled dict node -> neighbours, got {type(adj).__name__}", HOW)
    with reading(path, "a dict of int node ids to lists of int neighbour ids", HOW):
        counts = np.fromiter((len(v) for v in adj.values()), dtype=np.int64, count=len(adj))
        src = np.repeat(np.fromiter(adj.keys(), dtype=np.int64, count=len(adj)), counts)
        dst = np.fromiter((int(u) for v in adj.values() for u in v), dtype=np.int64, count=int(counts.sum()))
    return np.stack([src, dst], axis=1)


def _load_parts(folder: Path, prefix: str) -> Dict[str, object]:
    parts: Dict[str, object] = {}
    for key in ("x", "tx", "allx", "y", "ty", "ally", "graph"):
        path = find_file(folder, [f"ind.{prefix}.{key}"])
        if path is not None:
            parts[key] = read_pickle(path, f"a Planetoid pickle ind.{prefix}.{key}", HOW)
    for key in ("graph", "y", "ty", "ally", "tx"):
        if key not in parts:
            missing = folder / f"ind.{prefix}.{key}"
            raise DatasetNotFoundError(f"{missing}: required Planetoid file missing. {HOW}")
    return parts


def _labels(parts: Dict[str, object], test_ids: np.ndarray, num_nodes: int) -> np.ndarray:
    labels = np.full(num_nodes, -1, dtype=np.int64)
    for key, ids in (("ally", np.arange(len(parts["ally"]))), ("ty", np.sort(test_ids))):  # type: ignore[arg-type]
        onehot = np.asarray(parts[key])
        rows = np.flatnonzero(onehot.any(axis=1))  # all-zero rows: no label known
        labels[ids[rows]] = onehot[rows].argmax(axis=1)
    return labels


def _features(parts: Dict[str, object], test_ids: np.ndarray, num_nodes: int):
    """(float32[N,F] zero-filled, bool[N] has-features)."""
    tx = sp.csr_matrix(parts["tx"])
    feats = np.zeros((num_nodes, tx.shape[1]), dtype=np.float32)
    have = np.zeros(num_nodes, dtype=bool)
    base = parts.get("allx", parts.get("x"))  # allx covers all non-test nodes, x only the first len(x)
    if base is not None:
        base = sp.csr_matrix(base)
        feats[: base.shape[0]] = base.toarray()
        have[: base.shape[0]] = True
    sorted_test = np.sort(test_ids)
    feats[sorted_test] = tx.toarray()[: len(sorted_test)]
    have[sorted_test] = True
    return feats, have


def load_planetoid(folder: Path, name: Optional[str] = None, zero_fill_missing: bool = False) -> NodeDataset:
    """Load ``folder/ind.<prefix>.*`` (prefix from ``ind.*.graph``) as a NodeDataset (public split)."""
    prefix = planetoid_prefix(folder)
    if prefix is None:
        raise DatasetNotFoundError(f"{folder}: no ind.<name>.graph file found. {HOW}")
    parts = _load_parts(folder, prefix)
    index_path = require_file(folder, [f"ind.{prefix}.test.index"], "Planetoid test.index", HOW)
    with reading(index_path, "one integer test node id per line", HOW):
        test_ids = np.loadtxt(index_path, dtype=np.int64, ndmin=1)
    edges = _edges_from_dict(parts["graph"], folder / f"ind.{prefix}.graph")
    num_ally = len(parts["ally"])  # type: ignore[arg-type]
    num_nodes = int(max(num_ally, test_ids.max() + 1, edges.max() + 1 if edges.size else 0))
    if len(parts["ty"]) != len(test_ids):  # type: ignore[arg-type]
        raise format_error(folder, f"ind.{prefix}.ty has {len(parts['ty'])} rows but test.index lists "  # type: ignore
                           f"{len(test_ids)} ids", HOW)
    labels = _labels(parts, test_ids, num_nodes)
    graph, _ = undirected_graph(torch.from_numpy(edges), num_nodes)
    features = None
    if "allx" in parts or zero_fill_missing:
        feats, have = _features(parts, test_ids, num_nodes)
        if "allx" not in parts:
            graph.ndata["has_feat"] = torch.from_numpy(have)
        features = torch.from_numpy(feats)
    num_train = len(parts["y"])  # type: ignore[arg-type]
    return NodeDataset(
        name=name or prefix, graph=graph, labels=torch.from_numpy(labels),
        num_classes=int(np.asarray(parts["ally"]).shape[1]),
        train_idx=torch.arange(num_train), valid_idx=torch.arange(num_train, num_train + NUM_VALID),
        test_idx=torch.from_numpy(np.sort(test_ids)), features=features)
