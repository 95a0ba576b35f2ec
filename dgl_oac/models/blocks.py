"""Sampled graph structure as torch index tensors, and message passing in torch ops.

PyPI's DGL wheels are CPU builds: their blocks cannot move to a GPU. An :class:`IndexBlock` (a DGL block's
edges) or :class:`IndexGraph` (a pair graph's edges) carries the same structure as int64 tensors, which any
device holds; the built-in models (:class:`~dgl_oac.models.sage.SAGE`, :class:`~dgl_oac.models.link.LinkPredictor`)
take them in place of DGL graphs and aggregate with :func:`aggregate`. With a CUDA build of DGL, hand the
models DGL's own blocks (on the device) and DGL's kernels run instead.

Edges are sorted by destination (stable) when built, on the host, so that aggregation is a segment reduce over
known lengths: deterministic on every device (``index_add_`` with duplicate indices is not, on CUDA) and with
no host sync (the lengths are computed before the copy).

Like DGL graphs they have ``srcdata``/``dstdata``/``ndata`` dicts, where the loader attaches a batch's rows.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Dict, List, Tuple

import dgl
import torch
from torch import Tensor


@dataclass(eq=False)
class IndexBlock:
    """One message-passing layer: ``src, dst: int64[E]`` local node ids (``dst`` sorted), ``in_deg: int64
    [num_dst]`` (``dst``'s run lengths), on one device. Destination node i is source node i (DGL's blocks)."""

    src: Tensor
    dst: Tensor
    in_deg: Tensor
    num_src: int
    num_dst: int
    srcdata: Dict[str, Any] = field(default_factory=dict)
    dstdata: Dict[str, Any] = field(default_factory=dict)

    is_block = True

    @classmethod
    def from_dgl(cls, block: dgl.DGLGraph) -> "IndexBlock":
        """The structure of a homogeneous DGL block (CPU) -> an IndexBlock on the CPU."""
        if len(block.canonical_etypes) != 1 or len(block.srctypes) != 1:
            raise TypeError("IndexBlock carries homogeneous blocks only; heterogeneous models need DGL's "
                            "blocks on the device (a CUDA build of DGL)")
        src, dst = (t.long() for t in block.edges())
        order = torch.argsort(dst, stable=True)
        n_dst = block.num_dst_nodes()
        return cls(src[order], dst[order], torch.bincount(dst, minlength=n_dst), block.num_src_nodes(), n_dst)

    def num_src_nodes(self) -> int:
        return self.num_src

    def num_dst_nodes(self) -> int:
        return self.num_dst

    def num_edges(self) -> int:
        return int(self.src.shape[0])

    def tensors(self) -> List[Tensor]:
        return [self.src, self.dst, self.in_deg]

    def with_tensors(self, tensors: List[Tensor]) -> "IndexBlock":
        """The same structure over ``tensors`` (from :meth:`tensors`, e.g. copied to a device); no data."""
        src, dst, in_deg = tensors
        return replace(self, src=src, dst=dst, in_deg=in_deg, srcdata={}, dstdata={})


@dataclass(eq=False)
class IndexGraph:
    """A pair graph's edges ``src, dst: int64[E]`` over ``num_nodes`` nodes (positive or negative pairs)."""

    src: Tensor
    dst: Tensor
    n: int
    ndata: Dict[str, Any] = field(default_factory=dict)

    is_block = False

    @classmethod
    def from_dgl(cls, graph: dgl.DGLGraph) -> "IndexGraph":
        if len(graph.canonical_etypes) != 1 or len(graph.ntypes) != 1:
            raise TypeError("IndexGraph carries homogeneous graphs only")
        src, dst = (t.long() for t in graph.edges())
        return cls(src, dst, graph.num_nodes())

    def edges(self) -> Tuple[Tensor, Tensor]:
        return self.src, self.dst

    def num_nodes(self) -> int:
        return self.n

    def num_edges(self) -> int:
        return int(self.src.shape[0])

    def tensors(self) -> List[Tensor]:
        return [self.src, self.dst]

    def with_tensors(self, tensors: List[Tensor]) -> "IndexGraph":
        src, dst = tensors
        return replace(self, src=src, dst=dst, ndata={})


def aggregate(block: IndexBlock, x_src: Tensor, how: str = "mean") -> Tensor:
    """``x_src: float[num_src, D]`` -> ``float[num_dst, D]``: each destination's ``how`` ("mean" or "sum") over
    its in-edges' sources, 0 for none. A segment reduce over ``dst``'s runs: deterministic, no host sync."""
    if how not in ("mean", "sum"):
        raise ValueError(f"IndexBlock aggregates with 'mean' or 'sum', got {how!r} (other SAGE aggregators "
                         f"need DGL's blocks on the device)")
    if x_src.shape[0] != block.num_src:
        raise ValueError(f"x_src has {x_src.shape[0]} rows for a block of {block.num_src} source nodes")
    msgs = x_src.index_select(0, block.src)
    return torch.segment_reduce(msgs, how, lengths=block.in_deg, unsafe=True, initial=0)


__all__ = ["IndexBlock", "IndexGraph", "aggregate"]
