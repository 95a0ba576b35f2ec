"""Knowledge-graph embeddings: DistMult / ComplEx / TransE with entity rows in dgl-oac's CPU table.

* Entities: one ``NodeEmbedding`` row each (``--dim`` columns; ComplEx stores ``[real | imag]`` halves),
  initialised uniform in ``[-s, s]`` from a generator seeded with ``--seed`` (never zeros: a bilinear score
  of zero vectors has zero gradient), updated by the sparse row optimizer (``--optimizer``, ``--lr``).
* Relations: a dense ``nn.Embedding`` inside the scorer, on the compute device, updated every step by the
  torch optimizer of the same kind as ``--optimizer`` with ``--dense-lr``.
* Batches: ``--batch-size`` training triples (edge ids of ``ds.graph``, which holds the train triples with
  ``edata["etype"]``) from :class:`~dgl_oac.dgl_frontend.sampling.edge.EdgeBatchSampler` (without DGL: the same
  batches from :class:`~dgl_oac.sampling.edge_batch.EdgeBatches` through a ``BatchLoader``), with ``--negatives`` candidate
  entities drawn once per batch (``--neg-dist uniform|degree``) and shared by every positive, for both head
  and tail corruption (the lean layout: scores are two ``[B, K]`` matmuls).
* Loss (``--loss``): ``ce`` = sampled softmax cross-entropy of each positive against the ``K`` candidates
  (default for DistMult/ComplEx), or ``logsigmoid`` (default for TransE) / ``softplus`` / ``margin`` from
  :func:`dgl_oac.app.models.kg.kg_loss` (``--adv-temperature`` for self-adversarial weights). A candidate that
  equals the positive's true entity is masked out. Optional ``--regularizer n3|l2 --reg-weight w`` on the
  batch's (head, relation, tail) rows.
* Evaluation after each epoch: filtered MRR and Hits@1/3/10 on valid and test (both corruption sides, mean
  tie rank), scoring every entity on the compute device in chunks of at most ``EVAL_SCORES`` scores
  (memory bounded whatever ``--eval-batch-size``). Datasets shipping per-triple negatives (ogbl-wikikg2) are
  ranked against those instead, with OGB's evaluator. ``--eval-limit n`` ranks a fixed random subset of ``n``
  valid triples on every epoch (comparable across epochs: the best-validation epoch is chosen on it) and of
  ``n`` test triples on every epoch but the last; the driver asks :meth:`full_test` for all test triples at
  each new best validation epoch.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Dict, Optional, Tuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from ...config import resolve_device
from ...device.rows import gather_rows
from ...sampling.edge_batch import EdgeBatchMaker
from ...sampling.negative import make_negative_sampler
from ..data import KGDataset
from ..metrics import TripleFilter, filtered_ranks, kg_score_fn, ogb_link_eval, ranking_metrics
from ..models.kg import ComplEx, DistMult, KGScorer, TransE, kg_loss, kg_regularization
from . import backend
from .base import Task, check_dataset
from .common import TrainConfig
from .defaults import resolve_defaults

KG_MODELS = ("distmult", "complex", "transe")
KG_LOSSES = ("auto", "ce", "logsigmoid", "softplus", "margin")
REGULARIZERS = ("n3", "l2", "none")
NEG_DISTS = ("uniform", "degree")
#: entity scores per evaluation chunk (float32: 64 MiB, plus a few masks of the same shape)
EVAL_SCORES = 1 << 24
#: default entity init half-width, per model (uniform in [-s, s])
DEFAULT_INIT = {"distmult": 0.1, "complex": 0.1, "transe": 0.1}
_MASKED = -1e9  # score of a candidate equal to the true entity (finite: no inf * 0 in any loss)


#: elements of one independently seeded block of :func:`seeded_uniform` (16 MiB of float32)
INIT_BLOCK = 1 << 22


def seeded_uniform(seed: int, scale: float, threads: Optional[int] = None) -> Callable[[Tensor], Tensor]:
    """init_func filling a table uniform in [-scale, scale) (the global RNG is left alone). The values are one
    stream over the table's elements in row-major order: element ``i`` of the stream comes from block
    ``i // INIT_BLOCK``, drawn by numpy's PCG64 seeded with ``(seed, block)``. So successive calls continue the
    stream (a table filled in chunks, file-backed, gets the values of one call on the whole table) in every
    mode and run with this seed, and the blocks are filled in parallel: a 10M x 256 table in 12 s on this
    project's 2 cores, where one torch generator took 28 s. Make one per table: a second table filled by the same
    init_func continues the stream.

    ``threads``: the fill's threads (default: torch's intra-op thread count); the values do not depend on it.
    """
    produced = 0  # elements of the stream handed out by earlier calls

    def fill_block(flat: np.ndarray, start: int, block: int) -> None:
        # numpy only: its draws and array arithmetic release the GIL, and start no OpenMP team per thread
        lo, hi = max(block * INIT_BLOCK, start), min((block + 1) * INIT_BLOCK, start + flat.size)
        rng = np.random.Generator(np.random.PCG64([seed, block]))
        if lo > block * INIT_BLOCK:  # the block's head went to an earlier call: skip it in the stream
            rng.random(lo - block * INIT_BLOCK, dtype=np.float32)
        out = flat[lo - start:hi - start]
        rng.random(dtype=np.float32, out=out)
        out *= np.float32(2.0 * scale)
        out -= np.float32(scale)

    def init(t: Tensor) -> Tensor:
        nonlocal produced
        if t.dtype != torch.float32:
            raise TypeError(f"seeded_uniform fills float32 tables, got {t.dtype}")
        out = t if t.is_contiguous() else torch.empty_like(t, memory_format=torch.contiguous_format)
        flat, start = out.detach().view(-1).numpy(), produced
        produced += flat.size
        if flat.size == 0:
            return out
        blocks = range(start // INIT_BLOCK, (start + flat.size - 1) // INIT_BLOCK + 1)
        workers = max(1, min(threads or torch.get_num_threads(), len(blocks)))
        if workers == 1:
            for b in blocks:
                fill_block(flat, start, b)
        else:  # numpy's draws and arithmetic release the GIL: the blocks fill in parallel
            with ThreadPoolExecutor(workers, thread_name_prefix="dgl-oac-init") as pool:
                list(pool.map(lambda b: fill_block(flat, start, b), blocks))
        return out
    return init


def dense_optimizer(kind: str, params, lr: float) -> torch.optim.Optimizer:
    """The torch optimizer matching the sparse one (``--optimizer``) for dense parameters."""
    if kind in ("adagrad", "rowwise_adagrad"):
        return torch.optim.Adagrad(params, lr=lr)
    if kind == "sgd":
        return torch.optim.SGD(params, lr=lr)
    return torch.optim.Adam(params, lr=lr)


def build_scorer(model: str, num_relations: int, dim: int, seed: int) -> KGScorer:
    cls = {"distmult": DistMult, "complex": ComplEx, "transe": TransE}[model]
    scorer = cls(num_relations, dim)
    # Re-initialise from a private generator (same bound as the scorer's xavier_uniform): reproducible
    # without touching torch's global RNG.
    w = scorer.relation.weight
    bound = (6.0 / (w.shape[0] + w.shape[1])) ** 0.5
    with torch.no_grad():
        gen = torch.Generator().manual_seed(seed + 1)
        w.copy_(torch.empty(w.shape).uniform_(-bound, bound, generator=gen))
    return scorer


class KGTask(Task):
    def __init__(self, cfg: TrainConfig, ds: KGDataset) -> None:
        check_dataset(ds, KGDataset, "kg", "a knowledge-graph dataset (head, relation, tail triples)",
                      "or a KG such as FB15k-237, WN18RR, codex-m, ogbl-wikikg2 or synthetic")
        resolve_defaults(cfg)  # a task built directly (not by build_task) gets the per-task defaults too
        model = cfg.model
        if model not in KG_MODELS:
            raise ValueError(f"--task kg: unknown --model {cfg.model!r}; expected one of {', '.join(KG_MODELS)}")
        loss = cfg.loss if cfg.loss != "auto" else ("logsigmoid" if model == "transe" else "ce")
        if loss not in KG_LOSSES:
            raise ValueError(f"unknown --loss {cfg.loss!r}; expected one of {', '.join(KG_LOSSES)}")
        if cfg.regularizer not in REGULARIZERS:
            raise ValueError(f"unknown --regularizer {cfg.regularizer!r}; expected one of "
                             f"{', '.join(REGULARIZERS)}")
        if cfg.neg_dist not in NEG_DISTS:
            raise ValueError(f"unknown --neg-dist {cfg.neg_dist!r}; expected one of {', '.join(NEG_DISTS)}")
        if not isinstance(cfg.negatives, int) or cfg.negatives < 1:
            raise ValueError(f"--negatives must be a positive integer, got {cfg.negatives!r}")
        if cfg.reg_weight < 0:
            raise ValueError(f"--reg-weight must be >= 0, got {cfg.reg_weight}")
        if cfg.eval_limit is not None and cfg.eval_limit < 1:
            raise ValueError(f"--eval-limit must be a positive integer, got {cfg.eval_limit}")
        if model == "complex" and cfg.dim % 2:
            raise ValueError(f"--model complex needs an even --dim (real and imaginary halves), got {cfg.dim}")
        if ds.train.shape[0] == 0:
            raise ValueError(f"{ds.name!r} has no training triples")
        self.cfg, self.ds, self.model_name, self.loss_kind = cfg, ds, model, loss
        self.device = resolve_device(cfg.device)
        scale = cfg.init_scale if cfg.init_scale is not None else DEFAULT_INIT[model]
        self.emb = backend.make_embedding(cfg.mode, ds.num_entities, cfg.dim, "entity",
                                          seeded_uniform(cfg.seed, scale), sharding=cfg.sharding)
        self.sparse = backend.make_sparse_optimizer(cfg.mode, cfg.optimizer, [self.emb], cfg.lr)
        self.model = build_scorer(model, ds.num_relations, cfg.dim, cfg.seed).to(self.device)
        self.dense = dense_optimizer(cfg.optimizer, self.model.parameters(), cfg.dense_lr)
        negs = make_negative_sampler(cfg.negatives, corrupt="both", shared=True, distribution=cfg.neg_dist)
        self.loader, self.sampler = backend.make_edge_loader(
            cfg, ds, EdgeBatchMaker(negs, materialize_negatives=False), [self.emb], self.device)
        self.filter = TripleFilter([ds.train, ds.valid, ds.test], ds.num_relations).to(self.device)
        self._evals = 0
        self._subsets: Dict[str, Tensor] = {}

    # --- training -----------------------------------------------------------------------------------------
    def step(self, batch: Any) -> float:
        input_nodes, pair, neg, _ = batch
        self.model.train()
        x = self.emb(input_nodes, self.device)
        src, dst = (e.to(self.device).long() for e in pair.edges())
        rel = pair.edata["etype"].to(self.device)
        h, t = gather_rows(x, src), gather_rows(x, dst)  # a deterministic backward on every device
        pos = self.model.score(h, rel, t)
        losses = []
        for mode, cand in self.sampler.unpack(pair, neg):
            cand = cand.to(self.device)
            kept, target = (h, dst) if mode == "tail" else (t, src)
            scores = self.model.score_neg(kept, rel, gather_rows(x, cand), mode)
            scores = scores.masked_fill(target.unsqueeze(1) == cand.unsqueeze(0), _MASKED)
            losses.append(self._loss(pos, scores))
        loss = sum(losses) / len(losses)
        if self.cfg.regularizer != "none" and self.cfg.reg_weight > 0:
            factors = [h, self.model.rel(rel, h), t]
            if self.model_name == "transe":
                factors = factors[::2]  # TransE's relations are translations: leave them unpenalised
            loss = loss + kg_regularization(factors, self.cfg.regularizer, self.cfg.reg_weight,
                                            complex_halves=self.model_name == "complex")
        return self.optimize(loss)

    def _loss(self, pos: Tensor, neg: Tensor) -> Tensor:
        if self.loss_kind == "ce":
            logits = torch.cat([pos.unsqueeze(1), neg], dim=1)
            return F.cross_entropy(logits, torch.zeros(pos.shape[0], dtype=torch.int64, device=pos.device))
        return kg_loss(pos, neg, self.loss_kind, self.cfg.adv_temperature)


    # --- evaluation ---------------------------------------------------------------------------------------

    def _split(self, split: str, full: bool) -> Tensor:
        triples = getattr(self.ds, split)
        limit = self.cfg.eval_limit
        if (full and split == "test") or limit is None or limit >= triples.shape[0]:
            return triples
        if split not in self._subsets:
            gen = torch.Generator().manual_seed(self.cfg.seed + (2 if split == "valid" else 3))
            self._subsets[split] = torch.sort(torch.randperm(triples.shape[0], generator=gen)[:limit]).values
        return triples[self._subsets[split]]

    def eval_chunk(self) -> int:
        return max(1, min(self.cfg.eval_batch_size, EVAL_SCORES // max(self.ds.num_entities, 1)))

    def evaluate(self) -> Dict[str, float]:
        self._evals += 1
        full = self._last_epoch()
        self._test_subset = self._split("test", full).shape[0] < self.ds.test.shape[0]
        return self._evaluate(("valid", "test"), full)

    @torch.no_grad()
    def _evaluate(self, splits: Tuple[str, ...], full: bool) -> Dict[str, float]:
        self.model.eval()
        ent = backend.table_of(self.emb).detach().to(self.device).contiguous()
        out: Dict[str, float] = {}
        for split in splits:
            triples = self._split(split, full)
            if triples.shape[0] == 0:
                continue
            negatives = self.ds.negatives or {}
            if f"{split}_head_neg" in negatives and f"{split}_tail_neg" in negatives:
                metrics = self._given_negatives(ent, split, triples, negatives)
            else:
                ranks = filtered_ranks(kg_score_fn(self.model, ent, self.device), triples, self.filter,
                                       self.ds.num_entities, corrupt="both", batch_size=self.eval_chunk(),
                                       device=self.device)
                metrics = ranking_metrics(ranks)
            out.update({f"{split}_{k}": v for k, v in metrics.items()})
        return out

    def _given_negatives(self, ent: Tensor, split: str, triples: Tensor,
                         negatives: Dict[str, Tensor]) -> Dict[str, float]:
        """OGB-style: each positive against its own shipped head and tail negatives."""
        rows = triples if triples.shape[0] == getattr(self.ds, split).shape[0] else None
        index = None if rows is not None else self._subsets[split]
        pos_all, neg_all = [], []
        for mode in ("head", "tail"):
            cands = negatives[f"{split}_{mode}_neg"]
            if index is not None:
                cands = cands[index]
            K = cands.shape[1]
            chunk = max(1, EVAL_SCORES // max(K * self.cfg.dim, 1))
            for start in range(0, triples.shape[0], chunk):
                h, r, t = triples[start:start + chunk].to(self.device).unbind(1)
                c = ent[cands[start:start + chunk].to(self.device)]  # [b, K, D]
                if mode == "tail":
                    neg = self.model.score(ent[h].unsqueeze(1), r.unsqueeze(1), c)
                else:
                    neg = self.model.score(c, r.unsqueeze(1), ent[t].unsqueeze(1))
                pos_all.append(self.model.score(ent[h], r, ent[t]).cpu())
                neg_all.append(neg.cpu())
        pos, neg = torch.cat(pos_all), torch.cat(neg_all)
        if self.ds.ogb_name:
            return ogb_link_eval(self.ds.ogb_name, pos, neg)
        ranks = 1 + (neg > pos.unsqueeze(1)).sum(1).double() + 0.5 * (neg == pos.unsqueeze(1)).sum(1).double()
        return ranking_metrics(ranks)

    # --- bookkeeping --------------------------------------------------------------------------------------
    def dataset_info(self) -> Dict[str, Any]:
        return {"name": self.ds.name, "entities": self.ds.num_entities, "relations": self.ds.num_relations,
                "train": int(self.ds.train.shape[0]), "valid": int(self.ds.valid.shape[0]),
                "test": int(self.ds.test.shape[0]), "model": self.model_name, "loss": self.loss_kind}


__all__ = ["KGTask", "KG_MODELS", "KG_LOSSES", "REGULARIZERS", "NEG_DISTS"]
