"""Graph and split helpers shared by every loader (synthetic, files, OGB)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Optional, Sequence, Tuple

import numpy as np
import torch
from torch import Tensor

if TYPE_CHECKING:
    import dgl


def as_long(x: object) -> Tensor:
    """numpy/torch/list -> int64 CPU tensor (OGB mixes numpy arrays and tensors)."""
    if isinstance(x, np.ndarray):
        x = torch.from_numpy(np.ascontiguousarray(x))
    return torch.as_tensor(x).to(torch.int64).cpu()


def canonical_pairs(src: Tensor, dst: Tensor, num_nodes: int) -> Tensor:
    """Unique undirected pairs without self loops: int64[U] keys ``min * N + max``, sorted.

    Keys instead of ``unique(dim=0)``: a 1-D sort is far cheaper and N*N < 2**63 for N < 3e9.
    """
    lo, hi = torch.minimum(src, dst), torch.maximum(src, dst)
    keep = lo != hi
    return torch.unique(lo[keep] * num_nodes + hi[keep])


def undirected_graph(edges: Tensor, num_nodes: int) -> Tuple[dgl.DGLGraph, Tensor]:
    """int64[E,2] edges (any direction, duplicates, loops) -> (graph, both directions; pairs int64[U,2]).

    The graph has exactly ``2 * U`` edges, where ``U`` is the number of distinct undirected non-loop pairs.
    """
    keys = canonical_pairs(edges[:, 0], edges[:, 1], num_nodes)
    pairs = torch.stack([keys // num_nodes, keys % num_nodes], dim=1)
    return bidirected_graph(pairs, num_nodes), pairs


def bidirected_graph(pairs: Tensor, num_nodes: int) -> dgl.DGLGraph:
    """int64[U,2] pairs -> graph with edges ``u->v`` and ``v->u`` for each pair (2U edges, int64 ids)."""
    import dgl  # function-level: the KG datasets load without DGL

    src = torch.cat([pairs[:, 0], pairs[:, 1]])
    dst = torch.cat([pairs[:, 1], pairs[:, 0]])
    return dgl.graph((src, dst), num_nodes=num_nodes, idtype=torch.int64)


def kg_graph(train: Tensor, num_entities: int) -> dgl.DGLGraph:
    """int64[T,3] (head, relation, tail) -> graph head->tail with ``edata["etype"]`` int64[T]."""
    import dgl

    g = dgl.graph((train[:, 0], train[:, 2]), num_nodes=num_entities, idtype=torch.int64)
    g.edata["etype"] = train[:, 1].clone()
    return g


def split_counts(n: int, fracs: Sequence[float]) -> Tuple[int, int, int]:
    """Sizes of a 3-way split of ``n`` items; the rounding remainder goes to the first part."""
    if len(fracs) != 3 or any(f < 0 for f in fracs) or abs(sum(fracs) - 1.0) > 1e-6:
        raise ValueError(f"split fractions must be 3 non-negative numbers summing to 1, got {tuple(fracs)}")
    n_valid, n_test = int(round(n * fracs[1])), int(round(n * fracs[2]))
    return n - n_valid - n_test, n_valid, n_test


def random_split(n: int, seed: int, fracs: Sequence[float] = (0.6, 0.2, 0.2),
                 generator: Optional[torch.Generator] = None) -> Tuple[Tensor, Tensor, Tensor]:
    """Deterministic random partition of ``range(n)`` -> three sorted int64 index tensors."""
    gen = generator if generator is not None else torch.Generator().manual_seed(seed)
    n_train, n_valid, _ = split_counts(n, fracs)
    perm = torch.randperm(n, generator=gen)
    parts = perm[:n_train], perm[n_train:n_train + n_valid], perm[n_train + n_valid:]
    return tuple(torch.sort(p).values for p in parts)  # type: ignore[return-value]


def random_row_split(rows: Tensor, seed: int, fracs: Sequence[float],
                     generator: Optional[torch.Generator] = None) -> Tuple[Tensor, Tensor, Tensor]:
    """Split the rows of ``rows`` (e.g. int64[E,2] edges) at random; rows keep their relative order."""
    idx = random_split(rows.shape[0], seed, fracs, generator)
    return tuple(rows[i] for i in idx)  # type: ignore[return-value]
