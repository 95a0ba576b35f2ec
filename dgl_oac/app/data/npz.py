"""Node-classification graphs stored as ``.npz`` (Shchur et al.'s gnn-benchmark layout and GraphData's copy).

Two encodings of the same content are accepted:

* pickled scipy matrices (EdisonLeeeee/GraphData, e.g. ``coauthor_phy.npz``): keys ``adj_matrix``,
  ``node_attr`` (object arrays holding CSR matrices; ``allow_pickle=True`` - load trusted files only) and
  ``node_label``;
* CSR parts (shchur/gnn-benchmark): ``adj_data/adj_indices/adj_indptr/adj_shape``,
  ``attr_data/attr_indices/attr_indptr/attr_shape`` and ``labels``.

The adjacency is symmetrised and self loops dropped (graph: both directions of each undirected pair).
No split ships with these files: a deterministic random 60/20/20 node split is drawn from ``seed``.
Features are densified to float32[N, F] (Coauthor-Physics: 34493 x 8415 = 1.2 GB); pass
``features=False`` to skip them.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence

import numpy as np
import scipy.sparse as sp
import torch

from ._files import ROOT_RULE, format_error, reading
from ._graphs import random_split, undirected_graph
from .errors import DatasetNotFoundError
from .types import NodeDataset

HOW = ("Coauthor/Amazon .npz files come from github.com/shchur/gnn-benchmark (data/npz) or "
       f"github.com/EdisonLeeeee/GraphData (datasets/): place the file in <data root>/<name>/; {ROOT_RULE}")


def _sparse(z: "np.lib.npyio.NpzFile", path: Path, pickled: str, prefix: str) -> Optional[sp.csr_matrix]:
    """Matrix stored as a pickled scipy object under ``pickled`` or as ``<prefix>_{data,...}`` parts."""
    if pickled in z.files:
        obj = z[pickled]
        obj = obj.item() if obj.dtype == object and obj.shape == () else obj
        if not sp.issparse(obj) and not isinstance(obj, np.ndarray):
            raise format_error(path, f"{pickled} holds {type(obj).__name__}, expected a sparse matrix", HOW)
        return sp.csr_matrix(obj)
    if f"{prefix}_data" in z.files:
        return sp.csr_matrix((z[f"{prefix}_data"], z[f"{prefix}_indices"], z[f"{prefix}_indptr"]),
                             shape=tuple(z[f"{prefix}_shape"]))
    return None


def _first(z: "np.lib.npyio.NpzFile", keys: Sequence[str]) -> Optional[np.ndarray]:
    return next((z[k] for k in keys if k in z.files), None)


def load_npz(path: Path, name: Optional[str] = None, seed: int = 0, features: bool = True,
             split: Sequence[float] = (0.6, 0.2, 0.2)) -> NodeDataset:
    """Load one ``.npz`` file (or the single ``.npz`` inside folder ``path``) as a NodeDataset."""
    if path.is_dir():
        hits = sorted(path.glob("*.npz"))
        if len(hits) != 1:
            raise DatasetNotFoundError(f"{path}: expected exactly one .npz file, found {len(hits)}. {HOW}")
        name, path = name or path.name, hits[0]
    expected = "an npz with adj_matrix/node_attr/node_label or adj_*/attr_*/labels arrays"
    with reading(path, expected, HOW), np.load(path, allow_pickle=True) as z:
        adj = _sparse(z, path, "adj_matrix", "adj")
        labels = _first(z, ["node_label", "labels"])
        attr = _sparse(z, path, "node_attr", "attr") if features else None
    if adj is None or labels is None:
        raise format_error(path, f"missing adjacency or labels; expected {expected}", HOW)
    num_nodes = adj.shape[0]
    if adj.shape != (num_nodes, num_nodes) or labels.shape != (num_nodes,):
        raise format_error(path, f"adjacency {adj.shape} and labels {labels.shape} disagree on N", HOW)
    coo = adj.tocoo()
    edges = torch.from_numpy(np.stack([coo.row, coo.col], axis=1).astype(np.int64))
    graph, _ = undirected_graph(edges, num_nodes)
    labels_t = torch.from_numpy(labels.astype(np.int64))
    train_idx, valid_idx, test_idx = random_split(num_nodes, seed, split)
    feats = torch.from_numpy(attr.toarray().astype(np.float32, copy=False)) if attr is not None else None
    return NodeDataset(name=name or path.stem, graph=graph, labels=labels_t,
                       num_classes=int(labels_t.max()) + 1, train_idx=train_idx, valid_idx=valid_idx,
                       test_idx=test_idx, features=feats)
