"""Link prediction: GraphSAGE over learnable node embeddings (plus fixed features if the dataset has them),
scored by a dot product or an MLP of the Hadamard product (``--scorer``; ``--scorer-layers`` linear layers,
``--scorer-hidden`` wide, with ReLU and ``--dropout`` between them).

* Batches (``--message-passing sampled``): ``dgl.dataloading.as_edge_prediction_sampler(NeighborSampler(
  --fanouts), negative_sampler=...)`` over the training edges of ``ds.graph``. On an undirected graph (every
  edge has its reverse) each pair is trained once (the ``src < dst`` edge, in both message-passing modes; both
  scorers are symmetric) and the pair's two edges are excluded from the batch's message passing
  (``exclude="reverse_id"``); on a directed graph every edge is trained and only itself is excluded.
  ``--negatives K`` candidate tails per batch, shared by every positive (``--neg-dist uniform|degree``), loss:
  binary cross-entropy (positives and negatives averaged apart).
* ``--message-passing full`` (OGB's full-batch baselines; the ogbl-ddi default): every batch encodes every node
  over the whole training graph, one block shared by all batches (:mod:`dgl_oac.dgl_frontend.sampling.full_graph`), with
  ``len(--fanouts)`` layers (the fanout values are not used), and scores the batch's edges against
  ``--negatives`` uniformly random pairs per positive; no edge is excluded from message passing (as in OGB's
  ``gnn.py``). Evaluation then encodes with the same full block.
* ``--autocast auto`` (the ogbl-ddi default): bf16 where the compute device has bfloat16 arithmetic of its own
  (:func:`native_bf16`), else off. Without it (an x86 CPU without AVX512-BF16 or AMX) DGL computes bfloat16
  message passing in its generic kernels, not libxsmm's: about 24x slower a call (0.12 against 0.005 s, a
  256-wide mean over 1.3M edges), and ogbl-ddi's default run took 19 s a step instead of 1.
* ``--autocast bf16``: the dense model (encoder and scorer) runs under ``torch.autocast(device, bfloat16)`` in
  training: its matrix products take bfloat16 inputs (on ogbl-ddi's 131K-pair MLP about 1.5x cheaper a batch on
  a CPU with AVX512-BF16); parameters, the embedding table, optimizer states, gradients reaching the table and
  the loss stay float32. Deterministic like float32, so oac still equals sync bit for bit. Evaluation always
  scores in float32: bfloat16 logits keep 8 significant bits, so the top scores of a ranking tie (a logit near
  10 moves in steps of 1/16) and a Hits@K that counts positives strictly above the K-th negative falls to 0.
* Embeddings start ``randn * 0.1``, or uniform in ``[-s, s]`` with ``--init-scale s``.
* ``--clip-grad-norm c`` (OGB's ogbl-ddi script: 1.0): after backward, the gradient of the batch's embedding rows,
  the encoder's and the scorer's are each clipped to norm ``c`` (``torch.nn.utils.clip_grad_norm_``) before the
  steps; with several trainers after the dense gradients are averaged, the rows' gradient on each trainer.
* Evaluation after each epoch: exact layer-wise GraphSAGE inference for every node (memory bounded by
  ``--eval-batch-size``), then per split:
  - per-positive negatives (ogbl-citation2 style ``valid_neg``/``test_neg``, or the synthetic set's): MRR and
    Hits@1/3/10 of each positive against its own negatives (OGB's evaluator for OGB names);
  - shared negative edges (ogbl-collab/ppa/ddi style): OGB's Hits@K for OGB names, else Hits@10/50/100;
  - no negatives shipped: ``EVAL_NEGATIVES`` uniform tails per positive, drawn once from ``--seed``.
  ``--eval-limit n`` scores a fixed random subset of ``n`` valid edges on every epoch (the best-validation
  epoch is chosen on it) and of ``n`` test edges on every epoch but the last; the driver asks
  :meth:`full_test` for all test edges at each new best validation epoch.
"""
from __future__ import annotations

import contextlib
from typing import Any, ContextManager, Dict, Optional, Tuple

import dgl
import torch
from torch import Tensor

from ...config import resolve_device
from ..data import LinkDataset
from ..metrics import ogb_link_eval, ranking_metrics
from ..models.link import LinkPredictor, link_bce_loss
from ...dgl_frontend.blocks import graph_to
from ..models.sage import SAGE, sage_inference
from ...dgl_frontend.sampling.full_graph import FullGraphEdgeSampler
from ...sampling.negative import make_negative_sampler
from . import backend
from .base import Task, check_dataset
from .common import TrainConfig
from .defaults import resolve_defaults

SCORERS = ("dot", "mlp")
NEG_DISTS = ("uniform", "degree")
MESSAGE_PASSING = ("sampled", "full")
#: --autocast values: the dtype the dense model's autocast region computes in ("off": float32 throughout)
AUTOCAST = ("auto", "off", "bf16")
#: uniform negative tails per positive when a dataset ships no evaluation negatives
EVAL_NEGATIVES = 100
#: float32 elements of one evaluation chunk's [edges, negatives, dim] products (256 MiB)
EVAL_ELEMENTS = 1 << 26


def native_bf16(device: torch.device, cpuinfo: str = "/proc/cpuinfo") -> bool:
    """Whether ``device`` computes in bfloat16 natively: a CUDA device that says so, or a CPU whose flags (Linux's
    ``cpuinfo``) include AVX512-BF16 or AMX-BF16 (x86) or BF16 (Arm). Elsewhere bfloat16 is emulated, and DGL's
    bfloat16 message passing leaves libxsmm for its generic kernels (module docstring: ``--autocast auto``)."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    if device.type != "cpu":
        return False
    try:
        with open(cpuinfo) as f:
            flags = {w for line in f if line.lower().startswith(("flags", "features")) for w in line.split()}
    except OSError:
        return False
    return bool(flags & {"avx512_bf16", "amx_bf16", "bf16"})


def resolve_autocast(autocast: str, device: torch.device) -> str:
    """``--autocast``: ``auto`` is ``bf16`` where :func:`native_bf16`, else ``off``; the others as given."""
    if autocast == "auto":
        return "bf16" if native_bf16(device) else "off"
    return autocast


def reverse_edge_ids(g: dgl.DGLGraph) -> Optional[Tensor]:
    """int64[E]: the id of each edge's reverse ``(v, u)``, or None when some edge has no reverse."""
    src, dst = (x.long() for x in g.edges())
    n, E = g.num_nodes(), g.num_edges()
    if E == 0:
        return None
    keys, order = torch.sort(src * n + dst)
    rkey = dst * n + src
    pos = torch.searchsorted(keys, rkey).clamp_(max=E - 1)
    if not bool((keys[pos] == rkey).all()):
        return None
    return order[pos]


class LinkTask(Task):
    def __init__(self, cfg: TrainConfig, ds: LinkDataset) -> None:
        check_dataset(ds, LinkDataset, "link", "a link-prediction dataset (edges with valid/test splits)",
                      "or e.g. --dataset synthetic or an ogbl-* dataset")
        resolve_defaults(cfg)  # a task built directly (not by build_task) gets the per-task defaults too
        if cfg.model != "sage":
            raise ValueError(f"--task link trains GraphSAGE (--model sage), got --model {cfg.model!r}")
        if cfg.scorer not in SCORERS:
            raise ValueError(f"unknown --scorer {cfg.scorer!r}; expected one of {', '.join(SCORERS)}")
        if cfg.neg_dist not in NEG_DISTS:
            raise ValueError(f"unknown --neg-dist {cfg.neg_dist!r}; expected one of {', '.join(NEG_DISTS)}")
        if cfg.message_passing not in MESSAGE_PASSING:
            raise ValueError(f"unknown --message-passing {cfg.message_passing!r}; expected one of "
                             f"{', '.join(MESSAGE_PASSING)}")
        if cfg.autocast not in AUTOCAST:
            raise ValueError(f"unknown --autocast {cfg.autocast!r}; expected one of {', '.join(AUTOCAST)}")
        if cfg.init_scale is not None and not cfg.init_scale > 0:
            raise ValueError(f"--init-scale must be positive, got {cfg.init_scale!r}")
        if not isinstance(cfg.scorer_hidden, int) or cfg.scorer_hidden < 1:
            raise ValueError(f"--scorer-hidden must be a positive integer, got {cfg.scorer_hidden!r}")
        if not isinstance(cfg.negatives, int) or cfg.negatives < 1:
            raise ValueError(f"--negatives must be a positive integer, got {cfg.negatives!r}")
        if cfg.eval_limit is not None and cfg.eval_limit < 1:
            raise ValueError(f"--eval-limit must be a positive integer, got {cfg.eval_limit}")
        if ds.graph.num_edges() == 0:
            raise ValueError(f"{ds.name!r} has no training edges")
        self.cfg, self.ds = cfg, ds
        self.device = resolve_device(cfg.device)
        self.autocast = resolve_autocast(cfg.autocast, self.device)  # "off" or "bf16"
        fan = cfg.fanout_list()
        torch.manual_seed(cfg.seed)  # model init and dropout: the same in every mode for one seed
        gen = torch.Generator().manual_seed(cfg.seed)
        scale = cfg.init_scale

        def init(t: Tensor) -> Tensor:
            if scale is None:
                return t.copy_(torch.randn(t.shape, generator=gen) * 0.1)
            return t.copy_((torch.rand(t.shape, generator=gen) * 2 - 1) * scale)

        self.emb = backend.make_embedding(cfg.mode, ds.graph.num_nodes(), cfg.dim, "emb", init, sharding=cfg.sharding)
        self.sparse = backend.make_sparse_optimizer(cfg.mode, cfg.optimizer, [self.emb], cfg.lr)
        self.feats = ds.features
        feat_dim = 0 if ds.features is None else ds.features.shape[1]
        encoder = SAGE(cfg.dim + feat_dim, cfg.hidden, cfg.hidden, len(fan), cfg.dropout)
        self.model = LinkPredictor(encoder, scorer=cfg.scorer, hidden_dim=cfg.scorer_hidden,
                                   mlp_layers=cfg.scorer_layers,
                                   dropout=cfg.dropout).to(self.device)
        self.dense = torch.optim.Adam(self.model.parameters(), lr=cfg.dense_lr)
        g = ds.graph
        rev = reverse_edge_ids(g)
        if rev is not None:  # undirected: one edge per pair, exclude both directions from message passing
            src, dst = g.edges()
            indices = torch.nonzero(src < dst).squeeze(1).long()
            exclude: Dict[str, Any] = {"exclude": "reverse_id", "reverse_eids": rev}
        else:
            indices = torch.arange(g.num_edges(), dtype=torch.int64)
            exclude = {"exclude": "self"}
        if indices.numel() == 0:
            raise ValueError(f"{ds.name!r} has no training edges between distinct nodes")
        self.undirected = rev is not None
        self.full: Optional[FullGraphEdgeSampler] = None
        if cfg.message_passing == "full":
            sampler = self.full = FullGraphEdgeSampler(len(fan), cfg.negatives)
        else:
            negs = make_negative_sampler(cfg.negatives, corrupt="tail", shared=True, distribution=cfg.neg_dist)
            sampler = dgl.dataloading.as_edge_prediction_sampler(
                dgl.dataloading.NeighborSampler(fan), negative_sampler=negs, **exclude)
        self.loader = backend.make_loader(cfg, g, indices, sampler, [self.emb], self.device)
        self._evals = 0
        self._subsets: Dict[str, Tensor] = {}
        self._sampled_neg: Dict[str, Tensor] = {}

    # --- training -----------------------------------------------------------------------------------------
    def _with_features(self, x: Tensor, input_nodes: Tensor) -> Tensor:
        if self.feats is None:
            return x
        return torch.cat([x, self.feats[input_nodes.cpu()].to(x.device)], dim=1)

    def _autocast(self) -> ContextManager[Any]:
        """The dense model's precision region (``--autocast``, ``auto`` resolved once) on the compute device."""
        if self.autocast == "off":
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=torch.bfloat16)

    def step(self, batch: Any) -> torch.Tensor:
        input_nodes, pair, neg, blocks = batch
        self.model.train()
        x = self.emb(input_nodes, self.device)  # the batch's rows: a leaf with a gradient after backward
        with self._autocast():
            pos_score, neg_score = self.model(pair, neg, blocks, self._with_features(x, input_nodes))
        loss = link_bce_loss(pos_score.float(), neg_score.float())
        if self.cfg.clip_grad_norm is None:
            return self.optimize(loss)
        encoder = list(self.model.encoder.parameters()) if self.model.encoder is not None else []
        scorer = [p for n, p in self.model.named_parameters() if not n.startswith("encoder.")]
        return self.optimize(loss, clip=([x], encoder, scorer), max_norm=self.cfg.clip_grad_norm)


    # --- evaluation ---------------------------------------------------------------------------------------

    def _rows(self, split: str, full: bool) -> Optional[Tensor]:
        """Row indices of the split's edges to score this epoch (None: all)."""
        n = getattr(self.ds, f"{split}_edges").shape[0]
        limit = self.cfg.eval_limit
        if (full and split == "test") or limit is None or limit >= n:
            return None
        if split not in self._subsets:
            gen = torch.Generator().manual_seed(self.cfg.seed + (2 if split == "valid" else 3))
            self._subsets[split] = torch.sort(torch.randperm(n, generator=gen)[:limit]).values
        return self._subsets[split]

    def _negatives(self, split: str) -> Tuple[str, Tensor]:
        """("per_edge", int64[E, K] tails) or ("shared", int64[M, 2] pairs)."""
        per_edge = getattr(self.ds, f"{split}_neg")
        if per_edge is not None:
            return "per_edge", per_edge
        shared = getattr(self.ds, f"{split}_neg_edges")
        if shared is not None:
            return "shared", shared
        if split not in self._sampled_neg:
            gen = torch.Generator().manual_seed(self.cfg.seed + (4 if split == "valid" else 5))
            E = getattr(self.ds, f"{split}_edges").shape[0]
            self._sampled_neg[split] = torch.randint(self.ds.graph.num_nodes(), (E, EVAL_NEGATIVES), generator=gen)
        return "per_edge", self._sampled_neg[split]

    @torch.no_grad()
    def _scores(self, h: Tensor, src: Tensor, dst: Tensor) -> Tensor:
        """Scores of pairs ``(src[i], dst[i, j])`` (dst int64[E] or int64[E, K]), chunked, on the CPU."""
        per = dst.shape[1] if dst.dim() == 2 else 1
        chunk = max(1, EVAL_ELEMENTS // max(per * h.shape[1], 1))
        out = []
        for start in range(0, src.shape[0], chunk):
            s = h[src[start:start + chunk].to(h.device)].to(self.device)
            d = h[dst[start:start + chunk].to(h.device)].to(self.device)
            if d.dim() == 3:
                s = s.unsqueeze(1)
            out.append(self.model.score_pairs(s, d).float().cpu())
        return torch.cat(out) if out else torch.empty(0)

    def evaluate(self) -> Dict[str, float]:
        self._evals += 1
        full = self._last_epoch()
        self._test_subset = self._rows("test", full) is not None
        return self._evaluate(("valid", "test"), full)

    @torch.no_grad()
    def _evaluate(self, splits: Tuple[str, ...], full: bool) -> Dict[str, float]:
        self.model.eval()
        table = backend.table_of(self.emb)
        feats = self.feats

        def rows(nodes: Tensor) -> Tensor:
            x = table[nodes.to(table.device)]
            return x if feats is None else torch.cat([x, feats[nodes.to(feats.device)]], dim=1)

        g = self.ds.graph
        if self.full is not None:  # the training batches' full block: one pass per layer over every edge
            blocks = [graph_to(self.full.full_block(g), self.device)] * self.model.encoder.num_layers
            h = self.model.encoder(blocks, rows(g.nodes()).to(self.device)).cpu()
        else:
            h = sage_inference(self.model.encoder, g, rows, self.cfg.eval_batch_size, self.device)
        out: Dict[str, float] = {}
        for split in splits:
            edges = getattr(self.ds, f"{split}_edges")
            if edges.shape[0] == 0:
                continue
            idx = self._rows(split, full)
            kind, neg = self._negatives(split)
            if idx is not None:
                edges = edges[idx]
                if kind == "per_edge":
                    neg = neg[idx]
            pos = self._scores(h, edges[:, 0], edges[:, 1])
            if kind == "per_edge":
                neg_scores = self._scores(h, edges[:, 0], neg)
                metrics = self._mrr(pos, neg_scores)
            else:
                metrics = self._hits(pos, self._scores(h, neg[:, 0], neg[:, 1]))
            out.update({f"{split}_{k}": v for k, v in metrics.items()})
        return out

    def _ogb_metric(self) -> Optional[str]:
        if not self.ds.ogb_name:
            return None
        from ogb.linkproppred import Evaluator
        return Evaluator(self.ds.ogb_name).eval_metric

    def _mrr(self, pos: Tensor, neg: Tensor) -> Dict[str, float]:
        if self._ogb_metric() == "mrr":
            return ogb_link_eval(self.ds.ogb_name, pos, neg)
        p = pos.unsqueeze(1)
        ranks = 1 + (neg > p).sum(1).double() + 0.5 * (neg == p).sum(1).double()
        return ranking_metrics(ranks)

    def _hits(self, pos: Tensor, neg: Tensor) -> Dict[str, float]:
        metric = self._ogb_metric()
        if metric is not None and metric.startswith("hits@"):
            return ogb_link_eval(self.ds.ogb_name, pos, neg)
        out = {}
        for k in (10, 50, 100):
            if neg.numel() < k:
                out[f"hits@{k}"] = 1.0
                continue
            kth = torch.topk(neg, k).values[-1]
            out[f"hits@{k}"] = float((pos > kth).double().mean())
        return out

    # --- bookkeeping --------------------------------------------------------------------------------------
    def dataset_info(self) -> Dict[str, Any]:
        g = self.ds.graph
        return {"name": self.ds.name, "nodes": g.num_nodes(), "edges": g.num_edges(),
                "train": int(self.ds.train_edges.shape[0]), "valid": int(self.ds.valid_edges.shape[0]),
                "test": int(self.ds.test_edges.shape[0]), "undirected": self.undirected,
                "features": 0 if self.feats is None else int(self.feats.shape[1])}


__all__ = ["LinkTask", "SCORERS", "MESSAGE_PASSING", "AUTOCAST", "reverse_edge_ids", "EVAL_NEGATIVES"]
