"""The batch-source examples (examples/pinsage.py, examples/node2vec.py, examples/pyg_metapath2vec.py): torch's
own sparse embeddings against dgl-oac's drop-in, sync and oac, side by side (PyG's MetaPath2Vec: PyG's loop, the
import-only port, and BatchLoader sync and oac over its loader).

Each round runs every configuration once (rotated order), each a fresh training run of ``--steps`` batches over
the same batch stream; a run's time is its steady state (from the end of step ``--warmup`` to the last step).
Ratios are taken per round and summarised by their median (``x torch`` > 1: faster than torch's own).

    python benchmarks/bench_sources.py --rounds 3 --steps 300 --warmup 60

Runs are long enough to time the steady state: ``prefetch="auto"`` probes its depths (pipelined and not, in
interleaved blocks) over the first 64 batches, so a 60-batch run times only the probe.
"""
from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any, Dict, List, Optional

import _common as C

NAME = "bench_sources"
EXAMPLES = C.REPO / "examples"
CONFIGS = (("torch", "torch", "sync"), ("dgl-oac sync", "dgl_oac", "sync"), ("dgl-oac oac", "dgl_oac", "oac"))
#: examples/pyg_metapath2vec.py's variants: (label, variant)
PYG_CONFIGS = (("torch", "torch"), ("import-only", "swap"), ("BatchLoader sync", "sync"), ("BatchLoader oac", "oac"))


def configs(name: str) -> List[Any]:
    """``(label, run)`` per configuration of example ``name``; ``run(mod, args)`` trains once and returns its
    ``times`` (per step) and loader ``stats``."""
    if name == "pyg_metapath2vec":
        return [(label, lambda mod, a, v=variant: mod.train(v, steps=a.steps, prefetch=a.prefetch, seed=a.seed))
                for label, variant in PYG_CONFIGS]
    return [(label, lambda mod, a, b=backend, m=mode: mod.train(b, m, batches=a.steps, prefetch=a.prefetch,
                                                                seed=a.seed))
            for label, backend, mode in CONFIGS]


def load_example(name: str) -> Any:
    """``examples/<name>.py`` as a module (examples/ is not a package)."""
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def parse(argv: Optional[List[str]] = None):
    p = C.base_parser(__doc__.split("\n\n")[0], NAME)
    p.add_argument("--examples", type=C.str_list, default=["pinsage", "node2vec", "pyg_metapath2vec"])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=300, help="batches per run")
    p.add_argument("--warmup", type=int, default=60,
                   help="first steps left out of a run's time (past the probe of prefetch='auto')")
    p.add_argument("--prefetch", default="auto", help="the dgl-oac loader's prefetch ('auto' or a depth)")
    args = p.parse_args(argv)
    if args.quick:
        args.rounds, args.steps, args.warmup = 1, 8, 2
    if args.steps <= args.warmup + 1:
        p.error(f"--steps ({args.steps}) must exceed --warmup + 1 ({args.warmup + 1})")
    args.prefetch = args.prefetch if args.prefetch == "auto" else int(args.prefetch)
    return args


def run_example(args, name: str, mod: Any) -> Dict[str, Any]:
    runs = configs(name)
    ms: Dict[str, List[float]] = {label: [] for label, _ in runs}
    stats: Dict[str, Any] = {}
    for r in range(args.rounds):
        for label, run in C.rotated(runs, r):
            out = run(mod, args)
            t = out["times"]
            ms[label].append(1000 * (t[-1] - t[args.warmup - 1]) / (len(t) - args.warmup))
            st = out["stats"]
            stats[label] = st if isinstance(st, dict) else st.as_dict()
            print(f"  round {r} {label}: {ms[label][-1]:.1f} ms/step", flush=True)
    ratios = {label: C.spread([t / m for t, m in zip(ms["torch"], ms[label])]) for label in ms}
    return {"ms": {k: C.spread(v) for k, v in ms.items()}, "ms_rounds": ms, "x_torch": ratios,
            "stats": stats}


def main(argv: Optional[List[str]] = None) -> Dict[str, Any]:
    args = parse(argv)
    env = C.environment()
    results = {}
    for name in args.examples:
        print(f"{name} (load {os.getloadavg()[0]:.1f})", flush=True)
        results[name] = run_example(args, name, load_example(name))
    result = {"args": {k: v for k, v in vars(args).items()}, "env": env, "results": results}

    def plot(png: Path) -> None:
        plt = C.pyplot()
        fig, axes = plt.subplots(1, len(results), figsize=(5 * len(results), 3.8), squeeze=False)
        for ax, (name, r) in zip(axes[0], results.items()):
            labels = list(r["ms"])
            ax.bar(labels, [r["ms"][k]["median"] for k in labels], color=["#888", "#4a7", "#27a", "#a72"][:len(labels)])
            for i, k in enumerate(labels):
                ax.text(i, r["ms"][k]["median"], f"{r['x_torch'][k]['median']:.2f}x", ha="center", va="bottom")
            ax.tick_params(axis="x", labelrotation=20)
            ax.set_ylabel("median ms per step (steady state)")
            ax.set_title(f"{name}: {args.steps} steps, {args.rounds} rounds")
        C.save_figure(fig, png)

    def report() -> None:
        for name, r in results.items():
            C.print_table(f"{name}: ms per step (median of {args.rounds} rounds) and speed-up over torch's own",
                          ["method", "ms", "min", "max", "x torch", "gather s", "commit s", "rows served"],
                          [[k, v["median"], v["min"], v["max"], r["x_torch"][k]["median"],
                            r["stats"][k].get("seconds", {}).get("gather", 0.0),
                            r["stats"][k].get("seconds", {}).get("commit", 0.0),
                            r["stats"][k].get("rows_served", 0)] for k, v in r["ms"].items()])
        print(f"\nload average (1, 5, 15 min) at the start: {env['loadavg_start']}, at the end: {env['loadavg_end']}")
    return C.publish(args, NAME, result, plot, report)


if __name__ == "__main__":
    main()
