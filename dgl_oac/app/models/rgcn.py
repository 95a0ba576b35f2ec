"""R-GCN over DGL blocks of a heterograph (``dgl.nn.HeteroGraphConv``), for node classification.

Inputs per node type: fixed features (ogbn-mag's papers) or, for featureless types, the rows of a learnable
table that the dgl-oac loader attaches as ``blocks[0].srcdata[emb.name][ntype]`` (see
:mod:`dgl_oac.dgl_frontend.hetero`). Each type's input is first projected to ``hidden_dim`` by its own linear map, so the
types may differ in width. A layer is Schlichtkrull et al.'s R-GCN: per relation a mean over neighbours
(``GraphConv(norm="right")``), summed over relations, plus a self-connection, ReLU and dropout between layers.
Every op is deterministic on CPU (sparse matrix products, no scatter-add over atomic indices), so two runs of
the same batch stream are bitwise equal.

The blocks are DGL's (CPU, or a CUDA build of DGL) or :class:`~dgl_oac.dgl_frontend.blocks.HeteroIndexBlock` (a device
without DGL's CUDA build): the same layer with ``GraphConv``'s weights, per relation a deterministic segment
mean (:func:`~dgl_oac.dgl_frontend.blocks.aggregate`), equal to DGL's kernels within float rounding. Over index blocks the
backward is deterministic on CUDA too (no atomics); DGL's own CUDA kernels make no such promise.
"""
from __future__ import annotations

from typing import Dict, List, Sequence

import dgl
import torch.nn.functional as F
from dgl.nn import GraphConv, HeteroGraphConv
from torch import Tensor, nn

from ...dgl_frontend.blocks import HeteroIndexBlock, aggregate


class RGCN(nn.Module):
    """``RGCN(in_dims={ntype: width}, hidden_dim, out_dim, rel_names, num_layers, dropout)``.

    forward(blocks, x): ``num_layers`` blocks; ``x = {ntype: float32[num_src(blocks[0], ntype), in_dims[ntype]]}``
    on the blocks' device (every type of ``in_dims`` that has source nodes) ->
    ``{ntype: float32[num_dst(blocks[-1], ntype), out_dim]}`` for the destination types of the last block.
    """

    def __init__(self, in_dims: Dict[str, int], hidden_dim: int, out_dim: int, rel_names: Sequence[str],
                 num_layers: int = 2, dropout: float = 0.0) -> None:
        super().__init__()
        if num_layers < 1:
            raise ValueError("RGCN needs num_layers >= 1")
        self.inputs = nn.ModuleDict({nt: nn.Linear(d, hidden_dim) for nt, d in in_dims.items()})
        dims = [hidden_dim] * num_layers + [out_dim]
        self.convs = nn.ModuleList(
            HeteroGraphConv({r: GraphConv(dims[i], dims[i + 1], norm="right", allow_zero_in_degree=True)
                             for r in rel_names}, aggregate="sum") for i in range(num_layers))
        self.loops = nn.ModuleList(
            nn.ModuleDict({nt: nn.Linear(dims[i], dims[i + 1], bias=False) for nt in in_dims})
            for i in range(num_layers))
        self.dropout = nn.Dropout(dropout)

    def forward(self, blocks: List[dgl.DGLGraph], x: Dict[str, Tensor]) -> Dict[str, Tensor]:
        if len(blocks) != len(self.convs):
            raise ValueError(f"got {len(blocks)} blocks for {len(self.convs)} layers")
        unknown = set(x) - set(self.inputs)
        if unknown:
            raise ValueError(f"inputs for node types {sorted(unknown)} that the model has no projection for")
        h = {nt: self.inputs[nt](v) for nt, v in x.items()}
        last = len(self.convs) - 1
        for i, (block, conv, loop) in enumerate(zip(blocks, self.convs, self.loops)):
            out = _index_conv(conv, block, h) if isinstance(block, HeteroIndexBlock) else conv(block, h)
            # every destination type keeps a state through its self-connection, also with no in-edges here
            h = {nt: loop[nt](h[nt][: block.num_dst_nodes(nt)]) + out[nt] if nt in out
                 else loop[nt](h[nt][: block.num_dst_nodes(nt)])
                 for nt in block.dsttypes if nt in h and block.num_dst_nodes(nt)}
            if i != last:
                h = {nt: self.dropout(F.relu(v)) for nt, v in h.items()}
        return h


def _index_conv(conv: HeteroGraphConv, block: HeteroIndexBlock, h: Dict[str, Tensor]) -> Dict[str, Tensor]:
    """``HeteroGraphConv(aggregate="sum")`` of ``GraphConv(norm="right")`` modules over index tensors: per relation
    with edges, ``mean over in-edges(h_src) @ W + b`` (DGL multiplies first when that is narrower: the same
    product), summed per destination type. Relations without edges are skipped, as DGL's module does."""
    out: Dict[str, Tensor] = {}
    for (stype, etype, dtype), rel in block.rels.items():
        if stype not in h or rel.num_edges() == 0:
            continue
        mod = conv.mods[etype]
        x = h[stype][: rel.num_src]
        if mod.weight.shape[0] > mod.weight.shape[1]:
            y = aggregate(rel, x @ mod.weight, "mean")
        else:
            y = aggregate(rel, x, "mean") @ mod.weight
        if mod.bias is not None:
            y = y + mod.bias
        out[dtype] = out[dtype] + y if dtype in out else y
    return out
