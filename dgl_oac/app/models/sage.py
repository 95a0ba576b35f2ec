"""GraphSAGE over DGL blocks, plus memory-bounded layer-wise full-graph inference.

Learnable embeddings and fixed features: the dgl-oac loader attaches a batch's embedding
rows as ``blocks[0].srcdata[name]``. To use both, concatenate on the caller's side,
``x = torch.cat([emb_rows, feats[input_nodes].to(emb_rows.device)], 1)``, and build
``SAGE(in_dim=emb_dim + feat_dim, ...)``; :class:`NodeClassifier` does exactly that.
"""
from __future__ import annotations

from typing import Any, Callable, List, Optional, Union

import dgl
import torch
import torch.nn.functional as F
from dgl.nn import SAGEConv
from torch import Tensor, nn

from ...dgl_frontend.blocks import IndexBlock, aggregate, graph_to

# x_all for inference: a full [N, in_dim] tensor (any device) or a row fetcher
# ``fn(node_ids int64[n] on the graph's device) -> float32[n, in_dim]``.
RowSource = Union[Tensor, Callable[[Tensor], Tensor]]


class IndexSAGEConv(SAGEConv):
    """DGL's ``SAGEConv`` (same parameters, same state_dict) that also takes an :class:`~.blocks.IndexBlock`,
    aggregating in torch ops: the device path without a CUDA build of DGL. DGL graphs go to DGL's kernels."""

    def forward(self, graph: Any, feat: Tensor, edge_weight: Optional[Tensor] = None) -> Tensor:
        if not isinstance(graph, IndexBlock):
            return super().forward(graph, feat, edge_weight)
        if self._aggre_type != "mean" or edge_weight is not None:
            raise ValueError(f"SAGE over an IndexBlock: aggregator 'mean' without edge weights only (got "
                             f"{self._aggre_type!r}); others need DGL's blocks on the device")
        feat_src = self.feat_drop(feat)
        h_self = feat_src[:graph.num_dst]
        if self._in_src_feats > self._out_feats:  # as DGL: the smaller width travels the edges
            h_neigh = aggregate(graph, self.fc_neigh(feat_src))
        else:
            h_neigh = self.fc_neigh(aggregate(graph, feat_src))
        rst = self.fc_self(h_self) + h_neigh
        if self.activation is not None:
            rst = self.activation(rst)
        return rst if self.norm is None else self.norm(rst)


class SAGE(nn.Module):
    """``num_layers`` SAGEConv layers with ReLU + dropout between them (none after the last).

    forward(blocks, x): blocks are ``num_layers`` DGL blocks or :class:`~.blocks.IndexBlock` (any device, no
    CUDA build of DGL needed), x: float32[num_src(blocks[0]), in_dim] on the blocks' device
    -> float32[num_dst(blocks[-1]), out_dim].
    """

    def __init__(self, in_dim: int, hidden_dim: int, out_dim: int, num_layers: int = 2,
                 dropout: float = 0.0, aggregator: str = "mean") -> None:
        super().__init__()
        if num_layers < 1:
            raise ValueError("SAGE needs num_layers >= 1 (use no encoder for shallow models)")
        dims = [in_dim] + [hidden_dim] * (num_layers - 1) + [out_dim]
        self.layers = nn.ModuleList(
            IndexSAGEConv(dims[i], dims[i + 1], aggregator) for i in range(num_layers))
        self.dropout = nn.Dropout(dropout)
        self.dims = dims  # dims[i] -> dims[i + 1] is layer i
        self.in_dim, self.out_dim = in_dim, out_dim

    @property
    def num_layers(self) -> int:
        """SAGEConv layers (the blocks ``forward`` takes)."""
        return len(self.layers)

    def layer_forward(self, i: int, block: dgl.DGLGraph, h: Tensor) -> Tensor:
        """Layer ``i`` on one block (shared by :meth:`forward` and :func:`sage_inference`)."""
        h = self.layers[i](block, h)
        if i != len(self.layers) - 1:
            h = self.dropout(F.relu(h))
        return h

    def forward(self, blocks: List[dgl.DGLGraph], x: Tensor) -> Tensor:
        if len(blocks) != len(self.layers):
            raise ValueError(f"got {len(blocks)} blocks for {len(self.layers)} layers")
        h = x
        for i, block in enumerate(blocks):
            h = self.layer_forward(i, block, h)
        return h


def _fetch(source: RowSource, nodes: Tensor) -> Tensor:
    if callable(source) and not isinstance(source, Tensor):
        return source(nodes)
    return source[nodes.to(source.device)]


@torch.no_grad()
def sage_inference(model: SAGE, graph: dgl.DGLGraph, x_all: RowSource, batch_size: int,
                   device: Union[str, torch.device], buffer_device: Union[str, torch.device] = "cpu"
                   ) -> Tensor:
    """Exact full-neighbour outputs for every node, one layer at a time, in node chunks.

    Per layer, each chunk of ``batch_size`` destination nodes gets a one-hop
    full-neighbour block; only that block and its input rows go to ``device``. Peak device
    memory is O(batch_size * max in-degree * dim); the per-layer outputs live on
    ``buffer_device`` (float32[N, dim]). x_all: float[N, in_dim] (any device) or a row
    fetcher (see ``RowSource``). Returns float32[N, out_dim] on ``buffer_device``.
    The model is put in eval mode (dropout off) and left there.
    """
    model.eval()
    sampler = dgl.dataloading.MultiLayerFullNeighborSampler(1)
    nodes = graph.nodes()
    h: RowSource = x_all
    for i in range(model.num_layers):
        y = torch.empty(graph.num_nodes(), model.dims[i + 1], device=buffer_device)
        for start in range(0, graph.num_nodes(), batch_size):
            seeds = nodes[start:start + batch_size]
            input_nodes, _, (block,) = sampler.sample(graph, seeds)
            x = _fetch(h, input_nodes).to(device)
            y[start:start + seeds.shape[0]] = model.layer_forward(i, graph_to(block, device), x).to(
                buffer_device)
        h = y
    return h


class NodeClassifier(nn.Module):
    """SAGE over ``x = cat(emb_rows, feats)``: learnable embeddings plus optional fixed features.

    forward(blocks, emb float32[n_src, emb_dim], feats float32[n_src, feat_dim] or None)
    -> logits float32[n_dst, num_classes], on the blocks' device.
    """

    def __init__(self, emb_dim: int, feat_dim: int, hidden: int, num_classes: int,
                 num_layers: int = 2, dropout: float = 0.0, aggregator: str = "mean") -> None:
        super().__init__()
        self.emb_dim, self.feat_dim = emb_dim, feat_dim
        self.sage = SAGE(emb_dim + feat_dim, hidden, num_classes, num_layers, dropout,
                         aggregator)

    def _join(self, emb: Tensor, feats: Optional[Tensor]) -> Tensor:
        if self.feat_dim == 0:
            return emb
        if feats is None:
            raise ValueError("this classifier was built with feat_dim > 0: pass feats")
        return torch.cat([emb, feats.to(emb.device, emb.dtype)], dim=1)

    def forward(self, blocks: List[dgl.DGLGraph], emb: Tensor,
                feats: Optional[Tensor] = None) -> Tensor:
        return self.sage(blocks, self._join(emb, feats))

    def inference(self, graph: dgl.DGLGraph, emb_all: Tensor, feats_all: Optional[Tensor],
                  batch_size: int, device: Union[str, torch.device]) -> Tensor:
        """Full-graph logits float32[N, num_classes] (CPU); rows are joined per chunk, so
        the [N, emb_dim + feat_dim] concatenation is never materialised."""
        def rows(nodes: Tensor) -> Tensor:
            e = emb_all[nodes.to(emb_all.device)]
            f = None if feats_all is None else feats_all[nodes.to(feats_all.device)]
            return self._join(e, f)
        return sage_inference(self.sage, graph, rows, batch_size, device)


__all__ = ["SAGE", "IndexSAGEConv", "sage_inference", "NodeClassifier"]
