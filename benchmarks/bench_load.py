"""Throughput beside a competing busy process, against the same run on a quiet machine: the fair-share check.

Each configuration runs in a child process with the user's default environment (no ``OMP_*`` variables), or with
a policy of :data:`POLICIES` (``OMP_WAIT_POLICY=PASSIVE``; libgomp's spin count cut to 10k), quiet and beside
a competitor:

* ``burner``: one busy Python loop (one core's worth of CPU: an evaluation, a CI job, another user);
* ``trainer``: a second dgl-oac training (``dgl-oac train``'s default node task, run without end).

The dgl-oac runs are ``bench_modes.py`` children (sync, async@4, oac@4 and oac@auto on the KG and node workloads);
the reference is plain torch: ``nn.Embedding(sparse=True)`` + ``torch.optim.Adagrad``, a DistMult step of the KG
workload's shape. Rounds interleave the conditions; the summary is loaded/quiet per configuration (medians).

    python benchmarks/bench_load.py --rounds 2 --out benchmarks/results/bench_load.json
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

ROOT = Path(__file__).resolve().parents[1]
POLICIES = {"default": {}, "passive": {"OMP_WAIT_POLICY": "PASSIVE"}, "spin10k": {"GOMP_SPINCOUNT": "10000"},
            # every core to the caller's team during an epoch (a team size the user set: dgl_oac.engine.runtime
            # then leaves it), as before the library sized the team
            "allcores": {"OMP_NUM_THREADS": str(len(os.sched_getaffinity(0)))}}
CONDITIONS = ("quiet", "burner", "trainer")
CONFIGS = ("sync", "async@4", "oac@4", "oac@auto")  # of bench_modes' labels
BURNER = "while True: pass"
#: the "trainer" competitor: a second dgl-oac training (its CLI's default node task, oac), run until stopped
TRAINER = [sys.executable, "-m", "dgl_oac", "train", "--epochs", "100000", "--no-progress"]


def child_env(policy: str) -> Dict[str, str]:
    """The user's environment without ``OMP_*`` settings, plus ``policy``'s."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMP_", "GOMP_"))}
    env.update(POLICIES[policy])
    return env


def torch_reference(steps: int) -> float:
    """Plain torch (no dgl-oac): DistMult over ``nn.Embedding(sparse=True)`` + sparse Adagrad, 1024 triples and
    1024 shared negatives a step, dim 256, 50k entities; returns steps/s after 5 warm-up steps."""
    import torch

    gen = torch.Generator().manual_seed(0)
    ent = torch.nn.Embedding(50_000, 256, sparse=True)
    rel = torch.nn.Embedding(8, 256)
    opt = torch.optim.Adagrad(ent.parameters(), lr=0.1)
    dense = torch.optim.Adam(rel.parameters(), lr=0.01)
    n, t0 = 0, 0.0
    while n < steps + 5:
        if n == 5:
            t0 = time.perf_counter()
        h, t, neg = (torch.randint(0, 50_000, (1024,), generator=gen) for _ in range(3))
        r = torch.randint(0, 8, (1024,), generator=gen)
        hr = ent(h) * rel(r)
        pos = (hr * ent(t)).sum(1)
        scores = hr @ ent(neg).t()
        loss = torch.nn.functional.softplus(-pos).mean() + torch.nn.functional.softplus(scores).mean()
        opt.zero_grad()
        dense.zero_grad()
        loss.backward()
        opt.step()
        dense.step()
        n += 1
    return steps / (time.perf_counter() - t0)


def start_competitor(kind: str) -> Optional[subprocess.Popen]:
    if kind == "quiet":
        return None
    argv = [sys.executable, "-c", BURNER] if kind == "burner" else TRAINER
    proc = subprocess.Popen(argv, env=child_env("default"), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(3.0 if kind == "burner" else 20.0)  # busy before the measurement starts (the trainer: past its
    # imports and graph building, training)
    return proc


def stop(proc: Optional[subprocess.Popen]) -> None:
    if proc is not None:
        proc.kill()
        proc.wait(timeout=30)


def config_of(label: str) -> str:
    """bench_modes' label without its thread count: ``oac@4/t2/normal`` -> ``oac@4/normal``."""
    return "/".join(part for part in label.split("/") if not (part[:1] == "t" and part[1:].isdigit()))


def run_modes(args: argparse.Namespace, policy: str, tmp: Path) -> List[Dict[str, Any]]:
    """sync, oac@4 and oac@auto on each workload (every configuration past auto's probe: bench_modes' warm-up)
    at each of ``--priorities``, one bench_modes child; its per-configuration lines."""
    stream = tmp / f"modes-{time.monotonic_ns()}.jsonl"
    argv = [sys.executable, str(ROOT / "benchmarks" / "bench_modes.py"), "--workload", args.workloads,
            "--modes", "sync,async,oac", "--prefetch", "4", "--threads", str(args.threads), "--priorities",
            args.priorities, "--num-nodes",
            str(args.num_nodes), "--steps", str(args.steps), "--warmup", str(args.warmup), "--rounds", "1",
            "--no-dgl", "--no-progress", "--out", str(tmp / "modes.json"), "--stream", str(stream)]
    subprocess.run(argv, env=child_env(policy), cwd=ROOT, check=True, stdout=subprocess.DEVNULL,
                   timeout=args.child_timeout)
    return measured([json.loads(line) for line in stream.read_text().splitlines()], args.threads)


def measured(lines: List[Dict[str, Any]], threads: int) -> List[Dict[str, Any]]:
    """The :data:`CONFIGS` runs of a bench_modes stream at ``threads`` torch threads (bench_modes adds sync on one
    thread too, its work ceiling, which must not mix into sync's median)."""
    return [{"workload": r["workload"], "config": config_of(r["label"]), "steps_per_s": r["steps_per_s"]}
            for r in lines if r.get("kind") == "run" and r["label"].split("/")[0] in CONFIGS
            and r["label"].split("/")[1] == f"t{threads}"]


def run_reference(args: argparse.Namespace, policy: str) -> Dict[str, Any]:
    out = subprocess.run([sys.executable, __file__, "--child-reference", "--steps", str(args.steps)],
                         env=child_env(policy), capture_output=True, text=True, check=True,
                         timeout=args.child_timeout)
    return {"workload": "torch-distmult-256", "config": "torch", "steps_per_s": float(out.stdout.split()[-1])}


def summarize(rows: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Median steps/s per (workload, config, policy, condition), and each loaded condition's ratio to quiet."""
    keys = sorted({(r["workload"], r["config"], r["policy"]) for r in rows})
    out = []
    for w, c, p in keys:
        med = {cond: statistics.median([r["steps_per_s"] for r in rows if (r["workload"], r["config"],
                                                                          r["policy"], r["condition"])
                                        == (w, c, p, cond)] or [float("nan")]) for cond in CONDITIONS}
        out.append({"workload": w, "config": c, "policy": p, **{f"{k}_steps_per_s": v for k, v in med.items()},
                    **{f"{k}/quiet": med[k] / med["quiet"] for k in CONDITIONS[1:]}})
    return out


def plot(summary: List[Dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{s['workload']}\n{s['config']} [{s['policy']}]" for s in summary]
    fig, ax = plt.subplots(figsize=(max(6.0, 0.9 * len(labels)), 4.2))
    width = 0.38
    for i, cond in enumerate(CONDITIONS[1:]):
        ax.bar([x + (i - 0.5) * width for x in range(len(labels))], [s[f"{cond}/quiet"] for s in summary],
               width, label=f"beside a {cond}")
    ax.axhline(0.4, color="black", linestyle="--", linewidth=1, label="0.4x: the bar")
    ax.axhline(0.5, color="grey", linestyle=":", linewidth=1, label="0.5x: a fair share of 2 cores")
    ax.set_xticks(range(len(labels)), labels, fontsize=7, rotation=35, ha="right")
    ax.set_ylabel("throughput loaded / quiet (median)")
    ax.set_title("One competing busy process: each configuration's loaded / quiet throughput, per OpenMP "
                 "policy\n(each bar against its own policy's quiet run: see the JSON for quiet steps/s)", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--steps", type=int, default=24, help="timed steps of each configuration")
    p.add_argument("--warmup", type=int, default=8)
    p.add_argument("--num-nodes", type=int, default=150_000,
                   help="graph size (an epoch must hold --warmup + --steps batches)")
    p.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)),
                   help="torch threads of the dgl-oac children (torch's default here)")
    p.add_argument("--priorities", default="auto", help="background priorities, each its own configuration")
    p.add_argument("--workloads", default="kg-adagrad-256,node-adam-128")
    p.add_argument("--policies", default="default,passive", help=f"of {', '.join(POLICIES)}")
    p.add_argument("--conditions", default=",".join(CONDITIONS))
    p.add_argument("--child-timeout", type=float, default=900.0, help="hang detector for one child (seconds)")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "bench_load.json")
    p.add_argument("--child-reference", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child_reference:
        print(f"{torch_reference(args.steps):.4f}")
        return 0
    from tqdm import tqdm

    policies, conditions = args.policies.split(","), args.conditions.split(",")
    if "quiet" not in conditions:
        p.error("--conditions must include quiet (the ratios' denominator)")
    rows: List[Dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp, tqdm(total=args.rounds * len(conditions) * len(policies)) as bar:
        for rnd in range(args.rounds):
            order = conditions if rnd % 2 == 0 else conditions[::-1]  # interleaved: drift hits every condition
            for cond in order:
                competitor = start_competitor(cond)
                try:
                    for policy in policies:
                        for r in run_modes(args, policy, Path(tmp)) + [run_reference(args, policy)]:
                            rows.append({**r, "policy": policy, "condition": cond, "round": rnd})
                        bar.update(1)
                finally:
                    stop(competitor)
    summary = summarize(rows)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    command = " ".join(["python", "benchmarks/bench_load.py", *(sys.argv[1:] if argv is None else argv)])
    report = {"benchmark": "bench_load", "command": command,
              "cpus": len(os.sched_getaffinity(0)), "loadavg_end": os.getloadavg(), "runs": rows,
              "summary": summary}
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    plot(summary, args.out.with_suffix(".png"))
    for s in summary:
        print(f"{s['workload']:20s} {s['config']:7s} {s['policy']:8s} quiet {s['quiet_steps_per_s']:7.2f}/s  "
              + "  ".join(f"{c} {s[f'{c}/quiet']:.2f}x" for c in conditions if c != "quiet"))
    print(f"wrote {args.out} and {args.out.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
