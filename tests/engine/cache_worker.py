"""A training run on a file-backed table with a row cache smaller than a batch, for
tests/engine/test_row_cache.py's kill-and-resume test (not a test module).

    python tests/engine/cache_worker.py FOLDER MODE STEPS [--resume] [--cache BYTES]

Trains STEPS steps of a skip-gram-like loop (BatchLoader, SparseAdagrad) on a table in FOLDER/table-<pid>.bin,
saves FOLDER/ckpt after every 4 steps, writes the final rows (values ‖ state) to FOLDER/final.pt. With --resume,
continues from FOLDER/ckpt.
"""
from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader as TorchLoader

import dgl_oac
from dgl_oac.checkpoint import load_checkpoint, save_checkpoint

N, D, PAIRS, BATCH = 400, 8, 4000, 32


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("folder")
    p.add_argument("mode")
    p.add_argument("steps", type=int)
    p.add_argument("--resume", action="store_true")
    p.add_argument("--cache", type=int, default=20 * (4 * 2 * D + 19) + 9 * N)  # 20 rows: a batch has ~60
    args = p.parse_args()
    folder = Path(args.folder)
    torch.manual_seed(0)
    pairs = torch.randint(0, N, (PAIRS, 2), generator=torch.Generator().manual_seed(3))
    source = TorchLoader(pairs, batch_size=BATCH, shuffle=True)
    storage = "memory" if args.cache < 0 else folder / f"table-{os.getpid()}.bin"
    emb = dgl_oac.NodeEmbedding(N, D, "t", lambda t: torch.nn.init.uniform_(t, -0.1, 0.1), storage=storage,
                                cache=max(args.cache, 0))
    opt = dgl_oac.SparseAdagrad([emb], lr=0.05)
    loader = dgl_oac.BatchLoader(source, ids={emb: lambda b: b}, mode=args.mode, prefetch=3, seed=11)
    step = 0
    if args.resume:
        step = load_checkpoint(folder / "ckpt", [emb], opt, loader=loader)["step"]
    while step < args.steps:
        for batch in loader:
            x = emb(batch.reshape(-1)).reshape(*batch.shape, D)
            (-F.logsigmoid((x[:, 0] * x[:, 1]).sum(-1)).mean()).backward()
            opt.step()
            step += 1
            if step % 4 == 0:
                save_checkpoint(folder / "ckpt", [emb], opt, loader=loader, extra={"step": step})
                print(f"saved {step}", flush=True)
            if step == args.steps:
                break
    loader.close()
    torch.save(torch.cat([emb.weight, emb.optm_state], 1).clone(), folder / "final.pt")
    emb.close()


if __name__ == "__main__":
    main()
