"""Datasets for dgl-oac: ``load(name_or_dir, root=None, **kwargs)`` -> NodeDataset | LinkDataset | KGDataset.

Sources (graphs are homogeneous DGL graphs on CPU with int64 ids):

* ``"synthetic"``: power-law graph with planted classes, generated in memory
  (:func:`dgl_oac.app.data.synthetic.generate`: ``num_nodes=100_000, avg_degree=10, power=2.1, num_classes=8,
  num_relations=0, task="node"|"link"|"kg", seed=0, homophily=0.8, split=None, num_neg=100``).
* ``"synthetic-mag"``: a heterograph shaped like ogbn-mag (paper/author/institution/field_of_study, features
  and labels on papers), :class:`HeteroNodeDataset` (:func:`dgl_oac.app.data.synthetic_mag.generate_mag`:
  ``num_nodes=100_000, num_classes=8, feat_dim=64, homophily=0.5, seed=0, ...``).
* OGB names (``ogbn-arxiv``, ``ogbl-citation2``, ``ogbl-wikikg2``, ... any in ogb's ``master.csv``), read with
  ogb's own loaders from the data root (``<root>/<name>/<name with _>/`` or ``<root>/<name with _>/``); never
  downloads (use ``scripts/prepare_ogb.py``).
* Shared files under the data root (``<root>/<name>/``): ``cora``,
  ``pubmed`` (Planetoid; PubMed lacks ``allx`` -> ``features=None`` unless ``zero_fill_missing=True``),
  ``coauthor-physics`` (npz; ``features=False`` skips the 1.2 GB dense matrix), ``github-social`` (edge CSV,
  featureless), ``FB15k-237``, ``WN18RR``, ``codex-m`` (triples). Names are case-insensitive.
* A path to a folder or file, whose format is sniffed.

Every named dataset is looked for under one data root: ``root``, else env ``DGL_OAC_DATA``, else
``<repo>/../shared/data`` (:func:`data_root`; the CLI's ``--root``).

Undirected sources give graphs with both directions of every pair and no self loops. Node datasets without a
shipped split get a deterministic random 60/20/20 split from ``seed`` (default 0). Failures raise
:class:`DatasetNotFoundError` (a FileNotFoundError) or :class:`DatasetFormatError` (a ValueError) naming the
path looked at, what was expected and how to obtain it; unknown names raise ValueError listing known names.
"""
from __future__ import annotations

from ._files import DATA_ENV, data_root
from .errors import DatasetFormatError, DatasetNotFoundError
from .ogb_data import load_ogb, ogb_names, ogb_root
from .registry import known_names, load, load_path
from .synthetic import generate as generate_synthetic
from .synthetic_mag import generate_mag
from .types import Dataset, HeteroNodeDataset, KGDataset, LinkDataset, NodeDataset

#: Shared data root as resolved at import (env ``DGL_OAC_DATA`` or ``<repo>/../shared/data``);
#: :func:`data_root` re-reads the environment on every call.
DATA_ROOT = data_root()

__all__ = [
    "load", "load_path", "load_ogb", "generate_synthetic", "generate_mag", "HeteroNodeDataset", "known_names", "ogb_names", "data_root",
    "ogb_root",
    "DATA_ROOT", "DATA_ENV", "NodeDataset", "LinkDataset", "KGDataset", "Dataset",
    "DatasetNotFoundError", "DatasetFormatError",
]
