"""OGB benchmarks through ``dgl-oac train``'s driver: sync, oac, async and plain DGL on one OGB dataset.

Each mode is one run of the training driver (``build_task`` + ``run``, the code behind ``dgl-oac train``) with
the same seed; the curve is the validation and test metric after every epoch against the training seconds so far
(evaluation timed apart), and the result is the test metric of the best-validation epoch, as OGB reports. The
JSON also says whether oac's curve equals sync's bit for bit (every loss and metric of every epoch).

Datasets (``--dataset``):

* ``ogbl-ddi``: MEASURED HERE (``../shared/data/ogbl-ddi``, 2-core CPU). Its settings are the defaults of
  ``dgl-oac train --task link --dataset ogbl-ddi`` (dgl_oac/app/tasks/defaults.py); results in benchmarks/QUALITY.md.
* ``ogbn-products``, ``ogbn-mag`` (heterogeneous), ``ogbl-citation2``, ``ogbl-wikikg2`` (knowledge graph):
  CONFIGURATION ONLY, NOT RUN HERE. Ready settings for a machine with internet and a GPU; fetch the data there
  with ``python scripts/prepare_ogb.py NAME --root ROOT`` and pass ``--root ROOT`` (or set DGL_OAC_DATA).

    python benchmarks/bench_ogb.py                              # ogbl-ddi: sync, oac, async, dgl
    python benchmarks/bench_ogb.py --modes sync,oac --epochs 50
    python benchmarks/bench_ogb.py --dataset ogbn-products --root /data/ogb --device cuda
    python benchmarks/bench_ogb.py --quick                      # seconds: ogbl-ddi, 2 small steps a mode
    python benchmarks/bench_ogb.py --check-speed                # ogbl-ddi's default, 8 steps, against the record

``--check-speed`` is the guard against a default that is fast where it was measured and slow elsewhere: it runs
``dgl-oac train --task link --dataset ogbl-ddi``'s default recipe (oac) for :data:`CHECK_STEPS` steps and sets
their batches/s beside ``results/ogbl_ddi_default.json``'s; more than :data:`SLOW_FACTOR` x slower is reported
and exits 1. (It caught the bfloat16 default on a CPU without AVX512-BF16: 0.05 batches/s against 0.99.)
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import _omp  # noqa: F401  (OMP_WAIT_POLICY must be set before torch loads)
import torch
from tqdm.auto import tqdm

import _common as C
from time_to_accuracy import memoize_loads, timed_run

NAME = "bench_ogb"
DEFAULT_MODES = "sync,oac,async,dgl"
#: dataset -> task, training settings beyond the task's (and dataset's) defaults, and whether it ran here
CONFIGS: Dict[str, Dict[str, Any]] = {
    "ogbl-ddi": {"task": "link", "settings": {}, "measured_here": True,
                 "note": "dgl-oac train --task link --dataset ogbl-ddi defaults (OGB's GraphSAGE baseline)"},
    "ogbn-products": {"task": "node", "measured_here": False, "device": "cuda",
                      "settings": {"dim": 128, "hidden": 256, "fanouts": "15,10,5", "batch_size": 1024,
                                   "dropout": 0.5, "lr": 0.01, "dense_lr": 0.003, "epochs": 20},
                      "note": "2.4M nodes, 100 features + a learnable 128-wide embedding per node"},
    "ogbn-mag": {"task": "node", "measured_here": False, "device": "cuda", "heterogeneous": True,
                 "settings": {"dim": 128, "hidden": 64, "fanouts": "25,20", "batch_size": 1024, "dropout": 0.5,
                              "lr": 0.01, "dense_lr": 0.01, "epochs": 3},
                 "note": "heterogeneous: learnable embeddings for author, institution and field_of_study next to "
                         "paper features; needs the heterograph path (issue 13, part 1)"},
    "ogbl-citation2": {"task": "link", "measured_here": False, "device": "cuda",
                       "settings": {"dim": 64, "hidden": 256, "fanouts": "15,10,5", "batch_size": 4096,
                                    "negatives": 64, "scorer": "mlp", "lr": 0.01, "dense_lr": 0.001,
                                    "epochs": 10, "eval_limit": 10_000},
                       "note": "2.9M nodes; MRR against 1000 negatives per positive (OGB's evaluator)"},
    "ogbl-wikikg2": {"task": "kg", "measured_here": False, "device": "cuda",
                     "settings": {"model": "complex", "dim": 128, "batch_size": 4096, "negatives": 1024,
                                  "epochs": 5, "eval_limit": 2000},
                     "note": "2.5M entities, 535 relations; MRR against OGB's 500 head/tail negatives"},
}
#: --check-speed: the default recipe's steps timed, and how much slower than the record is reported
CHECK_STEPS, SLOW_FACTOR = 8, 3.0
#: --check-speed's record: the default recipe's full run (its batches_per_s)
RECORD = "ogbl_ddi_default.json"
#: --quick: the real ogbl-ddi, tiny model, 2 steps of 8K edges, one evaluation (seconds)
QUICK = {"dim": 16, "hidden": 16, "scorer_hidden": 16, "batch_size": 8192, "epochs": 1, "max_steps": 2}


def parse(argv: Optional[List[str]] = None):
    p = C.base_parser(__doc__.split("\n\n")[0], NAME)
    p.add_argument("--dataset", default="ogbl-ddi", choices=sorted(CONFIGS), help="OGB dataset")
    p.add_argument("--root", default=None, help="data root (default: $DGL_OAC_DATA, else ../shared/data)")
    p.add_argument("--modes", default=DEFAULT_MODES, help="comma-separated: sync, oac, async, dgl")
    p.add_argument("--epochs", type=int, default=None, help="override the dataset's epoch count")
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's choice)")
    p.add_argument("--device", default=None, help="compute device (default: the configuration's; cpu for ddi)")
    p.add_argument("--check-speed", action="store_true",
                   help=f"ogbl-ddi's default recipe for {CHECK_STEPS} steps against results/{RECORD}: exit 1 if "
                        f"more than {SLOW_FACTOR:g}x slower")
    return p.parse_args(argv)


def speed_verdict(measured: float, recorded: float, factor: float = SLOW_FACTOR) -> Tuple[bool, str]:
    """``(ok, message)``: ``measured`` batches/s against the ``recorded`` ones; not ok when more than ``factor``
    times slower."""
    slower = recorded / measured if measured > 0 else float("inf")
    ok = slower <= factor
    what = f"{measured:.3g} batches/s against the record's {recorded:.3g} ({slower:.2f}x slower)" if slower >= 1 \
        else f"{measured:.3g} batches/s against the record's {recorded:.3g} ({1 / slower:.2f}x faster)"
    if ok:
        return True, f"ogbl-ddi default: {what}: ok"
    return False, (f"ogbl-ddi default: {what}: more than {factor:g}x slower. Look at what differs from the "
                   f"record's machine: the CPU's bfloat16 support (--autocast), thread counts, library versions")


def check_speed(args) -> int:
    """``--check-speed`` (module docstring): 0 when within :data:`SLOW_FACTOR` of the record, else 1."""
    import json

    recorded = json.loads((C.RESULTS / RECORD).read_text())["batches_per_s"]
    settings = {"epochs": 1, "max_steps": CHECK_STEPS, "device": args.device or "cpu"}
    run = run_mode(args, "oac", settings)
    if "error" in run:
        print(f"ogbl-ddi default: the run failed: {run['error']}")
        return 1
    ok, message = speed_verdict(run["batches_per_s"], recorded)
    print(message)
    return 0 if ok else 1


def settings_of(args) -> Dict[str, Any]:
    conf = CONFIGS[args.dataset]
    settings = dict(conf["settings"])
    if args.quick:
        settings.update(QUICK)
    if args.epochs:
        settings["epochs"] = args.epochs
    settings["device"] = args.device or conf.get("device", "cpu")
    return settings


def run_mode(args, mode: str, settings: Dict[str, Any]) -> Dict[str, Any]:
    from dgl_oac.app.tasks import build_task
    from dgl_oac.app.tasks.common import TrainConfig

    cfg = TrainConfig(task=CONFIGS[args.dataset]["task"], dataset=args.dataset, root=args.root, mode=mode,
                      seed=args.seed, threads=args.threads, progress=args.progress, **settings)
    return timed_run(cfg, build_task, args.seed, args.threads)


def same_curve(a: Dict[str, Any], b: Dict[str, Any]) -> Optional[bool]:
    """Whether two runs' curves hold the same losses and metrics at every epoch (None: one is missing)."""
    if not a.get("curve") or not b.get("curve"):
        return None
    keys = [k for k in a["curve"][0] if k == "train_loss" or k.startswith(("valid_", "test_"))]
    return len(a["curve"]) == len(b["curve"]) and all(
        p[k] == q.get(k) for p, q in zip(a["curve"], b["curve"]) for k in keys)


def metric_of(run: Dict[str, Any]) -> Optional[str]:
    point = (run.get("curve") or [{}])[0]
    return next((k[len("valid_"):] for k in point if k.startswith("valid_")), None)


def main(argv: Optional[List[str]] = None) -> Dict[str, Any]:
    args = parse(argv)
    if args.check_speed:
        raise SystemExit(check_speed(args))
    memoize_loads()  # the dataset is read once, not once per mode
    conf = CONFIGS[args.dataset]
    settings = settings_of(args)
    modes = C.str_list(args.modes)
    result: Dict[str, Any] = {"benchmark": NAME, "env": C.environment(), "args": vars(args),
                              "dataset": args.dataset, "task": conf["task"], "settings": settings,
                              "measured_here": conf["measured_here"], "note": conf["note"], "runs": {}}
    for mode in tqdm(modes, desc=f"{NAME} {args.dataset}", disable=not args.progress, dynamic_ncols=True):
        result["runs"][mode] = run_mode(args, mode, settings)
    if "sync" in result["runs"] and "oac" in result["runs"]:
        result["oac_equals_sync"] = same_curve(result["runs"]["sync"], result["runs"]["oac"])
    result["metric"] = next((metric_of(r) for r in result["runs"].values() if metric_of(r)), None)
    result["torch_threads"] = torch.get_num_threads()
    return C.publish(args, NAME, result, lambda png: plot(result, png), lambda: report(result))


def plot(result: Dict[str, Any], png: Path) -> None:
    metric = result["metric"]
    if metric is None:
        return
    plt = C.pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    colors = {"sync": "tab:blue", "oac": "tab:green", "async": "tab:orange", "dgl": "tab:gray"}
    for mode, run in result["runs"].items():
        if not run.get("curve"):
            continue
        secs = [p["train_seconds"] for p in run["curve"]]
        for split, ls in (("test", "-"), ("valid", ":")):
            ax.plot(secs, [p[f"{split}_{metric}"] for p in run["curve"]], ls=ls, color=colors.get(mode, "k"),
                    marker="o" if len(secs) < 30 else None, ms=3,
                    lw=2.5 if mode == "sync" else 1.2, label=f"{mode} {split}")
    ax.set_xlabel("training seconds (evaluation excluded)")
    ax.set_ylabel(metric)
    eq = result.get("oac_equals_sync")
    ax.set_title(f"{result['dataset']}: {metric} vs training time"
                 + ("" if eq is None else f" (oac curve == sync curve: {eq})"), fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, ncol=2)
    C.save_figure(fig, png)


def report(result: Dict[str, Any]) -> None:
    metric = result["metric"]
    rows = []
    for mode, run in result["runs"].items():
        if "error" in run:
            rows.append([mode, "error", run["error"][:70], "", "", "", "", ""])
            continue
        best, st = run["best"], run.get("loader_stats") or {}
        rows.append([mode, len(run["curve"]), best["epoch"], best[f"valid_{metric}"], best[f"test_{metric}"],
                     run["train_seconds"], "-" if not st or st["conflict_rate"] is None else f"{st['conflict_rate']:.3f}", st.get("depths", "-")])
    C.print_table(f"{result['dataset']} ({'measured here' if result['measured_here'] else 'configuration only'}):"
                  f" {metric} at the best-validation epoch",
                  ["mode", "epochs", "best epoch", f"valid {metric}", f"test {metric}", "train s", "conflict",
                   "depths"], rows)
    if "oac_equals_sync" in result:
        print(f"  oac curve equals sync's bit for bit: {result['oac_equals_sync']}")


if __name__ == "__main__":
    main()
