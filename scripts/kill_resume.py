"""Crash-resume check: SIGKILL ``dgl-oac train`` mid-training, resume it with ``--resume``, and compare the
final table (values and optimizer state) and dense model with an uninterrupted run's, bit for bit.

    python scripts/kill_resume.py                       # node task, oac, ~40k-node synthetic graph
    python scripts/kill_resume.py --mode sync --kill-after 25 --kills 2
    python scripts/kill_resume.py --small               # the quick version the tests run

Three kinds of run, each a separate ``python -m dgl_oac train`` process with the same options:
1. reference: uninterrupted, checkpointing as the others do (saving does not change what is trained);
2. victim: killed with SIGKILL as soon as its checkpoint file reports ``--kill-after`` steps or more (so the
   kill lands between checkpoints, possibly inside a save), then resumed with ``--resume`` (and, with
   ``--kills 2``, killed once more and resumed again) until it finishes;
3. the final ``checkpoint.ckpt`` of both is read back and compared with ``torch.equal``.
Prints one JSON line; exit status 0 when everything is equal.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import List, Optional

import torch

from dgl_oac.checkpoint import CheckpointError, CheckpointReader


def train_cmd(args: argparse.Namespace, folder: Path) -> List[str]:
    return [sys.executable, "-m", "dgl_oac", "train", "--task", "node", "--dataset", "synthetic",
            "--num-nodes", str(args.num_nodes), "--epochs", str(args.epochs), "--batch-size", str(args.batch_size),
            "--dim", str(args.dim), "--hidden", str(args.dim), "--fanouts", "5,5", "--mode", args.mode,
            "--optimizer", args.optimizer, "--dropout", "0.2", "--seed", str(args.seed), "--no-progress",
            "--threads", "1", "--checkpoint-dir", str(folder), "--checkpoint-every", str(args.every),
            "--out", str(folder / "result.json")]


def saved_steps(path: Path) -> Optional[int]:
    """Steps recorded in the checkpoint at ``path`` (None while there is none)."""
    try:
        with CheckpointReader(path) as reader:
            return int(reader.meta["extra"]["steps"])
    except (FileNotFoundError, CheckpointError):  # none yet, or caught mid-rename: look again
        return None


def run_to_end(cmd: List[str], log: Path) -> None:
    with open(log, "ab") as out:
        subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, check=True, timeout=900)


def kill_after(cmd: List[str], ckpt: Path, steps: int, log: Path) -> dict:
    """Start ``cmd``; SIGKILL it once its checkpoint holds >= ``steps`` steps. Returns what happened."""
    with open(log, "ab") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 900
            while proc.poll() is None and time.monotonic() < deadline:
                seen = saved_steps(ckpt)
                if seen is not None and seen >= steps:
                    proc.send_signal(signal.SIGKILL)
                    proc.wait()
                    return {"killed": True, "checkpoint_steps_at_kill": seen}
                time.sleep(0.01)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return {"killed": False, "returncode": proc.returncode}


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mode", default="oac", choices=["sync", "oac"])
    p.add_argument("--optimizer", default="adam", choices=["sgd", "adagrad", "adam"])
    p.add_argument("--num-nodes", type=int, default=40000)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--dim", type=int, default=32)
    p.add_argument("--every", type=int, default=10, help="checkpoint every N steps")
    p.add_argument("--kill-after", type=int, default=35, help="kill once a checkpoint holds this many steps")
    p.add_argument("--kills", type=int, default=1, help="how many times to kill and resume")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--small", action="store_true", help="a quick version (the test suite's)")
    p.add_argument("--workdir", help="keep the runs here (default: a temporary folder, deleted)")
    args = p.parse_args(argv)
    if args.small:
        args.num_nodes, args.epochs, args.batch_size, args.dim, args.every = 3000, 2, 64, 8, 4
        args.kill_after = min(args.kill_after, 13)
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        root = Path(tmp)
        ref, victim = root / "reference", root / "victim"
        with open(root / "reference.log", "wb") as ref_log:  # runs beside the victim (2 processes)
            reference = subprocess.Popen(train_cmd(args, ref), stdout=ref_log, stderr=subprocess.STDOUT)
            try:
                events = []
                ckpt = victim / "checkpoint.ckpt"
                for k in range(args.kills):
                    cmd = train_cmd(args, victim) + (["--resume"] if k else [])
                    events.append(kill_after(cmd, ckpt, args.kill_after + k * args.every * 2, root / "victim.log"))
                run_to_end(train_cmd(args, victim) + ["--resume"], root / "victim.log")
                if reference.wait(timeout=900):
                    raise RuntimeError(f"the reference run failed:\n{(root / 'reference.log').read_text()[-3000:]}")
            finally:
                if reference.poll() is None:
                    reference.kill()
                    reference.wait()
        a, b = CheckpointReader(ref / "checkpoint.ckpt"), CheckpointReader(victim / "checkpoint.ckpt")
        a.verify()
        b.verify()
        table_equal = torch.equal(a.table("emb"), b.table("emb"))
        ma, mb = a.meta["dense_modules"]["model"], b.meta["dense_modules"]["model"]
        model_equal = ma.keys() == mb.keys() and all(torch.equal(ma[k], mb[k]) for k in ma)
        result = json.loads((victim / "result.json").read_text())
        ref_result = json.loads((ref / "result.json").read_text())
        report = {"mode": args.mode, "optimizer": args.optimizer, "steps": ref_result["steps"], "kills": events,
                  "resumed_at_step": result["checkpoint"]["resumed_at_step"],
                  "table_and_state_equal": table_equal, "dense_model_equal": model_equal,
                  "final_metrics_equal": result["final"].get("test_acc") == ref_result["final"].get("test_acc"),
                  "train_seconds": round(ref_result["train_seconds"], 2)}
    print(json.dumps(report))
    ok = table_equal and model_equal and all(e["killed"] for e in events)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
