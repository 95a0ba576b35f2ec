"""Link prediction: an encoder over blocks (or none, for shallow embeddings) + a pair scorer."""
from __future__ import annotations

from typing import List, Optional, Tuple

import dgl
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...device.rows import gather_rows


class LinkPredictor(nn.Module):
    """Scores the positive and negative pair graphs of an edge mini-batch.

    encoder: a module ``encoder(blocks, x) -> h[num_dst(blocks[-1]), out_dim]`` (e.g.
    :class:`~dgl_oac.app.models.sage.SAGE`) or None for zero GNN layers, in which case ``x`` are
    already the pair graph's node rows (``pair_graph.ndata[name]`` from the loader).
    scorer: "dot" (<h_u, h_v>) or "mlp" (MLP on the Hadamard product h_u * h_v, as in the
    OGB link-prediction baselines). hidden_dim: MLP width (default: the embedding dim);
    emb_dim: the embedding dim, needed for "mlp" when there is no encoder with ``out_dim``;
    mlp_layers: linear layers of the MLP (>= 1; OGB's baselines use 3), with ReLU and ``dropout``
    between them.
    """

    def __init__(self, encoder: Optional[nn.Module] = None, scorer: str = "dot",
                 hidden_dim: Optional[int] = None, emb_dim: Optional[int] = None, mlp_layers: int = 2,
                 dropout: float = 0.0) -> None:
        super().__init__()
        self.encoder = encoder
        self.scorer = scorer
        if scorer == "mlp":
            dim = emb_dim if emb_dim is not None else getattr(encoder, "out_dim", None)
            if dim is None:
                raise ValueError("scorer='mlp' needs emb_dim (or an encoder with out_dim)")
            if not isinstance(mlp_layers, int) or mlp_layers < 1:
                raise ValueError(f"mlp_layers must be a positive integer, got {mlp_layers!r}")
            hid = hidden_dim or dim
            dims = [dim] + [hid] * (mlp_layers - 1) + [1]
            layers: List[nn.Module] = []
            for i in range(mlp_layers):
                if i:
                    layers += [nn.ReLU()] + ([nn.Dropout(dropout)] if dropout else [])
                layers.append(nn.Linear(dims[i], dims[i + 1]))
            self.mlp = nn.Sequential(*layers)
        elif scorer != "dot":
            raise ValueError(f"scorer must be 'dot' or 'mlp', got {scorer!r}")

    def score_pairs(self, h_src: Tensor, h_dst: Tensor) -> Tensor:
        """h_src, h_dst: float32[..., D] (broadcastable, e.g. [E,1,D] vs [E,K,D]) -> [...]."""
        prod = h_src * h_dst
        if self.scorer == "dot":
            return prod.sum(-1)
        return self.mlp(prod).squeeze(-1)

    def encode(self, blocks: List[dgl.DGLGraph], x: Tensor) -> Tensor:
        """Node representations of the pair graph's nodes: float32[n, D], x's device."""
        if not blocks:
            return x
        if self.encoder is None:
            raise ValueError("got blocks but this LinkPredictor has no encoder")
        return self.encoder(blocks, x)

    def forward(self, pair_graph: dgl.DGLGraph, neg_pair_graph: dgl.DGLGraph,
                blocks: List[dgl.DGLGraph], x: Tensor) -> Tuple[Tensor, Tensor]:
        """-> (pos_score float32[E], neg_score float32[E']) on x's device.

        With blocks, x: float32[num_src(blocks[0]), in_dim]; the last block's dst nodes are
        the pair graphs' nodes (DGL's ``as_edge_prediction_sampler`` convention). Without
        blocks, x: float32[pair_graph.num_nodes(), D].
        """
        h = self.encode(blocks, x)
        return self._score_graph(pair_graph, h), self._score_graph(neg_pair_graph, h)

    def _score_graph(self, graph: dgl.DGLGraph, h: Tensor) -> Tensor:
        src, dst = (x.to(h.device).long() for x in graph.edges())
        # gather_rows, not h[src]: a deterministic backward on CUDA, and on the CPU faster than advanced indexing's
        # serial, sorting index_put_ (64K-pair batches over 4K nodes: the step's hot spot)
        return self.score_pairs(gather_rows(h, src), gather_rows(h, dst))


def link_bce_loss(pos_score: Tensor, neg_score: Tensor) -> Tensor:
    """Binary cross-entropy on logits, positives and negatives averaged separately (so the
    negative ratio does not reweight the two classes). pos: [E], neg: [E'] -> scalar."""
    pos = F.binary_cross_entropy_with_logits(pos_score, torch.ones_like(pos_score))
    neg = F.binary_cross_entropy_with_logits(neg_score, torch.zeros_like(neg_score))
    return pos + neg


__all__ = ["LinkPredictor", "link_bce_loss"]
