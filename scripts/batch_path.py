"""The library files one steady-state oac batch runs code in, and the path it takes through them.

Records, on every thread (``sys.setprofile`` and ``threading.setprofile``, set before the loader starts), each
``dgl_oac`` function that runs between asking the loader for batch ``--batch`` and the sparse optimizer's
``step()`` returning: a DGL ``NeighborSampler``, ``SparseAdam``, ``prefetch=4``, ``mode="oac"``. The model's own
files (``dgl_oac/app/models/``) are left out, as a user's model would be. ``tests/test_batch_path.py`` pins the
count (ARCHITECTURE.md draws the path).

    python scripts/batch_path.py            # the files, and each one's functions in first-call order
    python scripts/batch_path.py --json     # {"files": [...], "calls": [[file, function, thread], ...]}
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import threading
from typing import Dict, List, Tuple

os.environ.setdefault("DGLBACKEND", "pytorch")

import dgl  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import dgl_oac  # noqa: E402
from dgl_oac.app.data import generate_synthetic  # noqa: E402
from dgl_oac.app.models import SAGE  # noqa: E402

ROOT = os.path.dirname(dgl_oac.__file__)
LEFT_OUT = (os.path.join(ROOT, "app", "models") + os.sep,)


def measure(batch: int = 8, batches: int = 12) -> Tuple[List[str], List[Tuple[str, str, str]]]:
    """``(files, calls)``: the library files batch ``batch`` ran code in, sorted, and each ``(file, function,
    thread name)`` in first-call order."""
    calls: Dict[Tuple[str, str, str], None] = {}
    recording = threading.Event()

    def profile(frame, event, arg):  # noqa: ANN001 - sys.setprofile's signature
        if event == "call" and recording.is_set():
            path = frame.f_code.co_filename
            if path.startswith(ROOT) and not path.startswith(LEFT_OUT):
                calls.setdefault((os.path.relpath(path, ROOT), frame.f_code.co_name,
                                  threading.current_thread().name), None)

    data = generate_synthetic(num_nodes=3000, seed=0)
    g, labels = data.graph, data.labels
    emb = dgl_oac.NodeEmbedding(g.num_nodes(), 32, "emb", init_func=lambda t: t.normal_(std=0.1))
    model = SAGE(32, 32, data.num_classes)
    sparse_opt = dgl_oac.SparseAdam([emb], lr=0.05)
    dense_opt = torch.optim.Adam(model.parameters(), lr=0.01)
    sys.setprofile(profile)
    threading.setprofile(profile)
    try:
        loader = dgl_oac.DataLoader(g, data.train_idx, dgl.dataloading.NeighborSampler([10, 5]), embeddings=[emb],
                                    mode="oac", prefetch=4, batch_size=64, shuffle=True, seed=0)
        it = iter(loader)
        for i in range(batches):
            if i == batch:
                recording.set()
            _, output_nodes, blocks = next(it)
            loss = F.cross_entropy(model(blocks, blocks[0].srcdata["emb"]), labels[output_nodes])
            dense_opt.zero_grad()
            loss.backward()
            sparse_opt.step()
            recording.clear()
            dense_opt.step()
        loader.close()
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
    files = sorted({f for f, _, _ in calls})
    return files, list(calls)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=8, help="the batch measured (a steady-state one)")
    parser.add_argument("--json", action="store_true", help="print JSON")
    args = parser.parse_args()
    files, calls = measure(args.batch)
    if args.json:
        print(json.dumps({"files": files, "calls": calls}))
        return
    print(f"{len(files)} library files")
    for f in files:
        funcs = list(dict.fromkeys(fn for ff, fn, _ in calls if ff == f))
        threads = sorted({t for ff, _, t in calls if ff == f})
        print(f"  {f}: {', '.join(funcs)}  [{', '.join(threads)}]")


if __name__ == "__main__":
    main()
