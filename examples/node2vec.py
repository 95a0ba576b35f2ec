"""node2vec (DeepWalk's walk, p = q = 1) with a skip-gram loss: torch's sparse embeddings, or dgl-oac's drop-in.

The recipe of DGL's node2vec example (written here from scratch): random walks from every node, cut into
context windows; each window's first node is pulled towards the rest of its window and pushed away from
random nodes (negative sampling), ``-log sigmoid(u.v) - log sigmoid(-u.n)``. The batch is a pair of id tensors:
no graph travels with it. The walks run over Coauthor-Physics' co-author graph.

One switch picks the backend, and the import is the whole difference::

    from torch.nn import Embedding; from torch.optim import SparseAdam      # --backend torch
    from dgl_oac.nn import Embedding, SparseAdam                            # --backend dgl_oac

``dgl_oac.BatchLoader`` wraps the batch source (a generator) for both: with torch's ``Embedding`` it only pulls
the source (inside generator states of its own, so both backends see one stream); with dgl-oac's it gathers
each batch's rows ahead, validates them (``--mode oac``) and serves ``emb(ids)`` from them.

    python examples/node2vec.py --backend dgl_oac --mode oac --batches 200
"""
import argparse
import hashlib
import json
import time
from pathlib import Path
from typing import Iterator, Tuple

import numpy as np
import scipy.sparse as sp
import torch
import torch.nn.functional as F

import dgl_oac
from dgl_oac.app.data import data_root

# the shared data root (<repo>/../shared/data, or $DGL_OAC_DATA), as every dataset of dgl-oac finds it
DATA = data_root() / "coauthor-physics" / "coauthor_phy.npz"


def load_graph(path: Path) -> Tuple[torch.Tensor, torch.Tensor]:
    """The co-author graph as CSR ``(indptr: int64[N+1], indices: int64[E])``, both directions of each edge."""
    with np.load(path, allow_pickle=True) as z:
        a = sp.csr_matrix(z["adj_matrix"].item())
    a = ((a + a.T) > 0).tocsr()
    return torch.from_numpy(a.indptr.astype(np.int64)), torch.from_numpy(a.indices.astype(np.int64))


def random_walks(csr, starts: torch.Tensor, length: int) -> torch.Tensor:
    """``int64[n, length]`` uniform walks from ``starts``; a node without neighbours stays where it is."""
    indptr, indices = csr
    cur, out = starts, [starts]
    for _ in range(length - 1):
        deg = indptr[cur + 1] - indptr[cur]
        nxt = indices[(indptr[cur] + (torch.rand(cur.numel()) * deg).long()).clamp(max=indices.numel() - 1)]
        cur = torch.where(deg > 0, nxt, cur)
        out.append(cur)
    return torch.stack(out, 1)


def skipgram_batches(csr, batch_size: int, length: int, window: int, negatives: int
                     ) -> Iterator[Tuple[torch.Tensor, torch.Tensor]]:
    """Endless ``(pos: int64[w, window], neg: int64[w * negatives, window])`` windows of walks from a shuffled
    pass over the nodes, and random windows as negatives (global RNG, as a torch ``IterableDataset`` would)."""
    n = csr[0].numel() - 1
    while True:
        for starts in torch.randperm(n).split(batch_size):
            walks = random_walks(csr, starts, length)
            pos = walks.unfold(1, window, 1).reshape(-1, window)
            neg = torch.randint(0, n, (pos.shape[0] * negatives, window))
            neg[:, 0] = pos[:, 0].repeat_interleave(negatives)  # each negative window starts at a positive's centre
            yield pos, neg


def skipgram_loss(emb: torch.nn.Module, pos: torch.Tensor, neg: torch.Tensor) -> torch.Tensor:
    """``-log sigmoid(u . v)`` over each window's first node and the rest, ``-log sigmoid(-u . n)`` for the
    negatives; ids of any shape go straight into ``emb`` (as ``nn.Embedding`` takes them)."""
    def score(w):
        return (emb(w[:, :1]) * emb(w[:, 1:])).sum(-1)
    return -(F.logsigmoid(score(pos)).mean() + F.logsigmoid(-score(neg)).mean())


def weight_of(emb: torch.nn.Module) -> torch.Tensor:
    """The table ``float32[N, D]``, CPU, either backend."""
    inner = getattr(emb, "node_embedding", None)
    return (inner.weight if inner is not None else emb.weight).detach().clone()


def train(backend: str = "dgl_oac", mode: str = "oac", batches: int = 30, batch_size: int = 32, dim: int = 32,
          length: int = 20, window: int = 5, negatives: int = 1, lr: float = 0.01, prefetch="auto",
          seed: int = 0, data: Path = DATA) -> dict:
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
    csr = load_graph(data)
    emb = Embedding(csr[0].numel() - 1, dim, sparse=True)
    opt = SparseAdam(emb.parameters(), lr=lr)
    source = skipgram_batches(csr, batch_size, length, window, negatives)
    loader = dgl_oac.BatchLoader(source, ids={emb: lambda b: torch.cat([b[0].reshape(-1), b[1].reshape(-1)])},
                                 mode=mode, prefetch=prefetch, seed=seed)
    losses, t0, times = [], time.perf_counter(), []
    for step, (pos, neg) in enumerate(loader):
        loss = skipgram_loss(emb, pos, neg)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        times.append(time.perf_counter())
        if step + 1 == batches:
            break
    loader.close()
    seconds = time.perf_counter() - t0
    # times: after each step (a benchmark's steady state leaves out the first ones)
    return {"losses": losses, "times": times, "table": weight_of(emb), "stats": loader.stats, "seconds": seconds}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", choices=["torch", "dgl_oac"], default="dgl_oac")
    p.add_argument("--mode", choices=list(dgl_oac.MODES), default="oac")
    p.add_argument("--batches", type=int, default=30)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--dim", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    out = train(a.backend, a.mode, a.batches, a.batch_size, a.dim, seed=a.seed)
    digest = hashlib.sha256(out["table"].numpy().tobytes()).hexdigest()[:16]
    print(json.dumps({"backend": a.backend, "mode": a.mode, "first_loss": round(out["losses"][0], 5),
                      "last_loss": round(out["losses"][-1], 5), "seconds": round(out["seconds"], 3),
                      "table_sha256": digest, "stats": out["stats"].as_dict()}))


if __name__ == "__main__":
    main()
