"""Edge mini-batches for SHALLOW models (KG embeddings) without a graph library.

:class:`EdgeBatchMaker` makes one batch of seed edges into ``(input_nodes, pair_graph, neg_pair_graph, [])``:
one ``torch.unique(..., return_inverse=True)`` compacts every positive endpoint and negative node to ids
``0..n-1`` (the layout: :mod:`dgl_oac.dgl_frontend.sampling.edge`, whose DGL sampler makes the same batch with
DGL graphs). Here the two graphs are :class:`PairGraph` (compacted endpoints, ``ndata``/``edata`` dicts) and the
graph sampled from is an :class:`EdgeList` (what the negative samplers ask of a graph: node count, degrees).

:class:`EdgeBatches` is the epoch's batches for :class:`dgl_oac.BatchLoader`: shuffled by
:func:`~dgl_oac.sampling.epoch_generator`, batch ``b``'s negatives drawn under its
:func:`~dgl_oac.sampling.batch_seed`, as :class:`dgl_oac.DataLoader` draws them: the batches are the DGL
loader's, bit for bit (``tests/test_no_dgl.py``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import torch
from torch import Tensor

from . import batch_seed, epoch_generator, torch_seeded
from .negative import CORRUPT_MODES, NegativeSampler, Uniform, corrupt_pairs

NegSampler = Callable[..., Tuple[Tensor, Tensor]]


class EdgeList:
    """A homogeneous graph as its edge list (``src``, ``dst``: int64[E], CPU), with ``edata`` (e.g. a KG's
    ``"etype"``): the part of ``dgl.DGLGraph``'s interface the edge batches and negative samplers use."""

    def __init__(self, src: Tensor, dst: Tensor, num_nodes: int, edata: Optional[Dict[str, Tensor]] = None) -> None:
        if src.shape != dst.shape or src.dim() != 1:
            raise ValueError(f"src and dst must be int64[E] of one length, got {tuple(src.shape)} and "
                             f"{tuple(dst.shape)}")
        self.src, self.dst, self._num_nodes = src.long(), dst.long(), int(num_nodes)
        self.edata: Dict[str, Tensor] = dict(edata or {})
        self.device, self.idtype = torch.device("cpu"), torch.int64

    def num_nodes(self) -> int:
        """Nodes, ids ``0..num_nodes-1``."""
        return self._num_nodes

    def num_edges(self) -> int:
        """Edges."""
        return int(self.src.numel())

    def find_edges(self, eids: Tensor) -> Tuple[Tensor, Tensor]:
        """``(src, dst)`` of edges ``eids: int64[B]``."""
        return self.src[eids], self.dst[eids]

    def in_degrees(self) -> Tensor:
        """int64[N]: edges into each node."""
        return torch.bincount(self.dst, minlength=self._num_nodes)

    def out_degrees(self) -> Tensor:
        """int64[N]: edges out of each node."""
        return torch.bincount(self.src, minlength=self._num_nodes)


@dataclass(eq=False)
class PairGraph:
    """Compacted pairs over a batch's ``n`` input nodes: ``edges()`` is ``(src, dst)``, int64[E] in ``0..n-1``
    (the DGL frontend's :class:`~dgl_oac.dgl_frontend.blocks.IndexGraph` is one, movable between devices)."""

    src: Tensor
    dst: Tensor
    n: int
    ndata: Dict[str, Any] = field(default_factory=dict)
    edata: Dict[str, Any] = field(default_factory=dict)

    @property
    def device(self) -> torch.device:
        """The device the edges are on (DGL's ``DGLGraph.device``)."""
        return self.src.device

    def edges(self) -> Tuple[Tensor, Tensor]:
        """``(src, dst)``, ``int64[E]`` each, on the graph's device (DGL's ``edges()``)."""
        return self.src, self.dst

    def num_edges(self) -> int:
        """Number of edges ``E``."""
        return int(self.src.shape[0])

    def num_nodes(self, ntype: Any = None) -> int:
        """Number of nodes ``n`` (``ntype`` is accepted for DGL's signature; the graph has one type)."""
        return self.n


@dataclass
class EdgeBatch:
    """One batch, compacted: ``input_nodes: int64[n]`` (sorted, unique), positives ``src``/``dst`` and negatives
    ``neg_src``/``neg_dst`` in ``0..n-1``, the seed edge ids ``eids``, relations ``rel``/``neg_rel`` (a KG)."""

    input_nodes: Tensor
    src: Tensor
    dst: Tensor
    neg_src: Tensor
    neg_dst: Tensor
    eids: Tensor
    rel: Optional[Tensor] = None
    neg_rel: Optional[Tensor] = None


class EdgeBatchMaker:
    """``sample(g, seed_edges) -> (input_nodes, pair_graph, neg_pair_graph, [])`` for any graph with DGL's
    ``find_edges``, ``num_nodes`` (and ``edata``): an :class:`EdgeList`, or a ``dgl.DGLGraph`` (the DGL
    sampler: :class:`dgl_oac.dgl_frontend.sampling.edge.EdgeBatchSampler`, whose docstring has the arguments)."""

    def __init__(self, negative_sampler: Optional[NegSampler] = None, num_negatives: int = 1,
                 shared: bool = True, corrupt: str = "tail", materialize_negatives: bool = True) -> None:
        if corrupt not in CORRUPT_MODES:
            raise ValueError(f"corrupt must be one of {CORRUPT_MODES}, got {corrupt!r}")
        if negative_sampler is None:
            negative_sampler = Uniform(num_negatives, corrupt=corrupt, shared=shared)
        self.negative_sampler = negative_sampler
        if isinstance(negative_sampler, NegativeSampler):
            self.num_negatives = negative_sampler.k
            self.corrupt = negative_sampler.corrupt
            self.shared = negative_sampler.shared
        else:
            self.num_negatives = getattr(negative_sampler, "k", num_negatives)
            self.corrupt, self.shared = "tail", False
        if not materialize_negatives and not self.shared:
            raise ValueError("materialize_negatives=False needs shared negatives")
        self.materialize_negatives = materialize_negatives

    def make(self, g: Any, seed_edges: Tensor) -> EdgeBatch:
        """Batch ``seed_edges: int64[B]`` of ``g``, compacted (CPU tensors)."""
        if isinstance(seed_edges, dict):
            raise TypeError("edge batches support homogeneous graphs only")
        eids = torch.as_tensor(seed_edges).to(g.idtype).to(g.device)
        src, dst = g.find_edges(eids)
        src, dst, eids = src.cpu().long(), dst.cpu().long(), eids.cpu().long()
        ns = self.negative_sampler
        if isinstance(ns, NegativeSampler):
            parts = [src, dst, ns.draw(g, ns.num_draws(src.shape[0])).cpu()]
        else:
            neg_src, neg_dst = ns(g, eids.to(g.idtype).to(g.device))
            parts = [src, dst, neg_src.cpu().long(), neg_dst.cpu().long()]
        # Compaction: one sort-based unique over all endpoints; inverse = compacted ids.
        input_nodes, inverse = torch.unique(torch.cat(parts), return_inverse=True)
        pieces = inverse.split([p.shape[0] for p in parts])
        c_src, c_dst = pieces[0], pieces[1]
        if not self.materialize_negatives:
            c_nsrc = c_ndst = pieces[2]  # k self-loops carrying the candidates
        elif isinstance(ns, NegativeSampler):
            c_nsrc, c_ndst = corrupt_pairs(c_src, c_dst, pieces[2], ns.k, ns.corrupt, ns.shared)
        else:
            c_nsrc, c_ndst = pieces[2], pieces[3]
        batch = EdgeBatch(input_nodes, c_src, c_dst, c_nsrc, c_ndst, eids)
        if "etype" in g.edata:
            batch.rel = g.edata["etype"][eids.to(g.device)].cpu()
            if self.materialize_negatives:
                batch.neg_rel = self._negative_relations(batch.rel, c_nsrc.shape[0])
        return batch

    def sample(self, g: Any, seed_edges: Tensor) -> Tuple[Tensor, PairGraph, PairGraph, List[Any]]:
        """``(input_nodes int64[n], pair_graph, neg_pair_graph, [])``, the graphs as :class:`PairGraph`."""
        b = self.make(g, seed_edges)
        n = b.input_nodes.shape[0]
        pair = PairGraph(b.src, b.dst, n, {"_ID": b.input_nodes}, {"_ID": b.eids})
        neg = PairGraph(b.neg_src, b.neg_dst, n, {"_ID": b.input_nodes})
        if b.rel is not None:
            pair.edata["etype"] = b.rel
        if b.neg_rel is not None:
            neg.edata["etype"] = b.neg_rel
        return b.input_nodes, pair, neg, []

    def _negative_relations(self, rel: Tensor, num_neg: int) -> Optional[Tensor]:
        """Each negative keeps its positive's relation (positive-major layout)."""
        B = rel.shape[0]
        if isinstance(self.negative_sampler, NegativeSampler):
            blocks = 2 if self.corrupt == "both" else 1
            return rel.repeat_interleave(self.num_negatives).repeat(blocks)
        if B and num_neg % B == 0:  # DGL's per-source layout (e.g. its Uniform)
            return rel.repeat_interleave(num_neg // B)
        return None  # unknown layout (e.g. GlobalUniform): negatives are not tied to a positive

    def unpack(self, pair_graph: Any, neg_pair_graph: Any) -> List[Tuple[str, Tensor]]:
        """:func:`unpack_negatives` with this sampler's ``num_negatives/corrupt/shared``."""
        return unpack_negatives(pair_graph, neg_pair_graph, self.num_negatives,
                                self.corrupt, self.shared, self.materialize_negatives)


def unpack_negatives(pair_graph: Any, neg_pair_graph: Any, num_negatives: int, corrupt: str = "tail",
                     shared: bool = True, materialized: bool = True) -> List[Tuple[str, Tensor]]:
    """Split a batch's negatives into ``[(mode, ids), ...]`` with mode "tail"/"head".

    ids are compacted node ids: int64[k] (shared; score with ``model.score_neg``) or
    int64[B, k] (per-positive: row i replaces the tail/head of positive i).
    """
    B, k = pair_graph.num_edges(), num_negatives
    ns, nd = neg_pair_graph.edges()
    modes = ("tail", "head") if corrupt == "both" else (corrupt,)
    if not materialized:  # lean layout: k self-loops over the candidates
        return [(mode, nd.long()) for mode in modes]
    out = []
    for b, mode in enumerate(modes):
        block = (nd if mode == "tail" else ns)[b * B * k:(b + 1) * B * k].long().view(B, k)
        out.append((mode, block[0] if shared else block))
    return out


class EdgeBatches:
    """Every epoch's batches of ``graph``'s edges, for :class:`dgl_oac.BatchLoader`: each ``iter()`` is the next
    epoch, its edge ids shuffled by ``epoch_generator(seed, epoch)`` (``shuffle``) and cut into ``batch_size``
    batches (the last may be short), batch ``b`` made by ``maker`` with torch's CPU generator seeded with
    ``batch_seed(seed, epoch, b)`` (the caller's generator state restored after)."""

    def __init__(self, graph: EdgeList, maker: EdgeBatchMaker, batch_size: int, seed: int,
                 shuffle: bool = True) -> None:
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
        self.graph, self.maker, self.batch_size, self.seed, self.shuffle = graph, maker, batch_size, seed, shuffle
        self.epoch = 0

    def __len__(self) -> int:
        return -(-self.graph.num_edges() // self.batch_size)

    def __iter__(self) -> Iterator[Tuple[Tensor, PairGraph, PairGraph, List[Any]]]:
        epoch, self.epoch = self.epoch, self.epoch + 1
        n = self.graph.num_edges()
        order = torch.randperm(n, generator=epoch_generator(self.seed, epoch)) if self.shuffle else torch.arange(n)
        for b in range(len(self)):
            with torch_seeded(batch_seed(self.seed, epoch, b)):
                batch = self.maker.sample(self.graph, order[b * self.batch_size:(b + 1) * self.batch_size])
            yield batch  # outside the seeded block: the caller runs with its own generator state


__all__ = ["EdgeList", "PairGraph", "EdgeBatch", "EdgeBatchMaker", "EdgeBatches", "unpack_negatives"]
