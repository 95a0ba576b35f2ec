"""Edge-list CSV + target CSV node-classification graphs (karateclub / MUSAE layout, e.g. GitHub social).

Folder layout: ``edges.csv[.gz]`` with a header and two integer id columns (``id_1,id_2``: one undirected
edge per row) and ``target.csv[.gz]`` with a header holding an ``id`` column and a ``target`` column
(integer class). Extra target columns (MUSAE's ``name``, ``ml_target``) are ignored. Ids are used as node
ids directly (``N = max id + 1``); nodes that have no target row get label -1. No features, no split:
a deterministic random 60/20/20 split over the labelled nodes is drawn from ``seed``.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence

import numpy as np
import torch

from ._files import ROOT_RULE, find_file, format_error, read_table, require_file
from ._graphs import random_split, undirected_graph
from .types import NodeDataset

HOW = ("karateclub graphs come from github.com/benedekrozemberczki/karateclub (dataset/node_level/<name>/"
       f"edges.csv, target.csv): place them in <data root>/<name>/; {ROOT_RULE}")
EDGE_NAMES = ("edges.csv", "edge.csv")
TARGET_NAMES = ("target.csv", "targets.csv")


def is_csv_edges_folder(folder: Path) -> bool:
    return find_file(folder, EDGE_NAMES) is not None and find_file(folder, TARGET_NAMES) is not None


def _int_columns(df, path: Path, cols: Sequence[str]) -> np.ndarray:
    """Selected columns as int64[R, len(cols)]; a non-integer cell is a format error naming the column."""
    out = []
    for col in cols:
        if col not in df.columns:
            raise format_error(path, f"missing column {col!r} (columns: {list(df.columns)})", HOW)
        values = df[col].to_numpy()
        if values.dtype.kind not in "iu":  # blanks or text parse as float/object: reject, never truncate
            raise format_error(path, f"column {col!r} must hold integers, found dtype {values.dtype}", HOW)
        out.append(values.astype(np.int64))
    return np.stack(out, axis=1)


def load_csv_edges(folder: Path, name: Optional[str] = None, seed: int = 0,
                   split: Sequence[float] = (0.6, 0.2, 0.2)) -> NodeDataset:
    """Load ``edges.csv[.gz]`` + ``target.csv[.gz]`` from ``folder`` as a featureless NodeDataset."""
    edge_path = require_file(folder, EDGE_NAMES, "edge list", HOW)
    target_path = require_file(folder, TARGET_NAMES, "node target", HOW)
    edge_df = read_table(edge_path, ",", 2, edge_path, "a CSV with a header and two id columns", HOW,
                         header=0, dtype=None)
    edges = _int_columns(edge_df, edge_path, list(edge_df.columns[:2]))
    target_df = read_table(target_path, ",", target_columns(target_path), target_path,
                           "a CSV with a header holding columns 'id' and 'target'", HOW, header=0, dtype=None)
    target = _int_columns(target_df, target_path, ["id", "target"])
    if (edges < 0).any() or (target < 0).any():
        raise format_error(edge_path if (edges < 0).any() else target_path, "negative id or class", HOW)
    num_nodes = int(max(edges.max(initial=-1), target[:, 0].max(initial=-1)) + 1)
    labels = np.full(num_nodes, -1, dtype=np.int64)
    labels[target[:, 0]] = target[:, 1]
    graph, _ = undirected_graph(torch.from_numpy(edges), num_nodes)
    labelled = torch.from_numpy(np.flatnonzero(labels >= 0))
    parts = random_split(labelled.numel(), seed, split)
    train_idx, valid_idx, test_idx = (labelled[p] for p in parts)
    return NodeDataset(name=name or folder.name, graph=graph, labels=torch.from_numpy(labels),
                       num_classes=int(labels.max()) + 1, train_idx=train_idx, valid_idx=valid_idx,
                       test_idx=test_idx)


def target_columns(path: Path) -> int:
    """Column count of the target CSV's header line (MUSAE targets carry 2 to 4 columns)."""
    import gzip

    opener = gzip.open if path.name.endswith(".gz") else open
    try:
        with opener(path, "rt") as f:  # type: ignore[operator]
            return len(f.readline().strip().split(","))
    except (OSError, EOFError, UnicodeDecodeError) as exc:
        raise format_error(path, f"unreadable header ({exc})", HOW) from exc
