"""PyG's ``MetaPath2Vec`` with its table in dgl-oac: PyG's own loop, the import-only port, and ``BatchLoader``.

A PyG model builds its ``torch.nn.Embedding(sparse=True)`` in its constructor and trains it with
``torch.optim.SparseAdam``. The port is two lines::

    tables = dgl_oac.nn.swap_embeddings(model)                     # the model's embedding, now a dgl-oac table
    opt = dgl_oac.nn.SparseAdam(list(tables.values()), lr=0.01)    # was: torch.optim.SparseAdam(...)

and the loop stays PyG's. ``swap_embeddings`` draws no random number, so PyG's sampler draws the same walks
as before. To pipeline the rows, wrap ``model.loader(...)`` in a ``BatchLoader`` whose ids are the walks' nodes;
``generators="global"`` keeps PyG's own stream (the loss draws nothing), so the batches are still PyG's.

The graph is synthetic (nothing to download): authors, papers and venues in ``--fields`` research fields; an
author writes papers mostly in venues of their own field. The printed accuracy classifies authors by field from
their embeddings (nearest class mean, a held-out half).

    python examples/pyg_metapath2vec.py --variant torch      # PyG as it is
    python examples/pyg_metapath2vec.py --variant swap       # the import-only port
    python examples/pyg_metapath2vec.py --variant oac        # BatchLoader, oac (also: sync)
"""
import argparse
import hashlib
import json
import time
from typing import Any, Dict, List, Tuple

import torch

import dgl_oac

VARIANTS = ("torch", "swap", "sync", "oac")
METAPATH = [("author", "writes", "paper"), ("paper", "published_in", "venue"),
            ("venue", "publishes", "paper"), ("paper", "written_by", "author")]


def make_graph(authors: int = 2000, papers: int = 4000, venues: int = 40, fields: int = 4, seed: int = 0
               ) -> Tuple[Dict[Tuple[str, str, str], torch.Tensor], torch.Tensor]:
    """``(edge_index_dict, author_field: int64[authors])``: each paper in one venue; each author writes 3 papers,
    90% of them in venues of their field."""
    gen = torch.Generator().manual_seed(seed)
    venue_field = torch.arange(venues) % fields
    paper_venue = torch.randint(0, venues, (papers,), generator=gen)
    by_field = [torch.nonzero(venue_field[paper_venue] == f).flatten() for f in range(fields)]
    field = torch.randint(0, fields, (authors,), generator=gen)
    src, dst = [], []
    for a in range(authors):
        for _ in range(3):
            f = int(field[a]) if torch.rand((), generator=gen) < 0.9 else int(torch.randint(0, fields, (),
                                                                                           generator=gen))
            pool = by_field[f]
            src.append(a)
            dst.append(int(pool[torch.randint(0, pool.numel(), (), generator=gen)]))
    writes = torch.tensor([src, dst])
    published = torch.stack([torch.arange(papers), paper_venue])
    return {("author", "writes", "paper"): writes, ("paper", "written_by", "author"): writes.flip(0),
            ("paper", "published_in", "venue"): published, ("venue", "publishes", "paper"): published.flip(0)}, field


def accuracy(z: torch.Tensor, y: torch.Tensor) -> float:
    """Nearest class mean on the odd authors, fitted on the even ones."""
    train, test = torch.arange(0, y.numel(), 2), torch.arange(1, y.numel(), 2)
    means = torch.stack([z[train][y[train] == c].mean(0) for c in range(int(y.max()) + 1)])
    pred = torch.cdist(z[test], means).argmin(1)
    return float((pred == y[test]).float().mean())


def train(variant: str, steps: int = 300, dim: int = 64, batch_size: int = 128, prefetch: Any = "auto",
          seed: int = 0, graph: Any = None) -> Dict[str, Any]:
    """``steps`` steps of ``variant``; returns the losses, a digest of the batches, the table and the accuracy."""
    from torch_geometric.nn import MetaPath2Vec  # noqa: PLC0415 - the example's one optional dependency

    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {', '.join(VARIANTS)}, got {variant!r}")
    edge_index_dict, field = graph if graph is not None else make_graph()
    torch.manual_seed(seed)
    model = MetaPath2Vec(edge_index_dict, embedding_dim=dim, metapath=METAPATH, walk_length=10, context_size=5,
                         walks_per_node=2, num_negative_samples=1, sparse=True)
    batches = model.loader(batch_size=batch_size, shuffle=True)
    if variant == "torch":
        opt = torch.optim.SparseAdam(list(model.parameters()), lr=0.01)
    else:
        tables = dgl_oac.nn.swap_embeddings(model)  # the port: this line ...
        opt = dgl_oac.nn.SparseAdam(list(tables.values()), lr=0.01)  # ... and this one
        if variant in ("sync", "oac"):
            walks = lambda b: torch.cat([b[0].reshape(-1), b[1].reshape(-1)])  # noqa: E731 - every node read
            batches = dgl_oac.BatchLoader(batches, ids={tables["embedding"]: walks}, mode=variant,
                                          prefetch=prefetch, generators="global")
    losses: List[float] = []
    times: List[float] = []  # perf_counter() at the end of each step
    digest = hashlib.sha256()
    t0 = time.perf_counter()
    while len(losses) < steps:
        for pos_rw, neg_rw in batches:
            digest.update(pos_rw.numpy().tobytes() + neg_rw.numpy().tobytes())
            opt.zero_grad()
            loss = model.loss(pos_rw, neg_rw)
            loss.backward()
            opt.step()
            losses.append(loss.item())
            times.append(time.perf_counter())
            if len(losses) == steps:
                break
    seconds = time.perf_counter() - t0
    stats: Dict[str, Any] = {}
    if isinstance(batches, dgl_oac.BatchLoader):
        batches.close()
        stats = batches.stats.as_dict()
    with torch.no_grad():
        z = model("author")
        table = model.embedding.weight.detach().clone()
    return {"variant": variant, "steps": steps, "steps_per_s": steps / seconds, "losses": losses, "times": times,
            "stats": stats, "batches_sha256": digest.hexdigest(), "table": table, "accuracy": accuracy(z, field)}


def main(argv: Any = None) -> Dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--variant", choices=VARIANTS, default="oac")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--prefetch", default="auto", help="BatchLoader's prefetch (sync and oac): auto or a depth")
    args = p.parse_args(argv)
    prefetch = args.prefetch if args.prefetch == "auto" else int(args.prefetch)
    out = train(args.variant, args.steps, args.dim, prefetch=prefetch)
    report = {k: v for k, v in out.items() if k not in ("losses", "table", "times", "stats")}
    report["final_loss"] = out["losses"][-1]
    print(json.dumps(report, indent=1))
    return out


if __name__ == "__main__":
    main()
