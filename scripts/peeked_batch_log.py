"""The write log's size over an epoch when the caller keeps a batch peeked before the loop (issue 22, hole 3).

    python scripts/peeked_batch_log.py            # peek, then one epoch of 121 steps, sync then oac
    python scripts/peeked_batch_log.py --no-peek  # the same without the peek

``first = next(iter(loader))`` is kept alive through a normal epoch (16-dim rows, Adagrad, oac@4, normal
background priority, 1930-node power-law graph, 2-hop sampling, batch 16). After each step it records the log's
entries and bytes (ring + ``last_slot``). Prints one JSON line: steps, entries (first, max, last), MiB (first,
max), and whether oac's table and optimizer state equal sync's bitwise.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from conftest import power_law_graph, seeded_init  # noqa: E402
from helpers import loss_of, node_loader, snapshot  # noqa: E402

import dgl_oac  # noqa: E402


def run(mode: str, peek: bool):
    graph = power_law_graph(1930, seed=1)
    emb = dgl_oac.NodeEmbedding(graph.num_nodes(), 16, f"peek_{mode}", seeded_init(0))
    opt = dgl_oac.SparseAdagrad([emb], lr=0.05)
    loader = node_loader(graph, emb, mode)
    first = next(iter(loader)) if peek else None  # noqa: F841 - kept alive on purpose
    sizes = []
    for batch in loader:
        loss_of(batch[-1][0].srcdata[emb.name]).backward()
        opt.step()
        if emb.pipeline.log is not None:
            sizes.append((len(emb.pipeline.log.entries), emb.pipeline.log.nbytes() / 2**20))
    snap = snapshot(emb)
    emb.close()
    return snap, sizes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--no-peek", action="store_true")
    peek = not ap.parse_args().no_peek
    (v0, s0), _ = run("sync", peek)
    (v1, s1), sizes = run("oac", peek)
    n = [e for e, _ in sizes]
    mib = [m for _, m in sizes]
    print(json.dumps({"peek": peek, "steps": len(sizes), "log_entries_first_max_last": [n[0], max(n), n[-1]],
                      "log_mib_first_max": [round(mib[0], 2), round(max(mib), 2)],
                      "oac_equals_sync": bool(torch.equal(v0, v1) and torch.equal(s0, s1))}))


if __name__ == "__main__":
    main()
