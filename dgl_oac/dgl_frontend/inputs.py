"""What a loader's indices and a batch's input nodes mean for its tables (homogeneous graphs).

A loader shuffles and slices one ``int64[n]`` tensor (``indices``); ``seeds(part)`` turns a slice into what the
sampler takes, and ``table_ids(result)`` gives each table the ids of the sampler's ``input_nodes`` it holds
rows for. On a homogeneous graph both are the identity: every table holds a row per node. Heterographs (a dict
of indices or of embeddings, several node or edge types) bind through :mod:`dgl_oac.dgl_frontend.hetero`; the
loader is the same for both (the loader calls :func:`dgl_oac.dgl_frontend.hetero.bind_inputs`).
"""
from __future__ import annotations

from typing import Any, List, Optional, Sequence

import dgl
import torch

from ..embedding import NodeEmbedding
from ..engine.table import check_ids
from ..tables import check_embedding, check_unique_names


def samples_edges(graph_sampler: Any) -> bool:
    """Whether the sampler's seeds are edge ids (DGL's edge prediction samplers, ours)."""
    return hasattr(graph_sampler, "negative_sampler") or bool(getattr(graph_sampler, "samples_edges", False))


class Inputs:
    """A homogeneous graph: the indices are node (or edge) ids, every table is read at ``input_nodes``."""

    def __init__(self, graph: dgl.DGLGraph, indices: Any, graph_sampler: Any,
                 embeddings: Sequence[NodeEmbedding]) -> None:
        self.indices = torch.as_tensor(indices)
        self.embeddings: List[NodeEmbedding] = list(embeddings)
        self.ntypes: List[Optional[str]] = [None] * len(self.embeddings)  # the node type of each table's rows
        edge = samples_edges(graph_sampler)
        check_ids(self.indices, graph.num_edges() if edge else graph.num_nodes(),
                  "indices (" + ("edge" if edge else "node") + " ids)")
        check_unique_names(self.embeddings)
        for emb in self.embeddings:
            check_embedding(emb, graph.num_nodes(), "the graph")

    def seeds(self, part: torch.Tensor) -> Any:
        """What the sampler takes for the slice ``part: int64[b]`` of the (shuffled) indices."""
        return part

    def table_ids(self, result: Any) -> List[torch.Tensor]:
        """Per table, the ids ``int64[n], CPU`` of the batch's input nodes it holds rows for."""
        ids = result[0]
        if isinstance(ids, dict):
            raise TypeError("the sampler returned heterogeneous input_nodes (a dict) for a homogeneous loader: "
                            "pass embeddings={ntype: NodeEmbedding} (see dgl_oac.dgl_frontend.hetero)")
        return [ids] * len(self.embeddings)

