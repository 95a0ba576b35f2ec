"""oac == sync, bit for bit, on a device: node (GraphSAGE), link (GraphSAGE + dot scorer) and KG (ComplEx at an
even dim, TransE at an odd one) tasks, with each row optimizer (SGD, Adagrad, RowWiseAdagrad, Adam) at dims 257
and 128, the dense model trained too.

The built-in models are deterministic by construction (their gathers' backward has no atomics:
``dgl_oac.dgl_frontend.blocks.gather_rows``), so this runs WITHOUT ``torch.use_deterministic_algorithms(True)``;
``--deterministic`` turns it on (and ``CUBLAS_WORKSPACE_CONFIG=:4096:8``), and the report says which ran.

Each case (task, optimizer, dim) trains the same batch stream (a function of the seed) in ``sync`` and in ``oac`` at
each ``--prefetch`` depth, from the same initial table and model; the final table, optimizer state and model
parameters must be ``torch.equal``. The JSON report is rewritten after every finished case (a killed run keeps
the cases it finished); a case that fails is recorded with its error and the next one runs. Exits 1 unless every
case ran and was equal.

    python scripts/device_equality.py --device cuda --out equality.json
    python scripts/device_equality.py --device cpu --nodes 300 --steps 6     # tiny, any machine
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Dict, List, Optional

import dgl
import torch
import torch.nn.functional as F

import dgl_oac
from dgl_oac.app.models import SAGE, ComplEx, LinkPredictor, TransE, kg_loss, link_bce_loss
from dgl_oac.dgl_frontend.blocks import gather_rows
from dgl_oac.dgl_frontend.sampling.edge import EdgeBatchSampler

TASKS = ("node", "link", "kg")
#: the most telling first: a run cut short has the row-reducing optimizer and the misaligned width
OPTIMIZERS = {"rowwise_adagrad": dgl_oac.optim.SparseRowWiseAdagrad, "adam": dgl_oac.optim.SparseAdam,
              "adagrad": dgl_oac.optim.SparseAdagrad, "sgd": dgl_oac.optim.SparseSGD}
DIMS = (257, 128)


def graph(nodes: int, seed: int = 0) -> dgl.DGLGraph:
    """A seeded power-law graph (hubs: many rows read by several batches in flight), with 4 relation types."""
    gen = torch.Generator().manual_seed(seed)
    weights = 1.0 / torch.arange(1, nodes + 1, dtype=torch.float64) ** 1.2
    src = torch.arange(nodes).repeat_interleave(4)
    dst = torch.multinomial(weights, nodes * 4, replacement=True, generator=gen)
    g = dgl.graph((torch.cat([src, dst]), torch.cat([dst, src])), num_nodes=nodes)
    g.edata["etype"] = torch.arange(g.num_edges()) % 4
    return g


def kg_model(dim: int) -> str:
    """The KG scorer of a case: ComplEx needs an even dim (real | imaginary halves)."""
    return "complex" if dim % 2 == 0 else "transe"


def train(task: str, optimizer: str, mode: str, prefetch: int, device: str, nodes: int, dim: int,
          steps: int, structure: str = "auto") -> Dict[str, Any]:
    """One run; returns its final table, optimizer state and dense parameters (CPU tensors)."""
    g = graph(nodes)
    torch.manual_seed(0)
    emb = dgl_oac.NodeEmbedding(nodes, dim, f"eq-{task}", init_func=lambda t: t.uniform_(-0.5, 0.5))
    opt = OPTIMIZERS[optimizer]([emb], lr=0.05)
    if task == "node":
        model: torch.nn.Module = SAGE(dim, 32, 8)
        sampler, indices = dgl.dataloading.NeighborSampler([5, 5]), torch.arange(nodes)
    elif task == "link":
        model = LinkPredictor(SAGE(dim, 32, 32))
        sampler = dgl.dataloading.as_edge_prediction_sampler(
            dgl.dataloading.NeighborSampler([5, 5]), negative_sampler=dgl.dataloading.negative_sampler.Uniform(2))
        indices = torch.arange(g.num_edges())
    else:
        model = ComplEx(4, dim) if kg_model(dim) == "complex" else TransE(4, dim)
        sampler, indices = EdgeBatchSampler(num_negatives=8), torch.arange(g.num_edges())
    model = model.to(device)
    dense = torch.optim.Adam(model.parameters(), lr=0.01)
    # normal priority: gathers run as soon as queued, ahead of the steps in flight (real staleness to patch)
    loader = dgl_oac.DataLoader(g, indices, sampler, embeddings=[emb], batch_size=64, shuffle=True, seed=3,
                                mode=mode, prefetch=prefetch, device=device, background_priority="normal",
                                structure=structure)
    done = 0
    while done < steps:
        for batch in loader:
            if task == "node":
                _, seeds, blocks = batch
                loss = F.cross_entropy(model(blocks, blocks[0].srcdata[emb.name]), (seeds % 8).to(device))
            elif task == "link":
                _, pair, neg, blocks = batch
                loss = link_bce_loss(*model(pair, neg, blocks, blocks[0].srcdata[emb.name]))
            else:  # as dgl_oac.app.tasks.kg.KGTask.step gathers a batch's entities
                _, pair, neg, _ = batch
                x = pair.ndata[emb.name]
                src, dst = (t.long() for t in pair.edges())
                rel = pair.edata["etype"]
                h, t = gather_rows(x, src), gather_rows(x, dst)
                negs = [model.score_neg(h if mode == "tail" else t, rel, gather_rows(x, c.long()), mode)
                        for mode, c in sampler.unpack(pair, neg)]
                loss = kg_loss(model.score(h, rel, t), torch.cat(negs, 1))
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


def check(task: str, optimizer: str, dim: int, device: str, depths: List[int], nodes: int, steps: int,
          structure: str = "auto") -> Dict[str, Any]:
    """One case: sync, then oac at each depth, compared."""
    ref = train(task, optimizer, "sync", 1, device, nodes, dim, steps, structure)
    runs: Dict[str, Any] = {}
    for k in depths:
        got = train(task, optimizer, "oac", k, device, nodes, dim, steps, structure)
        runs[f"oac@{k}"] = {
            "table_equal": torch.equal(ref["table"], got["table"]),
            "state_equal": torch.equal(ref["state"], got["state"]),
            "dense_equal": all(torch.equal(a, b) for a, b in zip(ref["dense"], got["dense"])),
            "table_max_abs_diff": float((ref["table"] - got["table"]).abs().max()),
            "rows_patched": got["stats"].rows_patched, "rows_read": got["stats"].rows_read,
        }
    return runs


def _write(report: Dict[str, Any], out: Optional[str]) -> None:
    """The report so far, replacing the file whole (written beside it, then renamed: never half a file)."""
    if out:
        tmp = Path(f"{out}.tmp")
        tmp.write_text(json.dumps(report, indent=2) + "\n")
        os.replace(tmp, out)


def _names(text: str, known: Any, what: str) -> List[str]:
    names = [x.strip() for x in text.split(",") if x.strip()]
    unknown = [x for x in names if x not in known]
    if unknown or not names:
        raise SystemExit(f"--{what}: unknown {unknown or 'none given'}; expected some of {', '.join(known)}")
    return names


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--tasks", default=",".join(TASKS))
    p.add_argument("--optimizers", default=",".join(OPTIMIZERS), help="row optimizers, comma-separated")
    p.add_argument("--dims", default=",".join(map(str, DIMS)), help="embedding dims, comma-separated")
    p.add_argument("--dim", type=int, default=None, help="one dim (overrides --dims)")
    p.add_argument("--prefetch", default="1,4")
    p.add_argument("--nodes", type=int, default=20_000)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--structure", default="auto", choices=("auto", "index", "dgl"),
                   help="the batches' graphs: DataLoader's structure ('index': the built-in models' index blocks, "
                        "what a device without DGL's CUDA build gets, also on the CPU)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch's CPU threads (default: 1 on the CPU, where OpenMP teams stall on a shared machine; "
                        "torch's own elsewhere)")
    p.add_argument("--deterministic", action="store_true",
                   help="torch.use_deterministic_algorithms(True) and CUBLAS_WORKSPACE_CONFIG=:4096:8 (a user "
                        "model with atomics needs them; the built-in ones do not)")
    p.add_argument("--out", default=None, help="JSON report, rewritten after each case (stdout at the end)")
    args = p.parse_args(argv)
    tasks = _names(args.tasks, TASKS, "tasks")
    optimizers = _names(args.optimizers, OPTIMIZERS, "optimizers")
    dims = [args.dim] if args.dim is not None else [int(x) for x in args.dims.split(",") if x.strip()]
    depths = [int(x) for x in args.prefetch.split(",")]
    threads = args.threads if args.threads is not None else (1 if args.device == "cpu" else None)
    if threads is not None:
        torch.set_num_threads(threads)
    if args.deterministic:
        # read when cuBLAS first makes its workspace: before this script's first matmul is soon enough
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
    cases = [(t, o, d) for d in dims for o in optimizers for t in tasks]
    report: Dict[str, Any] = {
        "device": args.device, "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
        "cublas_workspace_config": os.environ.get("CUBLAS_WORKSPACE_CONFIG"), "steps": args.steps,
        "nodes": args.nodes, "prefetch": depths, "structure": args.structure, "threads": torch.get_num_threads(),
        "planned": len(cases),
        "cases": [], "all_equal": False}
    _write(report, args.out)
    for task, optimizer, dim in cases:
        case: Dict[str, Any] = {"task": task, "optimizer": optimizer, "dim": dim}
        if task == "kg":
            case["kg_model"] = kg_model(dim)
        t0 = time.perf_counter()
        try:
            case["runs"] = check(task, optimizer, dim, args.device, depths, args.nodes, args.steps, args.structure)
            case["equal"] = all(r["table_equal"] and r["state_equal"] and r["dense_equal"]
                                for r in case["runs"].values())
        except Exception as e:  # noqa: BLE001 - recorded, and the next case runs
            case.update(equal=False, error=f"{type(e).__name__}: {e}", traceback=traceback.format_exc(limit=6))
        case["seconds"] = round(time.perf_counter() - t0, 2)
        report["cases"].append(case)
        report["all_equal"] = len(report["cases"]) == len(cases) and all(c["equal"] for c in report["cases"])
        _write(report, args.out)
        print(f"{task:5s} {optimizer:16s} dim {dim:4d}: {'equal' if case['equal'] else 'DIFFERENT'}"
              f"{' (' + case['error'] + ')' if 'error' in case else ''} [{case['seconds']} s]", flush=True)
    print(json.dumps(report, indent=2))
    return 0 if report["all_equal"] else 1


if __name__ == "__main__":
    sys.exit(main())
