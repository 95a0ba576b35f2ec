"""Heterographs: a dict of indices and per-node-type tables, split into per-type pieces for the loader.

    embs = {nt: dgl_oac.NodeEmbedding(hg.num_nodes(nt), 64, f"emb_{nt}") for nt in ("author", "institution")}
    opt = dgl_oac.SparseAdam(list(embs.values()), lr=0.01)            # one step() commits every type
    loader = dgl_oac.DataLoader(hg, {"paper": train_ids}, NeighborSampler([10, 5]), embeddings=embs, ...)
    for input_nodes, output_nodes, blocks in loader:
        x = blocks[0].srcdata["emb_author"]["author"]                # or embs["author"](input_nodes["author"])

Why ``embeddings={ntype: NodeEmbedding}``: that is how DGL's own heterograph code holds learnable tables (the
R-GCN ``RelGraphEmbed`` of DGL's rgcn-hetero example and its ogbn-mag scripts keep one ``dgl.nn.NodeEmbedding``
per featureless node type, sized ``g.num_nodes(ntype)``, in a dict keyed by node type, and give one sparse
optimizer ``list(embeds.values())``), and how a heterograph keys everything else (``g.num_nodes(ntype)``,
``srcdata[name] == {ntype: tensor}``). A user passes the dict they already have; each table stays an ordinary
NodeEmbedding (its own name, rows, checkpoint entry and :class:`~dgl_oac.engine.pipeline.TablePipeline`), so OAC
validates each type on its own, exactly as for a homogeneous table. A type's rows arrive as
``blocks[0].srcnodes[ntype].data[emb.name]``, i.e. ``blocks[0].srcdata[emb.name][ntype]``, where DGL keeps
per-type node data; with no blocks, as ``pair_graph.nodes[ntype].data[emb.name]``.

Indices follow ``dgl.dataloading.DataLoader``: ``{ntype: node ids}`` or, for edge prediction,
``{etype: edge ids}`` (a canonical etype or an unambiguous name). All types are shuffled together and each
batch is ``{type: ids}`` with the types present in it, in key order, as DGL batches them.
"""
from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Tuple, Union

import dgl
import torch

from ..embedding import NodeEmbedding
from ..tables import Embeddings, check_embedding, check_unique_names, unwrap_all
from .inputs import Inputs, samples_edges
from ..engine.table import check_ids

TypeKey = Union[str, Tuple[str, str, str]]


def _key(graph: dgl.DGLGraph, key: Any, edge: bool) -> TypeKey:
    """The graph's name of a node type, or the canonical edge type; a clear error for an unknown one."""
    if edge:
        try:
            return graph.to_canonical_etype(key)
        except Exception:  # noqa: BLE001 - DGL raises DGLError (unknown or ambiguous) or TypeError
            raise ValueError(f"unknown edge type {key!r} in indices; the graph has {graph.canonical_etypes}") \
                from None
    if key not in graph.ntypes:
        raise ValueError(f"unknown node type {key!r} in indices; the graph has {graph.ntypes}")
    return key


def _only(names: List[Any], what: str) -> Any:
    if len(names) != 1:
        raise TypeError(f"the graph has several {what}s {names}: pass indices as a dict {{{what}: ids}}")
    return names[0]


class HeteroInputs:
    """Indices ``{type: ids}`` flattened into one shuffled order, and tables bound to node types
    (``embeddings={ntype: NodeEmbedding}``). Same interface as :class:`dgl_oac.dgl_frontend.inputs.Inputs`."""

    def __init__(self, graph: dgl.DGLGraph, indices: Any, graph_sampler: Any, embeddings: Embeddings) -> None:
        edge = samples_edges(graph_sampler)
        if not isinstance(indices, Mapping):
            indices = {_only(graph.canonical_etypes if edge else graph.ntypes, "edge type" if edge else
                             "node type"): indices}
        self.keys: List[TypeKey] = []
        ids, types = [], []
        for key, part in indices.items():
            key = _key(graph, key, edge)
            if key in self.keys:
                raise ValueError(f"{'edge' if edge else 'node'} type {key!r} appears twice in indices")
            part = torch.as_tensor(part)
            what = f"indices of edge type {key!r} (edge ids)" if edge else f"indices of node type {key!r}"
            check_ids(part, graph.num_edges(key) if edge else graph.num_nodes(key), what)
            ids.append(part)
            types.append(torch.full((part.numel(),), len(self.keys), dtype=torch.int64))
            self.keys.append(key)
        self._ids = torch.cat(ids) if ids else torch.zeros(0, dtype=torch.int64)
        self._types = torch.cat(types) if types else torch.zeros(0, dtype=torch.int64)
        self.indices = torch.arange(self._ids.numel())  # what an epoch shuffles: positions into _ids/_types
        self.embeddings, self.ntypes = self._bind(graph, embeddings)

    @staticmethod
    def _bind(graph: dgl.DGLGraph, embeddings: Embeddings) -> Tuple[List[NodeEmbedding], List[Optional[str]]]:
        if isinstance(embeddings, Mapping):
            pairs = list(embeddings.items())
        else:  # a list: every table holds rows of the graph's one node type
            pairs = [(graph.ntypes[0], e) for e in embeddings]
            if pairs and len(graph.ntypes) > 1:
                raise TypeError(f"on a graph with node types {graph.ntypes}, pass embeddings={{ntype: "
                                f"NodeEmbedding}} (each table holds the rows of one node type)")
        embs: List[NodeEmbedding] = []
        ntypes: List[Optional[str]] = []
        for ntype, emb in pairs:
            if ntype not in graph.ntypes:
                raise ValueError(f"embeddings: unknown node type {ntype!r}; the graph has {graph.ntypes}")
            if any(e is emb for e in embs):
                raise ValueError(f"NodeEmbedding {emb.name!r} is bound to two node types; each type needs its "
                                 f"own table")
            check_embedding(emb, graph.num_nodes(ntype), f"node type {ntype!r} of the graph")
            embs.append(emb)
            ntypes.append(ntype)
        check_unique_names(embs)
        return embs, ntypes

    def seeds(self, part: torch.Tensor) -> Dict[TypeKey, torch.Tensor]:
        """``{type: int64[b_t]}`` for the slice ``part: int64[b]`` of the shuffled positions: the types present,
        in key order, each type's ids in batch order (as ``dgl.dataloading`` splits a heterogeneous batch)."""
        types, ids = self._types[part], self._ids[part]
        return {self.keys[t]: ids[types == t] for t in torch.unique(types).tolist()}

    def table_ids(self, result: Any) -> List[torch.Tensor]:
        """Per table, the batch's input nodes of its node type (``int64[n_t], CPU``; empty if none)."""
        nodes = result[0]
        if not isinstance(nodes, Mapping):
            if len(set(self.ntypes)) > 1:
                raise TypeError("the sampler returned homogeneous input_nodes (a tensor) for tables of several "
                                f"node types {self.ntypes}")
            return [nodes] * len(self.embeddings)
        empty = torch.zeros(0, dtype=torch.int64)
        return [nodes.get(nt, empty) for nt in self.ntypes]


def bind_inputs(graph: dgl.DGLGraph, indices: Any, graph_sampler: Any, embeddings: Embeddings) -> Any:
    """:class:`HeteroInputs` for a heterograph, a dict of indices or a dict of embeddings, else
    :class:`dgl_oac.dgl_frontend.inputs.Inputs` (the homogeneous loader, unchanged). ``graph``: a DGLGraph or a
    ``dgl.distributed.DistGraph`` (which has no ``is_homogeneous``: one node and one edge type is the same test).
    ``embeddings`` may hold ``dgl_oac.nn.Embedding`` modules (their ``node_embedding`` is used)."""
    embeddings = unwrap_all(embeddings)  # dgl_oac.nn.Embedding modules: their NodeEmbedding
    homogeneous = len(graph.ntypes) == 1 and len(graph.canonical_etypes) == 1
    if isinstance(indices, Mapping) or isinstance(embeddings, Mapping) or not homogeneous:
        return HeteroInputs(graph, indices, graph_sampler, embeddings)
    return Inputs(graph, indices, graph_sampler, embeddings)
