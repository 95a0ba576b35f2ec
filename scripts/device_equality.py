"""oac == sync, bit for bit, on a device: node (GraphSAGE), link (GraphSAGE + dot scorer) and KG (ComplEx)
tasks, SparseAdam rows, the dense model trained too, under ``torch.use_deterministic_algorithms(True)``.

Each task trains the same batch stream (a function of the seed) in ``sync`` and in ``oac`` at each
``--prefetch`` depth, from the same initial table and model; the final table, optimizer state and model
parameters must be ``torch.equal``. Writes a JSON report; exits 1 if any differs.

    python scripts/device_equality.py --device cuda --out equality.json
    python scripts/device_equality.py --device cpu --nodes 300 --steps 6     # tiny, any machine
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Dict, List

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS, before torch loads CUDA

import dgl  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import dgl_oac  # noqa: E402
from dgl_oac.app.models import SAGE, ComplEx, LinkPredictor, kg_loss, link_bce_loss  # noqa: E402
from dgl_oac.sampling.edge import EdgeBatchSampler  # noqa: E402

TASKS = ("node", "link", "kg")


def graph(nodes: int, seed: int = 0) -> dgl.DGLGraph:
    """A seeded power-law graph (hubs: many rows read by several batches in flight), with 4 relation types."""
    gen = torch.Generator().manual_seed(seed)
    weights = 1.0 / torch.arange(1, nodes + 1, dtype=torch.float64) ** 1.2
    src = torch.arange(nodes).repeat_interleave(4)
    dst = torch.multinomial(weights, nodes * 4, replacement=True, generator=gen)
    g = dgl.graph((torch.cat([src, dst]), torch.cat([dst, src])), num_nodes=nodes)
    g.edata["etype"] = torch.arange(g.num_edges()) % 4
    return g


def train(task: str, mode: str, prefetch: int, device: str, nodes: int, dim: int, steps: int) -> Dict[str, Any]:
    """One run; returns its final table, optimizer state and dense parameters (CPU tensors)."""
    g = graph(nodes)
    torch.manual_seed(0)
    emb = dgl_oac.NodeEmbedding(nodes, dim, f"eq-{task}", init_func=lambda t: t.uniform_(-0.5, 0.5))
    opt = dgl_oac.optim.SparseAdam([emb], lr=0.05)
    if task == "node":
        model: torch.nn.Module = SAGE(dim, 32, 8)
        sampler, indices = dgl.dataloading.NeighborSampler([5, 5]), torch.arange(nodes)
    elif task == "link":
        model = LinkPredictor(SAGE(dim, 32, 32))
        sampler = dgl.dataloading.as_edge_prediction_sampler(
            dgl.dataloading.NeighborSampler([5, 5]), negative_sampler=dgl.dataloading.negative_sampler.Uniform(2))
        indices = torch.arange(g.num_edges())
    else:
        model = ComplEx(4, dim)
        sampler, indices = EdgeBatchSampler(num_negatives=8), torch.arange(g.num_edges())
    model = model.to(device)
    dense = torch.optim.Adam(model.parameters(), lr=0.01)
    loader = dgl_oac.DataLoader(g, indices, sampler, embeddings=[emb], batch_size=64, shuffle=True, seed=3,
                                mode=mode, prefetch=prefetch, device=device)
    done = 0
    while done < steps:
        for batch in loader:
            if task == "node":
                _, seeds, blocks = batch
                loss = F.cross_entropy(model(blocks, blocks[0].srcdata[emb.name]), (seeds % 8).to(device))
            elif task == "link":
                _, pair, neg, blocks = batch
                loss = link_bce_loss(*model(pair, neg, blocks, blocks[0].srcdata[emb.name]))
            else:
                _, pair, neg, _ = batch
                x = pair.ndata[emb.name]
                src, dst = (t.long() for t in pair.edges())
                rel = pair.edata["etype"]
                pos = model.score(x[src], rel, x[dst])
                negs = [model.score_neg(x[src], rel, x[c], mode) for mode, c in sampler.unpack(pair, neg)]
                loss = kg_loss(pos, torch.cat(negs, 1))
            dense.zero_grad()
            loss.backward()
            dense.step()
            opt.step()
            done += 1
            if done == steps:
                break
    loader.close()
    out = {"table": emb.weight.clone(), "state": emb.optm_state.clone(),
           "dense": [p.detach().cpu().clone() for p in model.parameters()], "stats": loader.stats}
    emb.close()
    return out


def check(task: str, device: str, depths: List[int], nodes: int, dim: int, steps: int) -> Dict[str, Any]:
    ref = train(task, "sync", 1, device, nodes, dim, steps)
    report: Dict[str, Any] = {}
    for k in depths:
        got = train(task, "oac", k, device, nodes, dim, steps)
        report[f"oac@{k}"] = {
            "table_equal": torch.equal(ref["table"], got["table"]),
            "state_equal": torch.equal(ref["state"], got["state"]),
            "dense_equal": all(torch.equal(a, b) for a, b in zip(ref["dense"], got["dense"])),
            "table_max_abs_diff": float((ref["table"] - got["table"]).abs().max()),
            "rows_patched": got["stats"].rows_patched, "rows_read": got["stats"].rows_read,
        }
    return report


def main(argv: List[str] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--tasks", default=",".join(TASKS))
    p.add_argument("--prefetch", default="1,4")
    p.add_argument("--nodes", type=int, default=20_000)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--out", default=None, help="JSON report (stdout without)")
    args = p.parse_args(argv)
    torch.use_deterministic_algorithms(True)
    depths = [int(x) for x in args.prefetch.split(",")]
    report = {"device": args.device, "steps": args.steps, "nodes": args.nodes, "dim": args.dim,
              "tasks": {t: check(t, args.device, depths, args.nodes, args.dim, args.steps)
                        for t in args.tasks.split(",")}}
    ok = all(r["table_equal"] and r["state_equal"] and r["dense_equal"]
             for t in report["tasks"].values() for r in t.values())
    report["all_equal"] = ok
    text = json.dumps(report, indent=2)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    print(text)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
