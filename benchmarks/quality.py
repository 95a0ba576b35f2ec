"""Quality targets (issue 4): model quality reached by ``dgl-oac train`` on real data, per mode.

Experiments (``--only`` picks a subset; each writes ``<out-dir>/<name>.json`` + ``.png``, and the run ends by
rebuilding ``<out-dir>/quality.json`` + ``quality.png`` from every experiment file present, so the long ones can
be run separately):

* ``fb15k237``: ComplEx on FB15k-237, filtered test MRR (target >= 0.25, aim >= 0.30), mode oac.
* ``wn18rr``: ComplEx on WN18RR, filtered test MRR (target >= 0.40), mode oac.
* ``github``: node classification on github-social (no features: learnable embeddings only, 2 classes), modes
  sync, async, oac; oac must equal sync exactly, epoch by epoch.
* ``physics``: the same on coauthor-physics (features dropped: learnable embeddings only, 5 classes).

``--quick`` (< 1 minute): a small synthetic KG and a few steps on github-social, every mode comparison intact.
Each run is one in-process ``dgl_oac.app.tasks.train(TrainConfig(...))`` with ``torch.manual_seed(seed)`` first (the
node task draws its model init from torch's global RNG), so sync and oac start from identical models.
Timings on a shared machine are what they are: the JSON records the load average before and after.
"""
from __future__ import annotations

import _omp  # noqa: F401  (first: sets OMP_WAIT_POLICY before torch loads)

import argparse
import copy
import json
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

import torch

from _common import HERE, QUICK_RESULTS, base_parser, environment, finish, print_table, pyplot, str_list

from dgl_oac.app.tasks import TrainConfig, train

OUT_DIR = HERE / "results" / "quality"
QUICK_OUT_DIR = QUICK_RESULTS / "quality"
TIMING = ("epoch", "train_seconds", "epoch_seconds", "eval_seconds")

KG_FB15K237 = dict(task="kg", dataset="FB15k-237", model="complex", dim=256, negatives=2048, batch_size=1024,
                   optimizer="adagrad", lr=0.1, dense_lr=0.1, loss="ce", regularizer="n3", reg_weight=0.03,
                   epochs=12, eval_limit=2000)
KG_WN18RR = dict(task="kg", dataset="WN18RR", model="complex", dim=256, negatives=2048, batch_size=1024,
                 optimizer="adagrad", lr=0.1, dense_lr=0.1, loss="ce", regularizer="n3", reg_weight=0.1,
                 epochs=20, eval_limit=1000)
NODE_GITHUB = dict(task="node", dataset="github-social", epochs=4, lr=0.002)
NODE_PHYSICS = dict(task="node", dataset="coauthor-physics", epochs=4, lr=0.01, extra={"features": False})

EXPERIMENTS: Dict[str, Dict[str, Any]] = {
    "fb15k237": {"title": "FB15k-237, ComplEx (filtered)", "metric": "test_mrr", "target": 0.25, "aim": 0.30,
                 "modes": ("oac",), "cfg": KG_FB15K237},
    "wn18rr": {"title": "WN18RR, ComplEx (filtered)", "metric": "test_mrr", "target": 0.40, "modes": ("oac",),
               "cfg": KG_WN18RR},
    "github": {"title": "github-social, GraphSAGE on learnable embeddings", "metric": "test_acc",
               "modes": ("sync", "async", "oac"), "cfg": NODE_GITHUB},
    "physics": {"title": "coauthor-physics (no features), GraphSAGE on learnable embeddings", "metric": "test_acc",
                "modes": ("sync", "async", "oac"), "cfg": NODE_PHYSICS},
}
QUICK: Dict[str, Dict[str, Any]] = {
    "kg-synthetic": {"title": "synthetic KG (600 entities), DistMult", "metric": "test_mrr",
                     "modes": ("sync", "async", "oac"),
                     "cfg": dict(task="kg", dataset="synthetic", num_nodes=600, model="distmult", dim=16,
                                 negatives=64, batch_size=64, optimizer="adagrad", lr=0.05, dense_lr=0.05,
                                 reg_weight=0.05, epochs=4, extra={"num_classes": 4})},
    "github": {"title": "github-social (a few steps)", "metric": "test_acc", "modes": ("sync", "async", "oac"),
               "cfg": dict(task="node", dataset="github-social", epochs=2, max_steps=6, batch_size=2048, dim=16,
                           hidden=16, lr=0.002)},
}


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    p = base_parser(__doc__.split("\n\n")[0], "quality")
    for action in p._actions:
        if action.dest == "out":
            action.help = "the combined JSON (a PNG is written beside it); default <out-dir>/quality.json"
    p.add_argument("--out-dir", default=None, help=f"where the JSON/PNG files go (default {OUT_DIR}, "
                                                   f"{QUICK_OUT_DIR} with --quick); --out names the combined JSON")
    p.add_argument("--only", default=None,
                   help=f"comma-separated subset of {','.join(EXPERIMENTS)} (quick: {','.join(QUICK)})")
    p.add_argument("--modes", default=None, help="override every experiment's modes (comma-separated)")
    p.add_argument("--epochs", type=int, default=None, help="override every experiment's epochs")
    p.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    p.add_argument("--combine-only", action="store_true",
                   help="run nothing: rebuild the combined JSON/PNG and the tables from the experiment files present")
    return p.parse_args(argv)


def metrics_of(curve: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    return [{k: v for k, v in p.items() if k not in TIMING} for p in curve]


def best_valid(curve: List[Dict[str, Any]], metric: str) -> Dict[str, Any]:
    """The curve point with the best validation value of ``metric`` (early stopping's pick)."""
    valid = metric.replace("test_", "valid_")
    return max(curve, key=lambda p: p.get(valid, float("-inf"))) if curve else {}


def run_mode(spec: Dict[str, Any], mode: str, args: argparse.Namespace) -> Dict[str, Any]:
    kw = copy.deepcopy(spec["cfg"])
    if args.epochs is not None:
        kw["epochs"] = args.epochs
    cfg = TrainConfig(mode=mode, seed=args.seed, progress=args.progress, threads=args.threads, **kw)
    torch.manual_seed(args.seed)  # the node task's model init uses the global RNG: same start in every mode
    t0 = time.perf_counter()
    res = train(cfg)
    res["process_wall_seconds"] = time.perf_counter() - t0
    res["extra"] = kw.get("extra", {})
    return res


def summarise(name: str, spec: Dict[str, Any], runs: Dict[str, Dict[str, Any]]) -> Dict[str, Any]:
    metric = spec["metric"]
    out: Dict[str, Any] = {"metric": metric, "rows": []}
    if "sync" in runs and "oac" in runs:
        out["oac_equals_sync"] = metrics_of(runs["oac"]["curve"]) == metrics_of(runs["sync"]["curve"])
    if "sync" in runs and "async" in runs:
        a, s = runs["async"]["curve"], runs["sync"]["curve"]
        out["async_max_abs_diff"] = max((abs(x[metric] - y[metric]) for x, y in zip(a, s)), default=0.0)
    for mode, res in runs.items():
        final = res["final"]
        best = best_valid(res["curve"], metric)
        row = {"mode": mode, "epochs": len(res["curve"]), "train_s": res["train_seconds"],
               "wall_s": res["process_wall_seconds"], "final": final.get(metric), "best_valid_epoch": best.get("epoch"),
               "at_best_valid": best.get(metric), "batches_per_s": res["batches_per_s"]}
        for k in ("test_hits@1", "test_hits@3", "test_hits@10", "valid_mrr", "valid_acc"):
            if k in final:
                row[k] = final[k]
        if spec.get("target") is not None:
            row["target_met"] = bool(final.get(metric, 0.0) >= spec["target"])
        out["rows"].append(row)
    return out


def run_experiment(name: str, spec: Dict[str, Any], args: argparse.Namespace, out_dir: Path) -> Dict[str, Any]:
    modes = str_list(args.modes) if args.modes else list(spec["modes"])
    env = environment()  # before the runs: loadavg_start is the load they started under
    runs: Dict[str, Dict[str, Any]] = {}
    for mode in modes:
        print(f"[{name}] {mode} ...", flush=True)
        runs[mode] = run_mode(spec, mode, args)
        fin = runs[mode]["final"]
        print(f"[{name}] {mode}: {spec['metric']}={fin.get(spec['metric'], float('nan')):.4f} "
              f"({runs[mode]['train_seconds']:.0f}s training, {runs[mode]['process_wall_seconds']:.0f}s wall)",
              flush=True)
    result = {"env": env, "name": name, "title": spec["title"], "spec": {k: v for k, v in spec.items()},
              "runs": runs, "summary": summarise(name, spec, runs)}
    path = out_dir / f"{name}.json"
    finish(result, path)
    plot([result], path.with_suffix(".png"))
    return result


def plot(results: List[Dict[str, Any]], png: Path) -> None:
    plt = pyplot()
    n = len(results)
    fig, axes = plt.subplots(1, n, figsize=(4.6 * n, 3.8), squeeze=False)
    for ax, res in zip(axes[0], results):
        metric = res["summary"]["metric"]
        for mode, run in res["runs"].items():
            curve = run["curve"]
            style = {"sync": "-o", "async": "-s", "oac": "--^", "dgl": "-x"}.get(mode, "-o")
            ax.plot([p["train_seconds"] for p in curve], [p.get(metric, float("nan")) for p in curve], style,
                    label=mode, markersize=4, alpha=0.85)
            if run["config"].get("eval_limit") and curve:  # the last point ranks every triple, the others a subset
                ax.plot([curve[-1]["train_seconds"]], [curve[-1].get(metric, float("nan"))], "k*", markersize=9,
                        label=f"all triples (earlier: {run['config']['eval_limit']} per split)")
        target = res["spec"].get("target")
        if target is not None:
            ax.axhline(target, color="grey", lw=0.8, ls=":", label=f"target {target}")
        ax.set_title(res["title"], fontsize=8)
        ax.set_xlabel("training seconds")
        ax.set_ylabel(metric)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)
    plt.close(fig)


def _vs_sync(res: Dict[str, Any], mode: str) -> str:
    """The last column of the summary table: how a mode's per-epoch metrics compare with sync's."""
    runs = res["runs"]
    if mode == "sync":
        return "reference" if len(runs) > 1 else "n/a"
    if "sync" not in runs:
        return "n/a"
    a, b = metrics_of(runs[mode]["curve"]), metrics_of(runs["sync"]["curve"])
    if a == b:
        return "**equal, every epoch**"
    metric = res["summary"]["metric"]
    diff = max((abs(x.get(metric, 0.0) - y.get(metric, 0.0)) for x, y in zip(a, b)), default=0.0)
    return f"differs (max abs {metric} diff {diff:.4f})"


def markdown(results: List[Dict[str, Any]]) -> str:
    lines = ["| experiment | mode | epochs | train s | wall s | final metric | best-valid epoch: metric | "
             "vs sync |", "|---|---|---:|---:|---:|---|---|---|"]
    for res in results:
        s = res["summary"]
        for row in s["rows"]:
            extra = "".join(f", {k.replace('test_', '')} {row[k]:.3f}" for k in ("test_hits@1", "test_hits@10")
                            if k in row)
            lines.append(f"| {res['name']} | {row['mode']} | {row['epochs']} | {row['train_s']:.0f} | "
                         f"{row['wall_s']:.0f} | {s['metric']} {row['final']:.4f}{extra} | "
                         f"{row['best_valid_epoch']}: {row['at_best_valid']:.4f} | {_vs_sync(res, row['mode'])} |")
    for res in results:
        if len(res["runs"]) < 2:
            continue
        metric = res["summary"]["metric"]
        valid = metric.replace("test_", "valid_")
        modes = list(res["runs"])
        lines += ["", f"{res['name']}: per epoch, {valid} / {metric} / train_loss (full precision)", "",
                  "| epoch | " + " | ".join(modes) + " | oac == sync |", "|---:|" + "---|" * (len(modes) + 1)]
        curves = {m: res["runs"][m]["curve"] for m in modes}
        for i in range(max(len(c) for c in curves.values())):
            cells = []
            for m in modes:
                p = curves[m][i] if i < len(curves[m]) else None
                cells.append("" if p is None else f"{p[valid]!r} / {p[metric]!r} / {p['train_loss']:.6f}")
            eq = ""
            if "sync" in curves and "oac" in curves and i < len(curves["sync"]) and i < len(curves["oac"]):
                eq = "yes" if metrics_of([curves["oac"][i]]) == metrics_of([curves["sync"][i]]) else "NO"
            lines.append(f"| {i + 1} | " + " | ".join(cells) + f" | {eq} |")
    return "\n".join(lines)


def combine(out_dir: Path, names: List[str], combined: Path) -> List[Dict[str, Any]]:
    results = []
    for name in names:
        path = out_dir / f"{name}.json"
        if path.exists():
            results.append(json.loads(path.read_text()))
            plot(results[-1:], path.with_suffix(".png"))
    if results:
        finish({"env": environment(), "experiments": {r["name"]: r for r in results},
                "markdown": markdown(results)}, combined)
        plot(results, combined.with_suffix(".png"))
    return results


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    table = QUICK if args.quick else EXPERIMENTS
    names = str_list(args.only) if args.only else list(table)
    unknown = [n for n in names if n not in table]
    if unknown:
        print(f"unknown experiment(s) {unknown}; expected {list(table)}", file=sys.stderr)
        return 2
    out_dir = Path(args.out_dir) if args.out_dir else (QUICK_OUT_DIR if args.quick else OUT_DIR)
    combined = Path(args.out) if args.out else out_dir / "quality.json"
    if args.out:
        out_dir = Path(args.out_dir) if args.out_dir else combined.parent
    for name in [] if args.combine_only else names:
        run_experiment(name, table[name], args, out_dir)
    results = combine(out_dir, list(table), combined)
    rows = [[r["name"], row["mode"], row["epochs"], row["train_s"], row["final"], row["at_best_valid"],
             r["summary"].get("oac_equals_sync", "n/a")] for r in results for row in r["summary"]["rows"]]
    print_table("quality", ["experiment", "mode", "epochs", "train s", "final", "at best valid", "oac==sync"], rows)
    print("\n" + markdown(results))
    print(f"\nwrote {combined} and {combined.with_suffix('.png')}")
    bad = [r["name"] for r in results if r["summary"].get("oac_equals_sync") is False]
    if bad:
        print(f"oac differs from sync in: {', '.join(bad)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
