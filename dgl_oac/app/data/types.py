"""Dataset containers returned by :func:`dgl_oac.app.data.load`.

All tensors live on CPU; node/edge/entity ids are int64. Graphs are homogeneous ``dgl.DGLGraph`` with
int64 ids, except the heterograph of a :class:`HeteroNodeDataset`. A :class:`KGDataset` is its triples: its DGL
graph is built on first use (:attr:`KGDataset.graph`), and :attr:`KGDataset.edge_list` needs no DGL.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Union

from torch import Tensor

from ...sampling.edge_batch import EdgeList


@dataclass
class _Labelled:
    """What every node-classification dataset has: labels and a split of the labelled nodes."""

    name: str
    graph: Any  # dgl.DGLGraph
    labels: Tensor
    num_classes: int
    train_idx: Tensor
    valid_idx: Tensor
    test_idx: Tensor


@dataclass
class NodeDataset(_Labelled):
    """Node classification.

    ``labels`` is int64[N] (-1 marks a node without a label); multi-task OGB sets (ogbn-proteins) keep
    int64[N, T]. ``train_idx``/``valid_idx``/``test_idx`` are sorted int64 node ids. ``features`` is
    float32[N, F] or ``None`` for featureless graphs (then train learnable embeddings).
    """

    features: Optional[Tensor] = None
    ogb_name: Optional[str] = None  # set for OGB data, so callers can use ogb.nodeproppred.Evaluator

    @property
    def num_nodes(self) -> int:
        """Nodes of ``graph``."""
        return self.graph.num_nodes()


@dataclass
class LinkDataset:
    """Homogeneous link prediction (ogbl-citation2 style).

    ``graph`` is the message-passing graph of TRAIN edges only. ``*_edges`` are int64[E, 2] (src, dst).
    ``valid_neg``/``test_neg`` are int64[E_valid, K] negative *tails* per positive edge (citation2 style);
    ``valid_neg_edges``/``test_neg_edges`` are int64[M, 2] negative pairs shared by all positives
    (ogbl-collab/ppa/ddi style). Either pair may be ``None``.
    """

    name: str
    graph: Any  # dgl.DGLGraph
    train_edges: Tensor
    valid_edges: Tensor
    test_edges: Tensor
    valid_neg: Optional[Tensor] = None
    test_neg: Optional[Tensor] = None
    features: Optional[Tensor] = None
    ogb_name: Optional[str] = None
    valid_neg_edges: Optional[Tensor] = None
    test_neg_edges: Optional[Tensor] = None

    @property
    def num_nodes(self) -> int:
        """Nodes of ``graph``."""
        return self.graph.num_nodes()


@dataclass
class KGDataset:
    """Knowledge-graph triples; ``train``/``valid``/``test`` are int64[T, 3] columns (head, relation, tail).

    ``graph`` holds the train triples as edges head->tail with ``edata["etype"]`` = relation id (int64[T]).
    ``negatives`` (optional) holds extra evaluation negatives with documented keys:
    ``"valid_head_neg"``, ``"valid_tail_neg"``, ``"test_head_neg"``, ``"test_tail_neg"``: int64[T, K] entity
    ids per positive (ogbl-wikikg2); ``"valid_false"``, ``"test_false"``: int64[T, 3] verified-false triples
    (CoDEx).
    """

    name: str
    num_entities: int
    num_relations: int
    train: Tensor
    valid: Tensor
    test: Tensor
    entity_names: Optional[List[str]] = None
    relation_names: Optional[List[str]] = None
    ogb_name: Optional[str] = None
    negatives: Optional[Dict[str, Tensor]] = field(default=None, repr=False)
    #: int64[num_entities]: a synthetic KG's planted entity clusters, for diagnostics (models must not use them)
    clusters: Optional[Tensor] = field(default=None, repr=False)

    @property
    def edge_list(self) -> EdgeList:
        """The train triples as edges head->tail with ``edata["etype"]`` (no DGL)."""
        return EdgeList(self.train[:, 0], self.train[:, 2], self.num_entities, {"etype": self.train[:, 1]})

    @property
    def graph(self) -> Any:
        """The train triples as a ``dgl.DGLGraph`` head->tail with ``edata["etype"]``, built on first use."""
        cached = self.__dict__.get("_graph")
        if cached is None:
            from ._graphs import kg_graph  # DGL: only the DGL loader and --mode dgl ask for the graph

            cached = self.__dict__["_graph"] = kg_graph(self.train, self.num_entities)
        return cached


@dataclass
class HeteroNodeDataset(_Labelled):
    """Node classification on a heterograph (ogbn-mag style): ``graph`` has several node and edge types;
    ``labels`` (int64[N_t]) and the sorted ``*_idx`` are ids of ``target_ntype`` nodes; ``features`` maps the
    node types that have features to float32[N_t, F_t] (the others are featureless: learnable embeddings)."""

    features: Dict[str, Tensor]
    target_ntype: str


Dataset = Union[NodeDataset, LinkDataset, KGDataset, HeteroNodeDataset]

__all__ = ["NodeDataset", "LinkDataset", "KGDataset", "HeteroNodeDataset", "Dataset"]
