"""Negative samplers in DGL's negative-sampler interface.

Every sampler is a callable ``sampler(g, eids) -> (neg_src, neg_dst)`` like
``dgl.dataloading.negative_sampler.Uniform``, so it plugs into
``dgl.dataloading.as_edge_prediction_sampler`` as well as into
:class:`dgl_oac.dgl_frontend.sampling.edge.EdgeBatchSampler`.

Randomness comes ONLY from torch's global CPU generator (node ids are drawn on the CPU and
then moved to ``g.device``): the dgl-oac loader seeds that generator per batch, so a batch's
negatives are a deterministic function of the seed, whatever device the graph lives on.

Edge layout of the returned pairs (``B`` positives, ``k`` negatives per positive):

* ``corrupt="tail"``: ``B*k`` pairs ``(src_i, x)``, positive-major (pair ``i*k + j``);
* ``corrupt="head"``: ``B*k`` pairs ``(x, dst_i)``, same order;
* ``corrupt="both"``: ``2*B*k`` pairs, the tail block followed by the head block.

With ``shared=True`` (DGL-KE / Marius style) ONE set of ``k`` candidate nodes is drawn per
call and every positive is paired with all of them (``x = cand[j]``); otherwise each positive
gets its own ``k`` draws (and the head block its own draws again).
"""
from __future__ import annotations

import weakref
from typing import Tuple

import torch
from torch import Tensor

CORRUPT_MODES = ("tail", "head", "both")


def corrupt_pairs(src: Tensor, dst: Tensor, neg: Tensor, k: int, corrupt: str = "tail",
                  shared: bool = False) -> Tuple[Tensor, Tensor]:
    """Build negative pairs from positives and replacement nodes (any id space, any device).

    src, dst: int64[B] positive endpoints. neg: int64[k] if ``shared``, else int64[B*k]
    (``corrupt`` tail/head) or int64[2*B*k] (``both``: tail replacements first).
    Returns (neg_src, neg_dst), each int64[B*k] or int64[2*B*k], in the module's layout.
    """
    if corrupt not in CORRUPT_MODES:
        raise ValueError(f"corrupt must be one of {CORRUPT_MODES}, got {corrupt!r}")
    B = src.shape[0]
    n_blocks = 2 if corrupt == "both" else 1
    if shared:
        # [B, k] view of the same k candidates for every positive: no per-positive draws.
        blocks = [neg.view(1, k).expand(B, k).reshape(-1)] * n_blocks
    else:
        blocks = list(neg.view(n_blocks, B * k).unbind(0))
    out_src, out_dst = [], []
    modes = ("tail", "head") if corrupt == "both" else (corrupt,)
    for mode, repl in zip(modes, blocks):
        if mode == "tail":
            out_src.append(src.repeat_interleave(k))
            out_dst.append(repl)
        else:
            out_src.append(repl)
            out_dst.append(dst.repeat_interleave(k))
    return torch.cat(out_src), torch.cat(out_dst)


class NegativeSampler:
    """Base class: subclasses implement :meth:`draw` (``n`` node ids from some distribution).

    k: negatives per positive (or per batch when ``shared``); corrupt: "tail"|"head"|"both";
    shared: pair every positive of a batch with the same ``k`` candidates.
    """

    def __init__(self, k: int, corrupt: str = "tail", shared: bool = False) -> None:
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        if corrupt not in CORRUPT_MODES:
            raise ValueError(f"corrupt must be one of {CORRUPT_MODES}, got {corrupt!r}")
        self.k = int(k)
        self.corrupt = corrupt
        self.shared = bool(shared)

    def draw(self, g, n: int) -> Tensor:
        """n node ids of ``g``: int64[n] on the CPU, from torch's global CPU RNG."""
        raise NotImplementedError

    def candidates(self, g) -> Tensor:
        """The ``k`` shared candidates of one batch: int64[k], CPU."""
        return self.draw(g, self.k)

    def num_draws(self, num_pos: int) -> int:
        """How many node ids one call draws for ``num_pos`` positives."""
        if self.shared:
            return self.k
        return num_pos * self.k * (2 if self.corrupt == "both" else 1)

    def __call__(self, g, eids) -> Tuple[Tensor, Tensor]:
        """DGL interface. eids: int64[B] edge ids of ``g`` (homogeneous graphs only).

        Returns (neg_src, neg_dst) on ``g.device`` in the module's edge layout.
        """
        if isinstance(eids, dict):
            raise TypeError("only homogeneous graphs (a tensor of edge ids) are supported")
        src, dst = g.find_edges(eids)
        neg = self.draw(g, self.num_draws(src.shape[0])).to(src.device, src.dtype)
        return corrupt_pairs(src, dst, neg, self.k, self.corrupt, self.shared)


class Uniform(NegativeSampler):
    """Nodes drawn uniformly from ``[0, g.num_nodes())``, with replacement."""

    def draw(self, g, n: int) -> Tensor:
        return torch.randint(0, g.num_nodes(), (n,), dtype=torch.int64)


class SharedUniform(Uniform):
    """:class:`Uniform` with ``shared=True``: one set of ``k`` candidates per batch."""

    def __init__(self, k: int, corrupt: str = "tail") -> None:
        super().__init__(k, corrupt=corrupt, shared=True)


class DegreeBased(NegativeSampler):
    """word2vec-style negatives: P(v) proportional to deg(v) ** power, with replacement.

    degree: "total" (in + out, i.e. how often v occurs in the edge list; for a KG its
    triple frequency), "in" or "out". Nodes of degree 0 are never drawn (if every node has
    degree 0 the distribution falls back to uniform). The CDF is computed once per graph and
    cached (weakly keyed, so it dies with the graph); sampling is an inverse-CDF
    ``searchsorted`` over ``torch.rand`` draws, so it works for any node count (unlike
    ``torch.multinomial``, capped at 2**24 categories).
    """

    def __init__(self, k: int, power: float = 0.75, corrupt: str = "tail",
                 shared: bool = False, degree: str = "total") -> None:
        super().__init__(k, corrupt=corrupt, shared=shared)
        if degree not in ("total", "in", "out"):
            raise ValueError(f"degree must be 'total', 'in' or 'out', got {degree!r}")
        self.power = float(power)
        self.degree = degree
        self._cache: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()

    def _cdf(self, g) -> Tensor:
        # Keyed by the graph object and its size, so a reused id()/mutated graph cannot hit.
        key = (g.num_nodes(), g.num_edges())
        hit = self._cache.get(g)
        if hit is not None and hit[0] == key:
            return hit[1]
        if self.degree == "in":
            deg = g.in_degrees()
        elif self.degree == "out":
            deg = g.out_degrees()
        else:
            deg = g.in_degrees() + g.out_degrees()
        w = deg.cpu().to(torch.float64).pow(self.power)
        if float(w.sum()) == 0.0:
            w = torch.ones_like(w)
        cdf = torch.cumsum(w, 0)
        self._cache[g] = (key, cdf)
        return cdf

    def draw(self, g, n: int) -> Tensor:
        cdf = self._cdf(g)
        u = torch.rand(n, dtype=torch.float64) * cdf[-1]
        # First index whose CDF exceeds u: zero-weight nodes (flat CDF steps) are never hit.
        idx = torch.searchsorted(cdf, u, right=True)
        return idx.clamp_(max=cdf.shape[0] - 1)


def make_negative_sampler(num_negatives: int, corrupt: str = "tail", shared: bool = True,
                          distribution: str = "uniform", power: float = 0.75
                          ) -> NegativeSampler:
    """Factory: distribution "uniform" or "degree" (DegreeBased with ``power``)."""
    if distribution == "uniform":
        return Uniform(num_negatives, corrupt=corrupt, shared=shared)
    if distribution == "degree":
        return DegreeBased(num_negatives, power=power, corrupt=corrupt, shared=shared)
    raise ValueError(f"unknown distribution {distribution!r}")


__all__ = ["corrupt_pairs", "NegativeSampler", "Uniform", "SharedUniform", "DegreeBased",
           "make_negative_sampler", "CORRUPT_MODES"]
