"""Knowledge-graph embedding scorers (DistMult, ComplEx, TransE), losses and regularisers.

Each scorer holds only the RELATION embeddings (a dense ``nn.Embedding``); the entity rows
come from dgl-oac's CPU table via the loader (``pair_graph.ndata[name]``), so every method
takes entity embeddings as tensors. All outputs are on the entity tensors' device; relation
ids may be on any device (they are moved to the relation table's device).

Conventions, with ``B`` positives and ``K`` candidates shared by the whole batch:

* ``score(h, r_ids, t) -> [B]``: higher = more plausible.
* ``score_neg(h, r_ids, cand, corrupt) -> [B, K]``: ``h`` is the KEPT entity of each
  positive: its head for ``corrupt="tail"`` (cand replace the tail), its tail for
  ``corrupt="head"`` (cand replace the head). ``[b, k] == score(h[b], r[b], cand[k])``
  (resp. ``score(cand[k], r[b], h[b])``). DistMult/ComplEx reduce to one ``[B,D] @ [D,K]``
  matmul; TransE to one ``torch.cdist``; no ``[B, K, D]`` tensor is built (except inside
  cdist's backward for TransE with p=1).
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class KGScorer(nn.Module):
    """Base class: relation table ``relation: nn.Embedding(num_relations, dim)``."""

    def __init__(self, num_relations: int, dim: int) -> None:
        super().__init__()
        self.num_relations, self.dim = num_relations, dim
        self.relation = nn.Embedding(num_relations, dim)
        nn.init.xavier_uniform_(self.relation.weight)

    def rel(self, r_ids: Tensor, like: Tensor) -> Tensor:
        """Relation rows float32[B, dim] on ``like``'s device."""
        w = self.relation.weight
        return self.relation(r_ids.to(w.device).long()).to(like.device)

    def score(self, h: Tensor, r_ids: Tensor, t: Tensor) -> Tensor:
        """h, t: float32[B, dim]; r_ids: int64[B] -> float32[B]."""
        raise NotImplementedError

    def score_neg(self, h: Tensor, r_ids: Tensor, cand: Tensor, corrupt: str = "tail") -> Tensor:
        """h: float32[B, dim] kept entities; r_ids: int64[B]; cand: float32[K, dim] -> [B, K]."""
        raise NotImplementedError


class _Bilinear(KGScorer):
    """score = <query(kept, r), replaced>: both corruptions are a single matmul."""

    def _tail_query(self, h: Tensor, r: Tensor) -> Tensor:
        raise NotImplementedError

    def _head_query(self, t: Tensor, r: Tensor) -> Tensor:
        raise NotImplementedError

    def score(self, h: Tensor, r_ids: Tensor, t: Tensor) -> Tensor:
        return (self._tail_query(h, self.rel(r_ids, h)) * t).sum(-1)

    def score_neg(self, h: Tensor, r_ids: Tensor, cand: Tensor, corrupt: str = "tail") -> Tensor:
        r = self.rel(r_ids, h)
        if corrupt == "tail":
            q = self._tail_query(h, r)
        elif corrupt == "head":
            q = self._head_query(h, r)
        else:
            raise ValueError(f"corrupt must be 'tail' or 'head', got {corrupt!r}")
        return q @ cand.t()


class DistMult(_Bilinear):
    """score = sum(h * r * t) (Yang et al., 2015); symmetric, so both queries are h * r."""

    def _tail_query(self, h: Tensor, r: Tensor) -> Tensor:
        return h * r

    _head_query = _tail_query


class ComplEx(_Bilinear):
    """score = Re(<h, r, conj(t)>) (Trouillon et al., 2016).

    dim must be even: a vector's first dim/2 coordinates are the real parts, the last dim/2
    the imaginary parts (the entity table stores them the same way).
    """

    def __init__(self, num_relations: int, dim: int) -> None:
        if dim % 2:
            raise ValueError(f"ComplEx needs an even dim (real/imag halves), got {dim}")
        super().__init__(num_relations, dim)

    @staticmethod
    def _halves(x: Tensor):
        return x.chunk(2, dim=-1)

    def _tail_query(self, h: Tensor, r: Tensor) -> Tensor:
        # Re((h r) conj(t)) = Re(h r) . Re(t) + Im(h r) . Im(t)
        hr, hi = self._halves(h)
        rr, ri = self._halves(r)
        return torch.cat([hr * rr - hi * ri, hr * ri + hi * rr], dim=-1)

    def _head_query(self, t: Tensor, r: Tensor) -> Tensor:
        # As a function of h: Re(h) . Re(r conj(t)) - Im(h) . Im(r conj(t))
        tr, ti = self._halves(t)
        rr, ri = self._halves(r)
        return torch.cat([rr * tr + ri * ti, rr * ti - ri * tr], dim=-1)


class TransE(KGScorer):
    """score = gamma - ||h + r - t||_p (Bordes et al., 2013; DGL-KE's gamma offset).

    p: 1 or 2. gamma only shifts scores (a margin for the logsigmoid loss); it does not
    change rankings.
    """

    def __init__(self, num_relations: int, dim: int, p: int = 1, gamma: float = 12.0) -> None:
        if p not in (1, 2):
            raise ValueError(f"p must be 1 or 2, got {p}")
        super().__init__(num_relations, dim)
        self.p, self.gamma = p, float(gamma)

    def score(self, h: Tensor, r_ids: Tensor, t: Tensor) -> Tensor:
        return self.gamma - torch.linalg.vector_norm(h + self.rel(r_ids, h) - t, ord=self.p,
                                                     dim=-1)

    def score_neg(self, h: Tensor, r_ids: Tensor, cand: Tensor, corrupt: str = "tail") -> Tensor:
        r = self.rel(r_ids, h)
        if corrupt == "tail":    # ||(h + r) - c||
            anchor = h + r
        elif corrupt == "head":  # ||c + r - t|| = ||(t - r) - c||
            anchor = h - r
        else:
            raise ValueError(f"corrupt must be 'tail' or 'head', got {corrupt!r}")
        # p=2: cdist's matmul expansion keeps forward AND backward at O(B*K + (B+K)*D)
        # memory. p=1 has no such expansion; cdist's backward then allocates [B, K, D].
        return self.gamma - torch.cdist(anchor, cand, p=self.p)


def _negative_weights(neg: Tensor, adversarial_temperature: Optional[float]) -> Tensor:
    """[B, K] weights summing to 1 per row: uniform, or self-adversarial (Sun et al., 2019:
    softmax(T * neg), detached so the weights act as constants)."""
    if adversarial_temperature is None:
        return torch.full_like(neg, 1.0 / neg.shape[1])
    return torch.softmax(neg.detach() * adversarial_temperature, dim=1)


def kg_loss(pos: Tensor, neg: Tensor, kind: str = "logsigmoid",
            adversarial_temperature: Optional[float] = None, margin: float = 1.0) -> Tensor:
    """Scalar loss from pos: float[B] and neg: float[B, K] (or float[B*K], positive-major).

    kind:
    * "logsigmoid" (RotatE / DGL-KE): ``(-logsig(pos) - sum_k w_k logsig(-neg_k)) / 2``
      averaged over the batch: each positive is balanced against the w-weighted mean of its
      negatives.
    * "softplus" (logistic loss, as in ComplEx / PBG): ``softplus(-s)`` for positives and
      ``softplus(s)`` for negatives, averaged over all ``B*(1+K)`` scores (negatives weighted
      ``K * w_k``), so every negative counts as much as a positive.
    * "margin": ``sum_k w_k relu(margin - pos + neg_k)``, averaged over the batch.

    adversarial_temperature: None for uniform ``w = 1/K``, else self-adversarial weights.
    """
    B = pos.shape[0]
    neg = neg.reshape(B, -1)
    w = _negative_weights(neg, adversarial_temperature)
    if kind == "logsigmoid":
        pos_term = -F.logsigmoid(pos).mean()
        neg_term = -(w * F.logsigmoid(-neg)).sum(1).mean()
        return (pos_term + neg_term) / 2
    if kind == "softplus":
        K = neg.shape[1]
        total = F.softplus(-pos).sum() + K * (w * F.softplus(neg)).sum()
        return total / (B * (1 + K))
    if kind == "margin":
        return (w * F.relu(margin - pos.unsqueeze(1) + neg)).sum(1).mean()
    raise ValueError(f"kind must be 'logsigmoid', 'softplus' or 'margin', got {kind!r}")


def kg_regularization(tensors: Sequence[Tensor], kind: str = "n3", weight: float = 1.0,
                      complex_halves: bool = False) -> Tensor:
    """``weight * sum_x sum(|x|^p) / rows(x)`` over the batch's embedding rows.

    kind: "l2" (p=2) or "n3" (p=3, Lacroix et al., 2018). complex_halves: treat each row as
    [real | imag] halves (ComplEx) and apply the norm to the complex moduli.
    """
    p = {"l2": 2, "n3": 3}.get(kind)
    if p is None:
        raise ValueError(f"kind must be 'l2' or 'n3', got {kind!r}")
    total = None
    for x in tensors:
        mag = x.abs()
        if complex_halves:
            re, im = x.chunk(2, dim=-1)
            mag = torch.sqrt(re * re + im * im + 1e-30)  # eps: finite gradient at 0
        term = mag.pow(p).sum() / max(x.shape[0], 1)
        total = term if total is None else total + term
    if total is None:
        raise ValueError("no tensors to regularise")
    return weight * total


__all__ = ["KGScorer", "DistMult", "ComplEx", "TransE", "kg_loss", "kg_regularization"]
