"""Sampled graph structure as torch index tensors, and message passing in torch ops.

PyPI's DGL wheels are CPU builds: their blocks cannot move to a GPU. An :class:`IndexBlock` (a DGL block's
edges) or :class:`IndexGraph` (a pair graph's edges) carries the same structure as int64 tensors, which any
device holds; the built-in models (:class:`~dgl_oac.app.models.sage.SAGE`, :class:`~dgl_oac.app.models.link.LinkPredictor`)
take them in place of DGL graphs and aggregate with :func:`aggregate`. With a CUDA build of DGL, hand the
models DGL's own blocks (on the device) and DGL's kernels run instead.

Edges are sorted by destination (stable) when built, on the host, so that aggregation is a segment reduce over
known lengths: no host sync (the lengths are computed before the copy), and, its messages gathered by
:func:`gather_rows`, deterministic on every device, backward included (no atomic ``index_add_`` on CUDA).

Like DGL graphs they have ``srcdata``/``dstdata``/``edata`` (blocks) or ``ndata``/``edata`` (graphs) dicts of
tensors: the sampler's (``dgl.NID``, ``dgl.EID``, a KG's ``"etype"``) travel with the structure, and the loader
attaches a batch's rows there.
"""
from __future__ import annotations

import functools
from collections.abc import MutableMapping
from dataclasses import dataclass, field, replace
from types import SimpleNamespace
from typing import Any, Dict, Iterator, List, Sequence, Tuple, Union

import dgl
import torch
from torch import Tensor

from ..device.rows import gather_rows
from ..sampling.edge_batch import PairGraph


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
            raise TypeError("IndexBlock carries homogeneous blocks only; a heterogeneous block is a "
                            "HeteroIndexBlock (index_structure picks)")
        src, dst = (t.long() for t in block.edges())
        order = torch.argsort(dst, stable=True)
        n_dst = block.num_dst_nodes()
        return cls(src[order], dst[order], torch.bincount(dst, minlength=n_dst), block.num_src_nodes(), n_dst,
                   dict(block.srcdata), dict(block.dstdata), {k: v[order] for k, v in block.edata.items()})

    @property
    def device(self) -> torch.device:
        """The device the structure is on (DGL's ``DGLGraph.device``)."""
        return self.src.device

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


def aggregate(block: IndexBlock, x_src: Tensor, how: str = "mean") -> Tensor:
    """``x_src: float[num_src, D]`` -> ``float[num_dst, D]``: each destination's ``how`` ("mean" or "sum") over
    its in-edges' sources, 0 for none. A segment reduce over ``dst``'s runs: deterministic, no host sync."""
    if how not in ("mean", "sum"):
        raise ValueError(f"IndexBlock aggregates with 'mean' or 'sum', got {how!r} (other SAGE aggregators "
                         f"need DGL's blocks on the device)")
    if x_src.shape[0] != block.num_src:
        raise ValueError(f"x_src has {x_src.shape[0]} rows for a block of {block.num_src} source nodes")
    return torch.segment_reduce(gather_rows(x_src, block.src), how, lengths=block.in_deg, unsafe=True, initial=0)


@dataclass(eq=False)
class IndexGraph(PairGraph):
    """A pair graph's edges ``src, dst: int64[E]`` over ``num_nodes`` nodes (positive or negative pairs)."""

    is_block = False
    _DATA = ("ndata", "edata")

    @classmethod
    def from_dgl(cls, graph: dgl.DGLGraph) -> "IndexGraph":
        if len(graph.canonical_etypes) != 1 or len(graph.ntypes) != 1:
            raise TypeError("IndexGraph carries homogeneous graphs only")
        src, dst = (t.long() for t in graph.edges())
        return cls(src, dst, graph.num_nodes(), dict(graph.ndata), dict(graph.edata))

    def tensors(self) -> List[Tensor]:
        """Structure, then data tensors: what a copy to a device moves (:meth:`with_tensors` takes it back)."""
        return [self.src, self.dst] + _data_tensors(self)

    def with_tensors(self, tensors: Sequence[Tensor]) -> "IndexGraph":
        """The same graph over ``tensors`` (from :meth:`tensors`, e.g. copied to a device)."""
        return replace(self, src=tensors[0], dst=tensors[1], **_data_from(self, tensors[2:]))


@dataclass(eq=False)
class HeteroIndexBlock:
    """A heterogeneous block: one :class:`IndexBlock` per relation, ``rels: {(src type, etype, dst type):
    IndexBlock}`` (each over its source and destination types' local ids), ``num_src``/``num_dst: {ntype: int}``;
    ``srcdata``/``dstdata`` as DGL's views of a heterogeneous block show them, ``{name: {ntype: tensor}}``."""

    rels: Dict[Tuple[str, str, str], IndexBlock]
    num_src: Dict[str, int]
    num_dst: Dict[str, int]
    srcdata: Dict[str, Dict[str, Any]] = field(default_factory=dict)
    dstdata: Dict[str, Dict[str, Any]] = field(default_factory=dict)

    is_block = True

    @property
    def device(self) -> torch.device:
        """The device the relations' structure is on (DGL's ``DGLGraph.device``)."""
        return next(iter(self.rels.values())).device

    @classmethod
    def from_dgl(cls, block: dgl.DGLGraph) -> "HeteroIndexBlock":
        """The structure of a heterogeneous DGL block (CPU) -> a HeteroIndexBlock on the CPU."""
        rels = {}
        for c in block.canonical_etypes:
            rel = block[c]
            src, dst = (t.long() for t in rel.edges())
            order = torch.argsort(dst, stable=True)
            n_dst = block.num_dst_nodes(c[2])
            rels[c] = IndexBlock(src[order], dst[order], torch.bincount(dst, minlength=n_dst),
                                 block.num_src_nodes(c[0]), n_dst,
                                 edata={k: v[order] for k, v in rel.edata.items()})
        return cls(rels, {t: block.num_src_nodes(t) for t in block.srctypes},
                   {t: block.num_dst_nodes(t) for t in block.dsttypes},
                   _by_name({t: block.srcnodes[t].data for t in block.srctypes}),
                   _by_name({t: block.dstnodes[t].data for t in block.dsttypes}))

    @property
    def canonical_etypes(self) -> List[Tuple[str, str, str]]:
        """The relations, ``(src type, etype, dst type)`` each (DGL's ``canonical_etypes``)."""
        return list(self.rels)

    @property
    def srcnodes(self) -> Dict[str, Any]:
        """``srcnodes[ntype].data[name]``: DGL's per-type view of :attr:`srcdata`, where the loader attaches rows."""
        return {t: SimpleNamespace(data=_TypeData(self.srcdata, t)) for t in self.num_src}

    @property
    def dsttypes(self) -> List[str]:
        """The destination node types (DGL's ``dsttypes``)."""
        return list(self.num_dst)

    def num_src_nodes(self, ntype: str) -> int:
        """Number of source nodes of ``ntype``."""
        return self.num_src.get(ntype, 0)

    def num_dst_nodes(self, ntype: str) -> int:
        """Number of destination nodes of ``ntype``."""
        return self.num_dst.get(ntype, 0)

    def tensors(self) -> List[Tensor]:
        """Every relation's tensors, then the node data: what a copy to a device moves."""
        return [t for b in self.rels.values() for t in b.tensors()] + [
            t for data in (self.srcdata, self.dstdata) for per in data.values() for t in per.values()]

    def with_tensors(self, tensors: Sequence[Tensor]) -> "HeteroIndexBlock":
        """The same block over ``tensors`` (from :meth:`tensors`, e.g. copied to a device)."""
        rels, i = {}, 0
        for c, b in self.rels.items():
            n = len(b.tensors())
            rels[c] = b.with_tensors(tensors[i:i + n])
            i += n
        data = []
        for d in (self.srcdata, self.dstdata):
            out = {}
            for name, per in d.items():
                out[name] = dict(zip(per, tensors[i:i + len(per)]))
                i += len(per)
            data.append(out)
        if i != len(tensors):
            raise ValueError(f"{len(tensors)} tensors for a block of {i}")
        return replace(self, rels=rels, srcdata=data[0], dstdata=data[1])


class _TypeData(MutableMapping):
    """The ``{name: tensor}`` of one node type, read from and written into ``{name: {ntype: t}}``."""

    def __init__(self, data: Dict[str, Dict[str, Any]], ntype: str) -> None:
        self._data, self._ntype = data, ntype

    def __getitem__(self, name: str) -> Any:
        return self._data[name][self._ntype]

    def __setitem__(self, name: str, value: Any) -> None:
        self._data.setdefault(name, {})[self._ntype] = value

    def __delitem__(self, name: str) -> None:
        del self._data[name][self._ntype]

    def __iter__(self) -> Iterator[str]:
        return (name for name, per in self._data.items() if self._ntype in per)

    def __len__(self) -> int:
        return sum(1 for _ in self)


def _by_name(per_type: Dict[str, Any]) -> Dict[str, Dict[str, Any]]:
    """``{ntype: {name: tensor}}`` -> ``{name: {ntype: tensor}}`` (DGL's ``srcdata`` of a heterogeneous block)."""
    out: Dict[str, Dict[str, Any]] = {}
    for ntype, data in per_type.items():
        for name, t in data.items():
            out.setdefault(name, {})[ntype] = t
    return out


def index_structure(graph: dgl.DGLGraph) -> Any:
    """A DGL block or pair graph (CPU) as index tensors: :class:`IndexBlock`, :class:`HeteroIndexBlock` or
    :class:`IndexGraph`."""
    if graph.is_block:
        hetero = len(graph.canonical_etypes) != 1 or len(graph.srctypes) != 1
        return HeteroIndexBlock.from_dgl(graph) if hetero else IndexBlock.from_dgl(graph)
    return IndexGraph.from_dgl(graph)


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
    ``.to(device)`` on the CPU or with a CUDA build of DGL, else an :class:`IndexBlock`/:class:`IndexGraph` on the
    device (a blocking copy: for evaluation, not the training loop, whose batches :mod:`.engine.structure` copies)."""
    device = torch.device(device)
    if device.type == "cpu" or dgl_has_cuda():
        return graph.to(device)
    ib = index_structure(graph)
    return ib.with_tensors([t.to(device) for t in ib.tensors()])


__all__ = ["IndexBlock", "HeteroIndexBlock", "IndexGraph", "index_structure", "aggregate", "gather_rows",
           "graph_to", "dgl_has_cuda"]
