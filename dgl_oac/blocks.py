"""Sampled graph structure as torch index tensors, and message passing in torch ops.

PyPI's DGL wheels are CPU builds: their blocks cannot move to a GPU. An :class:`IndexBlock` (a DGL block's
edges) or :class:`IndexGraph` (a pair graph's edges) carries the same structure as int64 tensors, which any
device holds; the built-in models (:class:`~dgl_oac.app.models.sage.SAGE`, :class:`~dgl_oac.app.models.link.LinkPredictor`)
take them in place of DGL graphs and aggregate with :func:`aggregate`. With a CUDA build of DGL, hand the
models DGL's own blocks (on the device) and DGL's kernels run instead.

Edges are sorted by destination (stable) when built, on the host, so that aggregation is a segment reduce over
known lengths: deterministic on every device (``index_add_`` with duplicate indices is not, on CUDA) and with
no host sync (the lengths are computed before the copy).

Like DGL graphs they have ``srcdata``/``dstdata``/``edata`` (blocks) or ``ndata``/``edata`` (graphs) dicts of
tensors: the sampler's (``dgl.NID``, ``dgl.EID``, a KG's ``"etype"``) travel with the structure, and the loader
attaches a batch's rows there.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field, replace
from typing import Any, Dict, List, Sequence, Tuple, Union

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
    edata: Dict[str, Any] = field(default_factory=dict)

    is_block = True
    _DATA = ("srcdata", "dstdata", "edata")

    @classmethod
    def from_dgl(cls, block: dgl.DGLGraph) -> "IndexBlock":
        """The structure of a homogeneous DGL block (CPU) -> an IndexBlock on the CPU."""
        if len(block.canonical_etypes) != 1 or len(block.srctypes) != 1:
            raise TypeError("IndexBlock carries homogeneous blocks only; heterogeneous models need DGL's "
                            "blocks on the device (a CUDA build of DGL)")
        src, dst = (t.long() for t in block.edges())
        order = torch.argsort(dst, stable=True)
        n_dst = block.num_dst_nodes()
        return cls(src[order], dst[order], torch.bincount(dst, minlength=n_dst), block.num_src_nodes(), n_dst,
                   dict(block.srcdata), dict(block.dstdata), {k: v[order] for k, v in block.edata.items()})

    def num_src_nodes(self) -> int:
        """Number of source nodes (DGL's ``DGLBlock.num_src_nodes``)."""
        return self.num_src

    def num_dst_nodes(self) -> int:
        """Number of destination nodes (DGL's ``DGLBlock.num_dst_nodes``)."""
        return self.num_dst

    def num_edges(self) -> int:
        """Number of edges ``E``."""
        return int(self.src.shape[0])

    def tensors(self) -> List[Tensor]:
        """Structure, then data tensors: what a copy to a device moves (:meth:`with_tensors` takes it back)."""
        return [self.src, self.dst, self.in_deg] + _data_tensors(self)

    def with_tensors(self, tensors: Sequence[Tensor]) -> "IndexBlock":
        """The same block over ``tensors`` (from :meth:`tensors`, e.g. copied to a device)."""
        src, dst, in_deg = tensors[:3]
        return replace(self, src=src, dst=dst, in_deg=in_deg, **_data_from(self, tensors[3:]))


@dataclass(eq=False)
class IndexGraph:
    """A pair graph's edges ``src, dst: int64[E]`` over ``num_nodes`` nodes (positive or negative pairs)."""

    src: Tensor
    dst: Tensor
    n: int
    ndata: Dict[str, Any] = field(default_factory=dict)
    edata: Dict[str, Any] = field(default_factory=dict)

    is_block = False
    _DATA = ("ndata", "edata")

    @classmethod
    def from_dgl(cls, graph: dgl.DGLGraph) -> "IndexGraph":
        if len(graph.canonical_etypes) != 1 or len(graph.ntypes) != 1:
            raise TypeError("IndexGraph carries homogeneous graphs only")
        src, dst = (t.long() for t in graph.edges())
        return cls(src, dst, graph.num_nodes(), dict(graph.ndata), dict(graph.edata))

    def edges(self) -> Tuple[Tensor, Tensor]:
        """``(src, dst)``, ``int64[E]`` each, on the graph's device (DGL's ``edges()``)."""
        return self.src, self.dst

    def num_nodes(self, ntype: Any = None) -> int:
        """Number of nodes (``ntype`` is accepted for DGL's signature; the graph has one type)."""
        return self.n

    def num_edges(self) -> int:
        """Number of edges ``E``."""
        return int(self.src.shape[0])

    def tensors(self) -> List[Tensor]:
        """Structure, then data tensors: what a copy to a device moves (:meth:`with_tensors` takes it back)."""
        return [self.src, self.dst] + _data_tensors(self)

    def with_tensors(self, tensors: Sequence[Tensor]) -> "IndexGraph":
        """The same graph over ``tensors`` (from :meth:`tensors`, e.g. copied to a device)."""
        return replace(self, src=tensors[0], dst=tensors[1], **_data_from(self, tensors[2:]))


def _data_tensors(graph: Any) -> List[Tensor]:
    return [t for name in graph._DATA for t in getattr(graph, name).values()]


def _data_from(graph: Any, tensors: Sequence[Tensor]) -> Dict[str, Dict[str, Tensor]]:
    """``graph``'s data dicts with their tensors replaced, in :func:`_data_tensors`' order."""
    out, i = {}, 0
    for name in graph._DATA:
        keys = list(getattr(graph, name))
        out[name] = dict(zip(keys, tensors[i:i + len(keys)]))
        i += len(keys)
    if i != len(tensors):
        raise ValueError(f"{len(tensors)} data tensors for {i} data fields")
    return out


@functools.lru_cache(maxsize=1)
def dgl_has_cuda() -> bool:
    """Whether this DGL build can put a graph on a CUDA device (PyPI's wheels cannot)."""
    if not torch.cuda.is_available():
        return False
    try:
        dgl.graph(([0], [0])).to("cuda")
        return True
    except Exception:  # noqa: BLE001 - DGL's error for a CPU build is a DGLError from its C library
        return False


def graph_to(graph: dgl.DGLGraph, device: Union[str, torch.device]) -> Any:
    """``graph`` (a DGL block or graph, CPU) on ``device`` the way a model can read it there: DGL's own
    ``.to(device)`` on the CPU or with a CUDA build of DGL, else an :class:`IndexBlock`/:class:`IndexGraph` on
    the device (a blocking copy: for evaluation, not the training loop, whose batches
    :mod:`dgl_oac.engine.structure` copies)."""
    device = torch.device(device)
    if device.type == "cpu" or dgl_has_cuda():
        return graph.to(device)
    ib = IndexBlock.from_dgl(graph) if graph.is_block else IndexGraph.from_dgl(graph)
    return ib.with_tensors([t.to(device) for t in ib.tensors()])


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


__all__ = ["IndexBlock", "IndexGraph", "aggregate", "graph_to", "dgl_has_cuda"]
