"""Evaluation: accuracy, ranking metrics, filtered KG ranks and OGB evaluator wrappers.

Rank convention (ties): ``rank = 1 + #higher + #tied / 2``, where ``#tied`` counts OTHER
candidates scoring exactly like the true entity. This is the mean of the optimistic and
pessimistic ranks, the convention of OGB's MRR evaluator (ogbl-citation2, ogbl-wikikg2) and
of LibKGE's default ``mean_rank`` tie handling (DGL-KE counts ties pessimistically;
``ties="pessimistic"`` gives that). It is the only convention under which a model scoring
everything equal (e.g. all zeros) gets the expected rank of a random order, not rank 1.
"""
from __future__ import annotations

from typing import Callable, Dict, Iterable, Optional, Sequence, Tuple, Union

import numpy as np
import torch
from torch import Tensor

Device = Union[str, torch.device]
# score_fn(kept int64[b], rel int64[b], corrupt "tail"|"head") -> float[b, num_entities]:
# scores of every entity as the replaced tail (kept = heads) or head (kept = tails).
ScoreFn = Callable[[Tensor, Tensor, str], Tensor]


def _triples(x) -> Tensor:
    """int[*, 3] array or tensor (any device) -> int64[T, 3] CPU tensor."""
    x = x.detach().cpu() if isinstance(x, Tensor) else torch.as_tensor(np.asarray(x))
    return x.long().reshape(-1, 3)


def _predictions(logits_or_pred: Tensor) -> Tensor:
    x = torch.as_tensor(logits_or_pred)
    if x.is_floating_point() and x.dim() == 2 and x.shape[1] > 1:
        return x.argmax(dim=1)
    return x.reshape(-1)


def accuracy(logits_or_pred: Tensor, labels: Tensor) -> float:
    """logits float[N, C] or predicted classes int[N] / int[N, 1]; labels int[N] or int[N, 1]."""
    pred = _predictions(logits_or_pred)
    y = torch.as_tensor(labels).reshape(-1).to(pred.device)
    if pred.shape != y.shape:
        raise ValueError(f"{pred.shape[0]} predictions for {y.shape[0]} labels")
    return float((pred == y).float().mean()) if y.numel() else 0.0


def ranking_metrics(ranks: Tensor, ks: Iterable[int] = (1, 3, 10)) -> Dict[str, float]:
    """ranks: float[T] (1-based, possibly half-integers) -> {"mrr", "hits@k" for k in ks}."""
    r = torch.as_tensor(ranks, dtype=torch.float64).reshape(-1)
    out = {"mrr": float((1.0 / r).mean())}
    for k in ks:
        out[f"hits@{k}"] = float((r <= k).double().mean())
    return out


class TripleFilter:
    """Known true triples as two sorted-key CSR maps: (h, r) -> tails and (t, r) -> heads.

    Keys are ``entity * R + relation`` (int64), sorted once; a query batch finds its ranges
    with two ``searchsorted`` calls and expands them without Python loops.
    true_triples: int[*, 3] (h, r, t) arrays/tensors, e.g. [train, valid, test].
    """

    def __init__(self, true_triples: Sequence, num_relations: Optional[int] = None) -> None:
        allt = torch.cat([_triples(x) for x in true_triples])
        self.num_relations = int(num_relations if num_relations is not None
                                 else (int(allt[:, 1].max()) + 1 if allt.numel() else 1))
        h, r, t = allt.unbind(1)
        self._maps = {"tail": self._build(h, r, t), "head": self._build(t, r, h)}

    def _build(self, ent: Tensor, rel: Tensor, other: Tensor) -> Tuple[Tensor, Tensor]:
        key = ent * self.num_relations + rel
        key, order = torch.sort(key, stable=True)
        return key, other[order]

    def to(self, device: Device) -> "TripleFilter":
        """A copy whose maps live on ``device``."""
        new = object.__new__(TripleFilter)
        new.num_relations = self.num_relations
        new._maps = {m: (k.to(device), v.to(device)) for m, (k, v) in self._maps.items()}
        return new

    def known(self, kept: Tensor, rel: Tensor, corrupt: str) -> Tuple[Tensor, Tensor]:
        """All known replacements: (rows int64[M], entities int64[M]) on the maps' device,
        meaning (kept[rows], rel[rows], entities) is a true triple (tail or head replaced)."""
        keys, vals = self._maps[corrupt]
        q = kept.to(keys.device).long() * self.num_relations + rel.to(keys.device).long()
        lo = torch.searchsorted(keys, q)
        counts = torch.searchsorted(keys, q, right=True) - lo
        rows = torch.repeat_interleave(torch.arange(q.shape[0], device=keys.device), counts)
        # Position inside each row's range: global index minus the row's first index.
        first = torch.repeat_interleave(torch.cumsum(counts, 0) - counts, counts)
        offsets = torch.arange(rows.shape[0], device=keys.device) - first
        return rows, vals[torch.repeat_interleave(lo, counts) + offsets]


@torch.no_grad()
def filtered_ranks(score_fn: ScoreFn, triples: Tensor,
                   all_true_triples: Union[None, Sequence, TripleFilter], num_entities: int,
                   corrupt: str = "both", batch_size: int = 256, device: Device = "cpu",
                   ties: str = "mean") -> Tensor:
    """Filtered (or raw, with ``all_true_triples=None``) link-prediction ranks.

    Every entity is scored as the replacement of the tail (and/or head) of each test
    triple; candidates forming a known true triple are removed (the filtered setting of
    Bordes et al., 2013), the true entity itself never competes, and
    ``rank = 1 + #higher + tie_term`` with tie_term ``#tied/2`` ("mean"), 0 ("optimistic")
    or ``#tied`` ("pessimistic"). Triples are processed ``batch_size`` at a time, so peak
    memory is O(batch_size * num_entities).
    triples: int[T, 3]. Returns float64[T] (CPU) for one mode, float64[2T] for "both"
    (tail-corruption ranks first, then head-corruption ranks).
    """
    if corrupt not in ("tail", "head", "both"):
        raise ValueError(f"corrupt must be 'tail', 'head' or 'both', got {corrupt!r}")
    tie_w = {"mean": 0.5, "optimistic": 0.0, "pessimistic": 1.0}.get(ties)
    if tie_w is None:
        raise ValueError(f"ties must be 'mean', 'optimistic' or 'pessimistic', got {ties!r}")
    triples = _triples(triples)
    filt = all_true_triples
    if filt is not None and not isinstance(filt, TripleFilter):
        filt = TripleFilter(filt)
    if filt is not None:
        filt = filt.to(device)
    out = []
    for mode in (("tail", "head") if corrupt == "both" else (corrupt,)):
        for chunk in triples.split(batch_size):
            h, r, t = chunk.to(device).unbind(1)
            kept, target = (h, t) if mode == "tail" else (t, h)
            scores = score_fn(kept, r, mode)
            if scores.shape != (chunk.shape[0], num_entities):
                raise ValueError(f"score_fn returned {tuple(scores.shape)}, expected "
                                 f"({chunk.shape[0]}, {num_entities})")
            rows = torch.arange(chunk.shape[0], device=scores.device)
            target = target.to(scores.device)
            target_score = scores[rows, target].unsqueeze(1)
            if torch.isnan(target_score).any():
                raise ValueError("score_fn returned NaN for a true triple")
            competes = torch.ones_like(scores, dtype=torch.bool)
            if filt is not None:
                fr, fe = filt.known(kept, r, mode)
                competes[fr.to(scores.device), fe.to(scores.device)] = False
            competes[rows, target] = False
            higher = ((scores > target_score) & competes).sum(1)
            tied = ((scores == target_score) & competes).sum(1)
            # float64: half-integer ranks stay exact beyond 2**24 entities.
            out.append((1 + higher.double() + tie_w * tied.double()).cpu())
    return torch.cat(out) if out else torch.empty(0, dtype=torch.float64)


def kg_score_fn(model, entity_emb: Tensor, device: Device) -> ScoreFn:
    """ScoreFn for a KG scorer (``model.score_neg``) and a full entity table
    float32[N, D] (any device; copied to ``device`` once)."""
    ent = entity_emb.detach().to(device)

    def fn(kept: Tensor, rel: Tensor, corrupt: str) -> Tensor:
        return model.score_neg(ent[kept.to(device)], rel, ent, corrupt)
    return fn


def _cpu(x) -> Tensor:
    return torch.as_tensor(x).detach().cpu()


def ogb_node_eval(name: str, logits_or_pred: Tensor, labels: Tensor) -> Dict[str, float]:
    """OGB node-property Evaluator (e.g. ogbn-arxiv -> {"acc": ...})."""
    from ogb.nodeproppred import Evaluator
    ev = Evaluator(name)
    y_true = _cpu(labels)
    if ev.eval_metric == "acc":
        y_pred, y_true = _predictions(_cpu(logits_or_pred)).view(-1, 1), y_true.view(-1, 1)
    else:  # rocauc (ogbn-proteins): raw scores [N, tasks]
        y_pred = _cpu(logits_or_pred)
    return {k: float(v) for k, v in ev.eval({"y_true": y_true, "y_pred": y_pred}).items()}


def ogb_link_eval(name: str, pos_score: Tensor, neg_score: Tensor) -> Dict[str, float]:
    """OGB link-property Evaluator. MRR datasets (ogbl-citation2, -wikikg2, -biokg):
    pos float[E], neg float[E, K] -> {"mrr", "hits@1", "hits@3", "hits@10"}; hits@K datasets
    (ogbl-collab, -ddi, -ppa): neg float[E'] -> {"hits@K"}."""
    from ogb.linkproppred import Evaluator
    ev = Evaluator(name)
    pos = _cpu(pos_score).float().reshape(-1)
    neg = _cpu(neg_score).float()
    if ev.eval_metric == "mrr":
        neg = neg.reshape(pos.shape[0], -1)
    elif ev.eval_metric.startswith("hits@"):
        neg = neg.reshape(-1)
    res = ev.eval({"y_pred_pos": pos, "y_pred_neg": neg})
    return {k[:-len("_list")] if k.endswith("_list") else k: float(torch.as_tensor(v).float().mean())
            for k, v in res.items()}


__all__ = ["accuracy", "ranking_metrics", "TripleFilter", "filtered_ranks", "kg_score_fn",
           "ogb_node_eval", "ogb_link_eval"]
