"""Edge mini-batches whose message passing runs over the WHOLE graph: OGB's full-batch link baselines.

OGB's GraphSAGE baseline for ogbl-ddi (``examples/linkproppred/ddi/gnn.py``) encodes every node with the whole
training graph at every batch, then scores the batch's positive edges and as many uniformly random node pairs.
On a graph that dense (4,267 nodes, average degree about 500) a neighbour sampler would touch every node anyway,
and excluding each batch's 64K target edges from 2M (``as_edge_prediction_sampler(exclude=...)``) costs far more
than the layers themselves. Here the full-graph block is built once per graph and shared by every batch.

``FullGraphEdgeSampler(num_layers, negatives).sample(g, seed_edges)`` -> ``(input_nodes, pair_graph,
neg_pair_graph, blocks)``, DGL's edge-prediction layout:

* ``input_nodes``: ``int64[N]`` = ``arange(N)``, every node (the loader gathers every embedding row);
* ``pair_graph``: the seed edges over all ``N`` nodes (``edata[dgl.EID]`` = their ids);
* ``neg_pair_graph``: ``negatives`` pairs per seed edge, both ends uniform over ``[0, N)`` and, as OGB's
  ``negative_sampling`` does, never an edge of ``g`` (on ogbl-ddi about 12% of random pairs are edges: training
  them as negatives pushes down pairs of the kind the model must rank high); rejected pairs are drawn again.
  From torch's global CPU generator (which the dgl-oac loader seeds per batch);
* ``blocks``: ``num_layers`` views of one block holding every edge of ``g``, with ``N`` source and ``N``
  destination nodes in id order. Each is a ``local_var()``, so the rows the loader attaches to
  ``blocks[0].srcdata`` belong to that batch alone while the structure (and its sparse formats) is shared.
"""
from __future__ import annotations

from typing import List, Optional, Tuple

import dgl
import torch
from torch import Tensor


class FullGraphEdgeSampler(dgl.dataloading.Sampler):
    """See the module docstring. num_layers: GNN layers (>= 1); negatives: random pairs per positive (>= 1)."""

    samples_edges = True  # its seeds are edge ids (the dgl-oac loader checks them against num_edges)

    def __init__(self, num_layers: int, negatives: int = 1) -> None:
        super().__init__()
        if not isinstance(num_layers, int) or num_layers < 1:
            raise ValueError(f"num_layers must be a positive integer, got {num_layers!r}")
        if not isinstance(negatives, int) or negatives < 1:
            raise ValueError(f"negatives must be a positive integer, got {negatives!r}")
        self.num_layers, self.negatives = num_layers, negatives
        # (graph, its full block, its sorted edge keys src * N + dst: int64[E], CPU)
        self._cached: Optional[Tuple[dgl.DGLGraph, dgl.DGLGraph, Tensor]] = None

    def _cache(self, g: dgl.DGLGraph) -> Tuple[dgl.DGLGraph, dgl.DGLGraph, Tensor]:
        if self._cached is None or self._cached[0] is not g:
            src, dst = g.edges()
            n = g.num_nodes()
            block = dgl.create_block((src, dst), num_src_nodes=n, num_dst_nodes=n, idtype=g.idtype,
                                     device=g.device)
            block.create_formats_()  # once here, not in every batch's first message pass
            keys = torch.sort(src.cpu().long() * n + dst.cpu().long()).values
            if keys.numel() >= n * n:
                raise ValueError(f"every pair of the graph's {n} nodes is an edge: no negative pair to draw")
            self._cached = (g, block, keys)
        return self._cached

    def full_block(self, g: dgl.DGLGraph) -> dgl.DGLGraph:
        """The block of every edge of ``g`` (src = dst = all nodes, in id order), built once per graph."""
        return self._cache(g)[1]

    def negative_pairs(self, g: dgl.DGLGraph, m: int) -> Tuple[Tensor, Tensor]:
        """``m`` uniformly random pairs ``(src, dst): int64[m]`` (CPU) that are not edges of ``g``."""
        n, keys = g.num_nodes(), self._cache(g)[2]
        pairs = torch.randint(n, (2, m))
        todo = torch.arange(m if keys.numel() else 0)
        while todo.numel():  # each round keeps the pairs that are not edges and redraws the rest
            key = pairs[0, todo] * n + pairs[1, todo]
            pos = torch.searchsorted(keys, key).clamp_max_(keys.numel() - 1)
            todo = todo[keys[pos] == key]
            if todo.numel():
                pairs[:, todo] = torch.randint(n, (2, todo.numel()))
        return pairs[0], pairs[1]

    def sample(self, g: dgl.DGLGraph, seed_edges: Tensor) -> Tuple[Tensor, dgl.DGLGraph, dgl.DGLGraph,
                                                                  List[dgl.DGLGraph]]:
        if g.is_block or len(g.ntypes) != 1 or len(g.etypes) != 1:
            raise TypeError("FullGraphEdgeSampler needs a homogeneous graph")
        block = self.full_block(g)
        n = g.num_nodes()
        seed_edges = seed_edges.to(g.device)
        src, dst = g.find_edges(seed_edges)
        pair = dgl.graph((src, dst), num_nodes=n, idtype=g.idtype, device=g.device)
        pair.edata[dgl.EID] = seed_edges
        neg_src, neg_dst = self.negative_pairs(g, seed_edges.numel() * self.negatives)
        neg = dgl.graph((neg_src.to(g.device), neg_dst.to(g.device)), num_nodes=n, idtype=g.idtype, device=g.device)
        input_nodes = torch.arange(n, dtype=g.idtype, device=g.device)
        return input_nodes, pair, neg, [block.local_var() for _ in range(self.num_layers)]


__all__ = ["FullGraphEdgeSampler"]
