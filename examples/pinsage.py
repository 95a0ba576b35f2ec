"""PinSAGE with item embeddings in CPU memory: torch's sparse embeddings, or dgl-oac's drop-in.

The recipe of DGL's PinSAGE ``model_sparse.py`` (written here from scratch): an infinite ``IterableDataset`` of
(head, tail, negative) item triples, where a tail is an item one item -> user -> item walk away; a
``collate_fn`` that samples each layer's neighbours by random walks (an item's neighbours are the items its
walks visit most, weighted by the visit counts); a weighted-SAGE model over learnable item embeddings
(``nn.Embedding(sparse=True)`` + ``SparseAdam``), and a margin loss. The user-item graph is Coauthor-Physics'
author x keyword matrix with authors as items (MovieLens is not available offline).

One switch picks the backend, and the import is the whole difference::

    from torch.nn import Embedding; from torch.optim import SparseAdam      # --backend torch
    from dgl_oac.nn import Embedding, SparseAdam                            # --backend dgl_oac

``dgl_oac.BatchLoader`` wraps the batch source for both: with torch's ``Embedding`` it only pulls the source
(inside generator states of its own, so the stream is the same for either backend); with dgl-oac's it also
gathers each batch's item rows ahead, validates them (``--mode oac``) and serves ``item_emb(ids)`` from them.

    python examples/pinsage.py --backend dgl_oac --mode oac --batches 200
"""
import argparse
import hashlib
import json
import time
from pathlib import Path
from typing import List, NamedTuple

import numpy as np
import scipy.sparse as sp
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, IterableDataset

import dgl_oac
from dgl_oac.app.data import data_root

# the shared data root (<repo>/../shared/data, or $DGL_OAC_DATA), as every dataset of dgl-oac finds it
DATA = data_root() / "coauthor-physics" / "coauthor_phy.npz"


def load_bipartite(path: Path):
    """Items (authors) x users (keywords) as two CSR adjacencies ``(indptr, indices)``: item -> user, user -> item."""
    with np.load(path, allow_pickle=True) as z:
        m = sp.csr_matrix(z["node_attr"].item())
    m.data[:] = 1
    t = m.T.tocsr()

    def csr(a):
        return torch.from_numpy(a.indptr.astype(np.int64)), torch.from_numpy(a.indices.astype(np.int64))
    return csr(m), csr(t)


def walk(csr, nodes: torch.Tensor) -> torch.Tensor:
    """One uniform random step from each of ``nodes: int64[n]`` (-1 where a node has no neighbour, or is -1)."""
    indptr, indices = csr
    ok = nodes >= 0
    safe = nodes.clamp(min=0)
    start, deg = indptr[safe], indptr[safe + 1] - indptr[safe]
    pick = (torch.rand(nodes.numel()) * deg).long()
    out = indices[(start + pick).clamp(max=indices.numel() - 1)]
    return torch.where(ok & (deg > 0), out, torch.full_like(out, -1))


class ItemTriples(IterableDataset):
    """Infinite (heads, tails, negatives): random items, an item two hops away, random items (global RNG)."""

    def __init__(self, item_user, user_item, num_items: int, batch_size: int) -> None:
        self.item_user, self.user_item, self.n, self.b = item_user, user_item, num_items, batch_size

    def __iter__(self):
        while True:
            heads = torch.randint(0, self.n, (self.b,))
            tails = walk(self.user_item, walk(self.item_user, heads))
            negs = torch.randint(0, self.n, (self.b,))
            keep = tails >= 0
            yield heads[keep], tails[keep], negs[keep]


class Block(NamedTuple):
    """One layer: ``src: int64[s]`` item ids (the first ``num_dst`` are the layer's outputs), edges as local
    positions ``esrc -> edst`` with walk-count ``weight: float32[e]``."""
    src: torch.Tensor
    num_dst: int
    esrc: torch.Tensor
    edst: torch.Tensor
    weight: torch.Tensor


class Batch(NamedTuple):
    blocks: List[Block]
    heads: torch.Tensor  # positions among the last block's outputs
    tails: torch.Tensor
    negs: torch.Tensor


class WalkNeighbours:
    """Each item's neighbours: the ``k`` items most visited by ``traces`` walks of ``length`` item -> user ->
    item hops (restarting with probability ``restart``), ties broken by item id; weights are the counts."""

    def __init__(self, item_user, user_item, num_items, traces=10, length=2, restart=0.5, k=3, layers=2):
        self.iu, self.ui, self.n = item_user, user_item, num_items
        self.traces, self.length, self.restart, self.k, self.layers = traces, length, restart, k, layers

    def neighbours(self, seeds: torch.Tensor):
        start = seeds.repeat_interleave(self.traces)
        cur, owner, seen = start, torch.arange(seeds.numel()).repeat_interleave(self.traces), []
        for _ in range(self.length):
            cur = walk(self.ui, walk(self.iu, cur))
            seen.append(cur)
            cur = torch.where(torch.rand(cur.numel()) < self.restart, start, cur)
        visited, who = torch.cat(seen), owner.repeat(self.length)
        keep = (visited >= 0) & (visited != seeds[who])
        key, counts = torch.unique(who[keep] * self.n + visited[keep], return_counts=True)  # sorted by (seed, item)
        who, item = key // self.n, key % self.n
        order = torch.argsort(-counts, stable=True)  # by count, then (seed, item) as unique sorted them
        order = order[torch.argsort(who[order], stable=True)]
        who, item, counts = who[order], item[order], counts[order]
        first = torch.searchsorted(who, who, right=False)
        top = (torch.arange(who.numel()) - first) < self.k
        return who[top], item[top], counts[top].float()

    def blocks(self, seeds: torch.Tensor) -> List[Block]:
        out = []
        for _ in range(self.layers):
            dst_pos, nbr, weight = self.neighbours(seeds)
            extra = torch.unique(nbr)
            extra = extra[~torch.isin(extra, seeds)]
            src = torch.cat([seeds, extra])
            order = torch.argsort(src)
            esrc = order[torch.searchsorted(src[order], nbr)]
            out.insert(0, Block(src, seeds.numel(), esrc, dst_pos, weight))
            seeds = src
        return out

    def collate(self, items) -> Batch:
        heads, tails, negs = items[0]
        seeds = torch.unique(torch.cat([heads, tails, negs]))
        blocks = self.blocks(seeds)
        return Batch(blocks, *(torch.searchsorted(seeds, x) for x in (heads, tails, negs)))


class WeightedSAGE(nn.Module):
    """``z = normalize(relu(W [sum_w relu(Q h_src) / sum_w, h_dst]))`` over one block."""

    def __init__(self, dim: int, dropout: float) -> None:
        super().__init__()
        self.q, self.w, self.dropout = nn.Linear(dim, dim), nn.Linear(2 * dim, dim), nn.Dropout(dropout)

    def forward(self, block: Block, h: torch.Tensor) -> torch.Tensor:
        n = F.relu(self.q(self.dropout(h)))
        msg = n.index_select(0, block.esrc) * block.weight[:, None]
        agg = torch.zeros(block.num_dst, h.shape[1]).index_add_(0, block.edst, msg)
        ws = torch.zeros(block.num_dst).index_add_(0, block.edst, block.weight).clamp(min=1)
        z = F.relu(self.w(self.dropout(torch.cat([agg / ws[:, None], h[: block.num_dst]], 1))))
        return z / z.norm(dim=1, keepdim=True).clamp(min=1e-12)


class PinSAGE(nn.Module):
    def __init__(self, num_items: int, dim: int, layers: int, dropout: float) -> None:
        super().__init__()
        self.convs = nn.ModuleList(WeightedSAGE(dim, dropout) for _ in range(layers))
        self.bias = nn.Parameter(torch.zeros(num_items))

    def forward(self, batch: Batch, item_emb: nn.Module) -> torch.Tensor:
        blocks = batch.blocks
        h = item_emb(blocks[0].src)                            # every input item's row
        out = blocks[-1].src[: blocks[-1].num_dst]
        for conv, block in zip(self.convs, blocks):
            h = conv(block, h)
        h = h + item_emb(out)                                  # the output items' rows again (a second read)
        bias = self.bias.index_select(0, out)

        def score(a, b):
            # index_select, not h[a]: the backward of advanced indexing adds rows on several threads in a varying
            # order on CPU (two runs differ in the last bit under load); index_select's backward does not
            rows = h.index_select(0, a) * h.index_select(0, b)
            return rows.sum(1) + bias.index_select(0, a) + bias.index_select(0, b)
        return (score(batch.heads, batch.negs) - score(batch.heads, batch.tails) + 1).clamp(min=0).mean()


def weight_of(emb: nn.Module) -> torch.Tensor:
    """The item table ``float32[N, D]``, CPU, either backend."""
    inner = getattr(emb, "node_embedding", None)
    return (inner.weight if inner is not None else emb.weight).detach().clone()


def train(backend: str = "dgl_oac", mode: str = "oac", batches: int = 30, batch_size: int = 64, dim: int = 16,
          layers: int = 2, lr: float = 0.01, prefetch="auto", seed: int = 0, data: Path = DATA) -> dict:
    """Train for ``batches`` steps; returns the losses, each step's end time, the final table, the loader's
    stats and the loop's seconds."""
    if backend == "torch":
        from torch.nn import Embedding
        from torch.optim import SparseAdam
    elif backend == "dgl_oac":
        from dgl_oac.nn import Embedding, SparseAdam
    else:
        raise ValueError(f"backend must be 'torch' or 'dgl_oac', got {backend!r}")
    if batches < 1:
        raise ValueError(f"batches must be >= 1 (the batch source is endless), got {batches}")
    torch.manual_seed(seed)
    item_user, user_item = load_bipartite(data)
    num_items = item_user[0].numel() - 1
    sampler = WalkNeighbours(item_user, user_item, num_items, layers=layers)
    source = DataLoader(ItemTriples(item_user, user_item, num_items, batch_size), collate_fn=sampler.collate)
    item_emb = Embedding(num_items, dim, sparse=True)
    model = PinSAGE(num_items, dim, layers, dropout=0.5)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    opt_emb = SparseAdam(item_emb.parameters(), lr=lr)
    loader = dgl_oac.BatchLoader(source, ids={item_emb: lambda b: b.blocks[0].src}, mode=mode, prefetch=prefetch,
                                 seed=seed)
    losses, t0, times = [], time.perf_counter(), []
    for step, batch in enumerate(loader):
        loss = model(batch, item_emb)
        opt.zero_grad()
        opt_emb.zero_grad()
        loss.backward()
        opt.step()
        opt_emb.step()
        losses.append(loss.item())
        times.append(time.perf_counter())
        if step + 1 == batches:
            break
    loader.close()
    seconds = time.perf_counter() - t0
    # times: after each step (a benchmark's steady state leaves out the first ones)
    return {"losses": losses, "times": times, "table": weight_of(item_emb), "stats": loader.stats, "seconds": seconds}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", choices=["torch", "dgl_oac"], default="dgl_oac")
    p.add_argument("--mode", choices=list(dgl_oac.MODES), default="oac")
    p.add_argument("--batches", type=int, default=30)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    out = train(a.backend, a.mode, a.batches, a.batch_size, a.dim, seed=a.seed)
    digest = hashlib.sha256(out["table"].numpy().tobytes()).hexdigest()[:16]
    print(json.dumps({"backend": a.backend, "mode": a.mode, "first_loss": round(out["losses"][0], 5),
                      "last_loss": round(out["losses"][-1], 5), "seconds": round(out["seconds"], 3),
                      "table_sha256": digest, "stats": out["stats"].as_dict()}))


if __name__ == "__main__":
    main()
