"""A synthetic heterograph with the shape of ogbn-mag (``dgl-oac train --dataset synthetic-mag``).

Node types in ogbn-mag's proportions (paper 38%, author 58%, institution 0.45%, field_of_study 3.1% of
``num_nodes``); relations ``author-writes->paper``, ``author-affiliated_with->institution``,
``paper-cites->paper``, ``paper-has_topic->field_of_study``, each with its reverse (``rev_<name>``), as
DGL's R-GCN recipes for ogbn-mag add them. Features on papers only (``float32[P, feat_dim]``), labels on
papers: the other types are featureless and need learnable embeddings, which is the point of the dataset.

Planted signal: every node of every type gets one of ``num_classes`` communities uniformly at random; each
edge picks its paper-side endpoint by a fixed count per paper (per author for ``affiliated_with``) and its
other endpoint from the same community with probability ``homophily`` (else from anywhere), skewed towards
low ranks inside the community (``rank = floor(count * u**skew)``, a power-law-like degree spread with hubs
that many batches share). A paper's label is its community; its features are its community's centroid times
``feature_signal`` plus unit Gaussian noise, weak on purpose, so the authors and topics a model learns
embeddings for carry most of the signal. Generation is vectorised (no Python loop over nodes or edges);
multi-edges may occur, as in any random multigraph.

Measured on the 2-core dev machine while other jobs kept the load at 12-18 (indicative only): 1M nodes
(11.8M edges with reverses) in 12 s, peak RSS 0.9 GiB; 10M nodes (118M edges) in 197 s, peak RSS 4.3 GiB.
"""
from __future__ import annotations

from typing import Dict, Tuple

import torch
from torch import Tensor

from ._graphs import random_split
from .types import HeteroNodeDataset

#: ogbn-mag's node counts as fractions of its 1,939,743 nodes
FRACTIONS = {"paper": 736389, "author": 1134649, "institution": 8740, "field_of_study": 59965}
#: edges per source node of each relation (ogbn-mag has about 9.7 writes and 10.2 topics per paper, 7.3
#: citations per paper, 0.9 affiliations per author; smaller here so 10M nodes fit in memory)
RELATIONS = {("author", "writes", "paper"): ("paper", 4), ("author", "affiliated_with", "institution"):
             ("author", 1), ("paper", "cites", "paper"): ("paper", 5),
             ("paper", "has_topic", "field_of_study"): ("paper", 5)}


def _counts(num_nodes: int) -> Dict[str, int]:
    total = sum(FRACTIONS.values())
    return {nt: max(2, round(num_nodes * f / total)) for nt, f in FRACTIONS.items()}


class _Community:
    """Nodes of one type laid out community by community, in a random order inside each."""

    def __init__(self, labels: Tensor, num_classes: int, gen: torch.Generator) -> None:
        perm = torch.randperm(labels.numel(), generator=gen)
        self.order = perm[torch.argsort(labels[perm], stable=True)]
        self.count = torch.bincount(labels, minlength=num_classes)
        self.start = torch.cumsum(self.count, 0) - self.count
        self.n = labels.numel()

    def draw(self, cls: Tensor, homophily: float, skew: float, gen: torch.Generator) -> Tensor:
        """One node per entry of ``cls: int64[m]``: from that community w.p. ``homophily``, else anywhere."""
        u = torch.rand(cls.numel(), generator=gen, dtype=torch.float64) ** skew
        same = torch.rand(cls.numel(), generator=gen) < homophily
        count = torch.where(same, self.count[cls], torch.full_like(cls, self.n))
        start = torch.where(same, self.start[cls], torch.zeros_like(cls))
        ok = count > 0  # an empty community (tiny graphs): anywhere
        rank = torch.where(ok, start + (u * count).long().clamp_max(count - 1), (u * self.n).long())
        return self.order[rank.clamp_max(self.n - 1)]


def generate_mag(num_nodes: int = 100_000, num_classes: int = 8, feat_dim: int = 64, homophily: float = 0.5,
                 feature_signal: float = 0.1, skew: float = 2.0, split: Tuple[float, float, float] = (0.6, 0.2, 0.2),
                 seed: int = 0) -> HeteroNodeDataset:
    """An ogbn-mag-shaped :class:`HeteroNodeDataset` with about ``num_nodes`` nodes (see the module docstring);
    node classification of papers."""
    if num_nodes < 16 or num_classes < 2 or feat_dim < 1:
        raise ValueError(f"synthetic-mag needs num_nodes >= 16, num_classes >= 2, feat_dim >= 1; got "
                         f"{num_nodes}, {num_classes}, {feat_dim}")
    if not 0.0 <= homophily <= 1.0:
        raise ValueError(f"homophily must be in [0, 1], got {homophily}")
    gen = torch.Generator().manual_seed(seed)
    counts = _counts(num_nodes)
    labels = {nt: torch.randint(0, num_classes, (n,), generator=gen) for nt, n in counts.items()}
    layout = {nt: _Community(labels[nt], num_classes, gen) for nt in counts}
    data: Dict[Tuple[str, str, str], Tuple[Tensor, Tensor]] = {}
    for (src_t, rel, dst_t), (anchor, per) in RELATIONS.items():
        fixed = torch.arange(counts[anchor]).repeat_interleave(per)  # every anchor node gets `per` edges
        other_t = dst_t if anchor == src_t else src_t
        other = layout[other_t].draw(labels[anchor][fixed], homophily, skew, gen)
        src, dst = (fixed, other) if anchor == src_t else (other, fixed)
        data[(src_t, rel, dst_t)] = (src, dst)
        data[(dst_t, "rev_" + rel, src_t)] = (dst, src)
    import dgl  # a heterograph: this dataset is DGL's (the application may import it; the engine does not)

    graph = dgl.heterograph(data, num_nodes_dict=counts, idtype=torch.int64)
    centroids = torch.randn(num_classes, feat_dim, generator=gen)
    papers = labels["paper"]
    features = centroids[papers] * feature_signal + torch.randn(papers.numel(), feat_dim, generator=gen)
    train, valid, test = random_split(papers.numel(), seed, split, gen)
    return HeteroNodeDataset(name="synthetic-mag", graph=graph, labels=papers, num_classes=num_classes,
                             train_idx=train, valid_idx=valid, test_idx=test, features={"paper": features},
                             target_ntype="paper")
