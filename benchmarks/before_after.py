"""bench_modes before and after a change, in one run: alternating checkouts, rounds interleaved.

    python benchmarks/before_after.py --base 8acab1e --rounds 2 -- --workload all --prefetch 4 --threads 2 \
        --priorities idle --steps 40

Runs ``benchmarks/bench_modes.py --rounds 1`` of the ``--base`` commit (a temporary git worktree, imported
through PYTHONPATH) and of this checkout, alternately (round r: base then this checkout, or the reverse on
odd rounds, so a drift of the machine does not favour either), then prints each workload's median batches/s
before -> after per mode. The JSONs go to ``--out`` (one per run) beside the table ``summary.md``.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, List

REPO = Path(__file__).resolve().parents[1]
LABELS = ("sync/t2", "dgl/t2", "async@4/t2", "oac@4/t2", "oac@auto/t2")


def bench(tree: Path, out: Path, extra: List[str]) -> None:
    """One ``bench_modes.py --rounds 1`` of the code in ``tree``, its JSON at ``out``."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    subprocess.run([sys.executable, "benchmarks/bench_modes.py", "--rounds", "1", "--no-progress",
                    "--out", str(out), *extra], cwd=tree, env=env, check=True, stdout=subprocess.DEVNULL)


def rates(path: Path) -> Dict[str, Dict[str, float]]:
    """workload -> label -> median batches/s of one bench_modes JSON."""
    res = json.loads(path.read_text())["workloads"]
    return {w: {lab: statistics.median(r["batches_per_s"] for r in v["runs"][lab]) for lab in LABELS
                if lab in v["runs"]} for w, v in res.items()}


def table(before: List[Path], after: List[Path]) -> str:
    b, a = [rates(p) for p in before], [rates(p) for p in after]
    rows = ["| workload | " + " | ".join(f"{lab.split('/')[0]}: before -> after batches/s" for lab in LABELS) + " |",
            "|---|" + "---|" * len(LABELS)]
    for w in b[0]:
        cells = []
        for lab in LABELS:
            if lab not in b[0][w]:
                cells.append("-")
                continue
            x, y = (statistics.median(r[w][lab] for r in runs) for runs in (b, a))
            cells.append(f"{x:.2f} -> {y:.2f} ({y / x:.2f}x)")
        rows.append(f"| {w} | " + " | ".join(cells) + " |")
    return "\n".join(rows) + "\n"


def parse(argv: List[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--base", required=True, help="the commit before the change")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--out", type=Path, default=REPO / "benchmarks/results/before_after")
    p.add_argument("extra", nargs="*", help="bench_modes.py options, after --")
    args = p.parse_args(argv)
    # absolute: the runs' working directories differ (the base worktree, this checkout), and a relative path
    # sent the base's JSONs into its worktree, removed with it
    args.out = args.out.resolve()
    return args


def main(argv: List[str] | None = None) -> None:
    args = parse(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="dgl-oac-base-") as tmp:
        base = Path(tmp) / "base"
        subprocess.run(["git", "worktree", "add", "--detach", "-q", str(base), args.base], cwd=REPO, check=True)
        try:
            runs: Dict[str, List[Path]] = {"before": [], "after": []}
            for r in range(args.rounds):
                order = [("before", base), ("after", REPO)]
                for tag, tree in order if r % 2 == 0 else order[::-1]:
                    out = args.out / f"{tag}-{r + 1}.json"
                    print(f"round {r + 1}: {tag}", flush=True)
                    bench(tree, out, args.extra)
                    runs[tag].append(out)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(base)], cwd=REPO, check=False)
    text = table(runs["before"], runs["after"])
    (args.out / "summary.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
