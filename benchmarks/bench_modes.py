"""Throughput of sync vs async vs oac (and plain DGL) on the SAME batches, side by side, in one run.

Workload (default): synthetic power-law graph (300k nodes, average degree 10, exponent 2.1), node
classification with GraphSAGE (fanouts 10,5, hidden 64) over learnable embeddings (dim 128, SparseAdam rows:
value + 2 moments + step = 385 floats per row, ~1.5 KB), batch 1024 seed nodes (~20k input rows a batch). On
this kind of machine gathering the rows, updating them and computing take comparable time, which is where a
pipeline can help.

Every configuration builds the same task from the same seed and trains the same batches: the dgl-oac modes
share one batch stream (a function of the seed); the plain-DGL baseline (``dgl.nn.NodeEmbedding`` +
``dgl.optim.SparseAdam`` + ``dgl.dataloading.DataLoader``, same model) gets the same seed nodes per batch (its
neighbour samples come from DGL's own RNG). Each run warms up, then times ``--steps`` batches (write-back
flushed inside the window). Rounds interleave all configurations in a rotated order; ratios are taken within a
round and summarised by their median over rounds.

Reported per configuration: batches/s, rows/s, per-step stage milliseconds (``loader.stats``: sample, gather,
copy, wait, validate, commit; write-back busy time; and the training step itself), conflict rate (oac), the
ratios oac/async at every prefetch depth, oac/sync, oac/dgl, and validate time as a share of a step. The
background threads run at the DataLoader's default priority (``idle``); async and oac at the target depth also
run at ``normal`` priority, interleaved with the rest, for the ratio idle/normal. Async with each staleness rule
(``async-gap``, ``async-lookahead``: :mod:`dgl_oac.staleness`) runs at the target depth, for its cost over async.

    python benchmarks/bench_modes.py            # full size, a few minutes
    python benchmarks/bench_modes.py --quick    # < 1 minute smoke run
"""
from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any, ContextManager, Dict, List, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _omp  # noqa: E402,F401  (OMP_WAIT_POLICY must be set before torch loads)
import torch  # noqa: E402
from tqdm.auto import tqdm  # noqa: E402

import _common as C  # noqa: E402

NAME = "bench_modes"
TARGETS = {"oac_vs_async_at_target_prefetch": 0.95, "oac_vs_sync": 1.3, "oac_vs_dgl": 1.3,
           "validate_share_max": 0.05, "oac_default_vs_sync": 1.0, "oac_default_vs_dgl": 1.5}
STALENESS_RULES = ("gap", "lookahead")  # async with a staleness rule (DataLoader(staleness=...)), at the target depth
AUTO_WARMUP = 48  # prefetch="auto" probes its depths over its first ~40 batches: time the steady state after


def parse(argv: List[str] = None):
    p = C.base_parser(__doc__.split("\n\n")[0], NAME)
    p.add_argument("--num-nodes", type=int, default=300_000)
    p.add_argument("--avg-degree", type=float, default=10.0)
    p.add_argument("--power", type=float, default=2.1, help="degree exponent of the synthetic graph")
    p.add_argument("--dim", type=int, default=128, help="embedding dimension")
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--fanouts", default="10,5")
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--optimizer", default="adam", choices=["adagrad", "adam"],
                   help="sparse row optimizer (plain DGL has no sparse SGD)")
    p.add_argument("--prefetch", default="1,2,4,8", help="prefetch depths for async and oac")
    p.add_argument("--target-prefetch", type=int, default=4, help="depth at which oac is compared with the rest")
    p.add_argument("--threads", default="2,1",
                   help="torch intra-op thread counts; the first gets the full prefetch sweep, the others only "
                        "sync, dgl, async and oac at --target-prefetch")
    p.add_argument("--device", default="cpu",
                   help="compute device of every configuration: cpu, cuda or cuda:N (the tables stay in CPU memory)")
    p.add_argument("--priorities", default="idle,normal",
                   help="background-thread priorities (DataLoader background_priority); the first gets every "
                        "configuration, the others only async and oac at --target-prefetch and the first thread "
                        "count")
    p.add_argument("--warmup", type=int, default=30,
                   help="untimed steps before each timed window (first touches of oac's write-log ring and of the "
                        "row-buffer pools page-fault): the timed window measures the steady state")
    p.add_argument("--steps", type=int, default=24, help="timed steps per run")
    p.add_argument("--rounds", type=int, default=3, help="interleaved repetitions of every configuration")
    args = p.parse_args(argv)
    if args.quick:
        args.num_nodes, args.dim, args.hidden, args.batch_size = 20_000, 32, 32, 256
        args.prefetch, args.threads, args.warmup, args.steps, args.rounds = "1,4", "2,1", 2, 6, 2
    if any(x not in ("idle", "normal") for x in priorities(args)) or not priorities(args):
        p.error("--priorities takes idle and/or normal")
    if args.target_prefetch not in C.int_list(args.prefetch):
        p.error("--target-prefetch must be one of --prefetch")
    return args


def priorities(args) -> List[str]:
    return C.str_list(args.priorities)


def configs(args) -> List[Dict[str, Any]]:
    threads = C.int_list(args.threads)
    first, *others = priorities(args)
    out = []
    for i, t in enumerate(threads):
        out += [{"mode": "sync", "prefetch": 1, "threads": t}, {"mode": "dgl", "prefetch": 1, "threads": t}]
        for p in (C.int_list(args.prefetch) if i == 0 else [args.target_prefetch]):
            out += [{"mode": "async", "prefetch": p, "threads": t}, {"mode": "oac", "prefetch": p, "threads": t}]
        out.append({"mode": "oac", "prefetch": "auto", "threads": t})  # the DataLoader's default
    # the staleness rules of async (dgl_oac.staleness) at the target depth: their cost over naive async
    out += [{"mode": f"async-{rule}", "prefetch": args.target_prefetch, "threads": threads[0]}
            for rule in STALENESS_RULES]
    for c in out:
        c["priority"] = first
    out += [{"mode": m, "prefetch": args.target_prefetch, "threads": threads[0], "priority": prio}
            for prio in others for m in ("async", "oac")]
    for c in out:
        c["label"] = label(c["mode"], c["prefetch"], c["threads"],
                           "" if c["priority"] == first else c["priority"])
    return out


def label(mode: str, prefetch: Any, threads: int, priority: str = "") -> str:
    """``oac@4/t2``; ``oac@4/t2/normal`` for a background priority other than the run's first."""
    return (f"{mode}@{prefetch}" if mode.startswith(("async", "oac")) else mode) + f"/t{threads}" + \
        (f"/{priority}" if priority else "")


def workload(args):
    """The synthetic node dataset of the workload ``args`` describe."""
    from dgl_oac.data import load

    return load("synthetic", num_nodes=args.num_nodes, avg_degree=args.avg_degree, power=args.power, task="node",
                seed=args.seed)


def warm_up(ds, args, threads: int) -> None:
    """First-call costs (allocator, DGL kernels, lazy imports) of both code paths, before anything is measured."""
    for m in ("oac", "dgl"):
        run_one(ds, args, {"mode": m, "prefetch": args.target_prefetch, "threads": threads}, 1, 2)


def run_one(ds, args, cfg: Dict[str, Any], warmup: int, steps: int, window: Optional[ContextManager] = None
            ) -> Dict[str, Any]:
    """One configuration's run: ``C.timed_steps`` (``window`` around its timed steps) of a fresh task."""
    from dgl_oac.tasks.common import TrainConfig
    from dgl_oac.tasks.node import NodeTask

    torch.set_num_threads(cfg["threads"])
    torch.manual_seed(args.seed)  # same model initialisation in every configuration
    mode, _, staleness = cfg["mode"].partition("-")  # "async-gap": mode="async", staleness="gap"
    tc = TrainConfig(task="node", dataset="synthetic", mode=mode, staleness=staleness or None,
                     prefetch=cfg["prefetch"], dim=args.dim,
                     hidden=args.hidden, fanouts=args.fanouts, batch_size=args.batch_size,
                     optimizer=args.optimizer, seed=args.seed, device=args.device, progress=False,
                     background_priority=cfg.get("priority", "idle"))
    task = NodeTask(tc, ds)
    if cfg["mode"] == "dgl":
        C.align_dgl_loader(task, args.seed)
    if cfg["prefetch"] == "auto" and not args.quick:  # (a --quick epoch is shorter than the probe)
        warmup = max(warmup, AUTO_WARMUP)
    try:
        res = C.timed_steps(task, warmup, steps, window)
    finally:
        C.release(task)
    res["torch_threads"] = torch.get_num_threads()
    return res


def per_step_ms(run: Dict[str, Any]) -> Dict[str, float]:
    """Milliseconds per step, split by where they were spent (main thread vs background)."""
    n = run["batches"]
    st = run.get("stages", {})
    main = run["main"]
    train = main["step"] - main["sparse_step"] - main["emb_lookup"]
    out = {"step_total": 1e3 * run["wall_s"] / n, "fwd_bwd_dense": 1e3 * train / n,
           "cpu_main": 1e3 * run["cpu_main_s"] / n, "cpu_process": 1e3 * run["cpu_process_s"] / n,
           "sparse_step": 1e3 * main["sparse_step"] / n, "next": 1e3 * main["next"] / n,
           "writeback_bg": 1e3 * run["writeback_busy_s"] / n}
    if st:
        for k, v in st.items():
            out[k] = 1e3 * v / n
    else:  # plain DGL: next() samples, emb(ids) gathers
        out["sample"] = out["next"]
        out["gather"] = 1e3 * main["emb_lookup"] / n
        out["commit"] = out["sparse_step"]
    return out


def summarise(args, cfgs, runs: Dict[str, List[Dict[str, Any]]]) -> Dict[str, Any]:
    summary: Dict[str, Any] = {}
    for c in cfgs:
        rs = runs[c["label"]]
        ms = [per_step_ms(r) for r in rs]
        summary[c["label"]] = {
            **{k: c[k] for k in ("mode", "prefetch", "threads", "priority")},
            "batches_per_s": C.spread([r["batches_per_s"] for r in rs]),
            "rows_per_s": C.spread([r["rows_per_s"] for r in rs]),
            "rows_per_batch": C.median(r["rows_per_batch"] for r in rs),
            "ms_per_step": {k: C.median(m[k] for m in ms) for k in ms[0]},
            "conflict_rate": C.median(r.get("conflict_rate") for r in rs) if c["mode"] == "oac" else None,
            "validate_share": C.median(r["stages"]["validate"] / r["wall_s"] for r in rs) if "stages" in rs[0]
            else None,
        }
        if c["threads"] == 1:  # see cpu_bound_estimate
            summary[c["label"]]["cpu_bound_estimate_batches_per_s"] = C.median(cpu_bound_estimate(r) for r in rs)
    return summary


def cpu_bound_estimate(run: Dict[str, Any]) -> float:
    """Batches/s this run's CPU work allows on an otherwise idle 2-core machine, with torch threads = 1: the
    calling thread's CPU time per step on one core, everything else (gather and write-back threads) on the
    other; the slower of the two bounds the pipeline. A model, not a measurement: it ignores memory-bandwidth
    contention between the cores, and it is only meaningful when the machine is shared (wall times then
    measure the neighbours' load as much as the code)."""
    n = run["batches"]
    main, other = run["cpu_main_s"] / n, max(run["cpu_process_s"] - run["cpu_main_s"], 0.0) / n
    return 1.0 / max(main, other)


def paired(runs, a: str, b: str, key: str = "batches_per_s") -> Dict[str, float]:
    """Per-round ratio a/b (same round = same machine conditions), summarised."""
    return C.spread([x[key] / y[key] for x, y in zip(runs[a], runs[b])])


def ratios(args, runs) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    tp = args.target_prefetch
    t0 = C.int_list(args.threads)[0]
    first, *others = priorities(args)
    for prio in others:  # the same configuration with the background threads at another priority
        for m in ("async", "oac"):
            out[f"{m}@{tp}/t{t0}: {first}/{prio} priority"] = paired(runs, label(m, tp, t0),
                                                                    label(m, tp, t0, prio))
    for rule in STALENESS_RULES:  # what a staleness rule costs over naive async, same depth, same round
        out[f"async-{rule}/async@{tp}/t{t0}"] = paired(runs, label(f"async-{rule}", tp, t0), label("async", tp, t0))
    for t in C.int_list(args.threads):
        depths = C.int_list(args.prefetch) if t == t0 else [tp]
        for p in depths:
            out[f"oac/async@{p}/t{t}"] = paired(runs, label("oac", p, t), label("async", p, t))
        oac = label("oac", tp, t)
        out[f"oac@{tp}/sync/t{t}"] = paired(runs, oac, label("sync", 1, t))
        out[f"oac@{tp}/dgl/t{t}"] = paired(runs, oac, label("dgl", 1, t))
        out[f"async@{tp}/sync/t{t}"] = paired(runs, label("async", tp, t), label("sync", 1, t))
        out[f"sync/dgl/t{t}"] = paired(runs, label("sync", 1, t), label("dgl", 1, t))
        out[f"oac@auto/sync/t{t}"] = paired(runs, label("oac", "auto", t), label("sync", 1, t))
        out[f"oac@auto/dgl/t{t}"] = paired(runs, label("oac", "auto", t), label("dgl", 1, t))
        # oac's own validation work: its validate stage minus async's (which also builds the leaf), per step
        extra = []
        for o, a in zip(runs[oac], runs[label("async", tp, t)]):
            extra.append((o["stages"]["validate"] / o["batches"] - a["stages"]["validate"] / a["batches"])
                         / (o["wall_s"] / o["batches"]))
        out[f"oac_validate_overhead_share@{tp}/t{t}"] = C.spread(extra)
        if t == 1:
            for other in (label("async", tp, t), label("sync", 1, t), label("dgl", 1, t)):
                out[f"cpu-bound estimate: {oac.split('/')[0]}/{other.split('/')[0]}/t1"] = C.spread(
                    [cpu_bound_estimate(x) / cpu_bound_estimate(y) for x, y in zip(runs[oac], runs[other])])
    return out


def targets(args, summary, rat) -> Dict[str, Any]:
    t0 = C.int_list(args.threads)[0]
    tp = args.target_prefetch
    best = {}
    for t in C.int_list(args.threads):  # the best thread setting per mode, as a user would pick it
        for m in ("sync", "dgl", "async", "oac"):
            lab = label(m, tp if m in ("async", "oac") else 1, t)
            v = summary[lab]["batches_per_s"]["median"]
            if m not in best or v > best[m][1]:
                best[m] = (lab, v)
    val_share = summary[label("oac", tp, t0)]["validate_share"]
    res = {
        "oac_vs_async_at_target_prefetch": {"value": rat[f"oac/async@{tp}/t{t0}"]["median"],
                                            "threshold": TARGETS["oac_vs_async_at_target_prefetch"]},
        "oac_vs_sync": {"value": rat[f"oac@{tp}/sync/t{t0}"]["median"], "threshold": TARGETS["oac_vs_sync"]},
        "oac_vs_dgl": {"value": rat[f"oac@{tp}/dgl/t{t0}"]["median"], "threshold": TARGETS["oac_vs_dgl"]},
        "validate_share": {"value": val_share, "threshold": TARGETS["validate_share_max"], "max": True},
        "oac_default_vs_sync": {"value": rat[f"oac@auto/sync/t{t0}"]["median"],
                                "threshold": TARGETS["oac_default_vs_sync"]},
        "oac_default_vs_dgl": {"value": rat[f"oac@auto/dgl/t{t0}"]["median"],
                               "threshold": TARGETS["oac_default_vs_dgl"]},
        "best_thread_setting": {m: {"label": lab, "batches_per_s": v} for m, (lab, v) in best.items()},
        "best_oac_vs_best_sync": best["oac"][1] / best["sync"][1],
        "best_oac_vs_best_dgl": best["oac"][1] / best["dgl"][1],
        "best_oac_vs_best_async": best["oac"][1] / best["async"][1],
    }
    for k, v in res.items():
        if isinstance(v, dict) and "threshold" in v:
            v["met"] = bool(v["value"] <= v["threshold"]) if v.get("max") else bool(v["value"] >= v["threshold"])
    return res


def plot(args, cfgs, summary, rat, png: Path) -> None:
    plt = C.pyplot()
    colors = {"sync": "tab:blue", "dgl": "tab:gray", "async": "tab:orange", "oac": "tab:green",
              "async-gap": "tab:brown", "async-lookahead": "tab:pink"}
    t0 = C.int_list(args.threads)[0]
    fig, axes = plt.subplots(1, 3, figsize=(17, 4.8))
    # (1) throughput per configuration
    ax = axes[0]
    labs = [c["label"] for c in cfgs]
    med = [summary[lb]["batches_per_s"]["median"] for lb in labs]
    lo = [m - summary[lb]["batches_per_s"]["min"] for m, lb in zip(med, labs)]
    hi = [summary[lb]["batches_per_s"]["max"] - m for m, lb in zip(med, labs)]
    ax.bar(range(len(labs)), med, yerr=[lo, hi], color=[colors[summary[lb]["mode"]] for lb in labs], capsize=2)
    ax.set_xticks(range(len(labs)), labs, rotation=70, fontsize=7)
    ax.set_ylabel("batches / s (median, min-max over rounds)")
    ax.set_title("throughput, same batches")
    # (2) per-step breakdown at the target depth
    ax = axes[1]
    tp = args.target_prefetch
    shown = [label(m, tp if m in ("async", "oac") else 1, t0) for m in ("dgl", "sync", "async", "oac")]
    parts = ["sample", "gather", "wait", "validate", "fwd_bwd_dense", "commit"]
    bottom = [0.0] * len(shown)
    for part in parts:
        vals = [summary[lb]["ms_per_step"].get(part, 0.0) if not (part == "gather" and summary[lb]["mode"] in
                ("async", "oac")) else 0.0 for lb in shown]
        ax.bar(range(len(shown)), vals, bottom=bottom, label=part)
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax.plot(range(len(shown)), [summary[lb]["ms_per_step"]["step_total"] for lb in shown], "k_", ms=30,
            mew=2, label="wall / step")
    ax.set_xticks(range(len(shown)), shown, fontsize=8)
    ax.set_ylabel("ms per step on the caller's thread")
    ax.set_title("where a step goes (gather of async/oac runs in the background)", fontsize=9)
    ax.set_ylim(0, 1.35 * max(max(bottom), max(summary[lb]["ms_per_step"]["step_total"] for lb in shown)))
    ax.legend(fontsize=7, ncol=4, loc="upper center")
    # (3) oac vs async and conflict rate vs depth
    ax = axes[2]
    depths = C.int_list(args.prefetch)
    ax.plot(depths, [rat[f"oac/async@{p}/t{t0}"]["median"] for p in depths], "o-", color="tab:green",
            label="oac / async (batches/s)")
    ax.axhline(TARGETS["oac_vs_async_at_target_prefetch"], color="tab:green", ls=":", lw=1)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("prefetch depth")
    ax.set_ylabel("ratio")
    ax2 = ax.twinx()
    ax2.plot(depths, [summary[label("oac", p, t0)]["conflict_rate"] for p in depths], "s--", color="tab:red",
             label="conflict rate (oac)")
    ax2.set_ylabel("conflict rate", color="tab:red")
    ax.legend(loc="lower left", fontsize=8)
    ax2.legend(loc="lower right", fontsize=8)
    ax.set_title(f"prefetch sweep (torch threads {t0})")
    fig.suptitle(f"dgl-oac modes: {args.num_nodes:,} nodes, dim {args.dim}, fanouts {args.fanouts}, batch "
                 f"{args.batch_size}, {args.optimizer}", fontsize=10)
    C.save_figure(fig, png)


def main(argv: List[str] = None) -> Dict[str, Any]:
    args = parse(argv)
    env = C.environment()
    t = time.perf_counter()
    ds = workload(args)
    gen_s = time.perf_counter() - t
    cfgs = configs(args)
    warm_up(ds, args, C.int_list(args.threads)[0])
    runs: Dict[str, List[Dict[str, Any]]] = {c["label"]: [] for c in cfgs}
    order = []
    bar = tqdm(total=args.rounds * len(cfgs), desc="bench_modes", disable=not args.progress, dynamic_ncols=True)
    for r in range(args.rounds):
        for c in C.rotated(cfgs, r):
            bar.set_postfix_str(c["label"])
            res = run_one(ds, args, c, args.warmup, args.steps)
            res["round"] = r
            runs[c["label"]].append(res)
            order.append(c["label"])
            bar.update()
    bar.close()
    torch.set_num_threads(env["torch_threads_default"])
    summary = summarise(args, cfgs, runs)
    rat = ratios(args, runs)
    tgt = targets(args, summary, rat)
    result = {"benchmark": NAME, "env": env, "args": vars(args),
              "workload": {"dataset": "synthetic", "nodes": ds.graph.num_nodes(), "edges": ds.graph.num_edges(),
                           "train_nodes": int(ds.train_idx.numel()), "generate_s": gen_s,
                           "row_floats": args.dim + {"adam": 2 * args.dim + 1, "adagrad": args.dim}[args.optimizer]},
              "configs": cfgs, "run_order": order, "runs": runs, "summary": summary, "ratios": rat,
              "targets": tgt}
    return C.publish(args, NAME, result, lambda png: plot(args, cfgs, summary, rat, png),
                     lambda: report(args, cfgs, summary, rat, tgt))


def report(args, cfgs, summary, rat, tgt) -> None:
    rows = []
    for c in cfgs:
        s = summary[c["label"]]
        ms = s["ms_per_step"]
        rows.append([c["label"], s["batches_per_s"]["median"], s["rows_per_s"]["median"], ms["step_total"],
                     ms.get("sample", 0), ms.get("gather", 0), ms.get("wait", 0), ms.get("validate", 0),
                     ms["fwd_bwd_dense"], ms.get("commit", 0), ms["writeback_bg"],
                     "-" if s["conflict_rate"] is None else f"{s['conflict_rate']:.3f}",
                     "-" if s["validate_share"] is None else f"{100 * s['validate_share']:.1f}%",
                     ms["cpu_main"], ms["cpu_process"]])
    C.print_table("per configuration (medians over rounds; ms per step; cpu = CPU ms per step of the calling "
                  "thread / of the process)",
                  ["config", "batch/s", "rows/s", "step", "sample", "gather", "wait", "validate", "fwd+bwd",
                   "commit", "wb(bg)", "conflict", "validate%", "cpu main", "cpu all"], rows)
    est = [[lab, s["cpu_bound_estimate_batches_per_s"], s["ms_per_step"]["cpu_main"],
            s["ms_per_step"]["cpu_process"] - s["ms_per_step"]["cpu_main"]]
           for lab, s in summary.items() if "cpu_bound_estimate_batches_per_s" in s]
    if est:
        C.print_table("CPU-bound estimate for an idle 2-core machine (torch threads 1): 1 / max(caller CPU, "
                      "other threads' CPU) per step", ["config", "est. batch/s", "caller cpu ms", "others cpu ms"],
                      est)
    C.print_table("ratios of batches/s within a round (median [min, max])", ["ratio", "median", "min", "max"],
                  [[k, v["median"], v["min"], v["max"]] for k, v in rat.items()])
    C.print_table("targets", ["target", "value", "threshold", "met"],
                  [[k, v["value"], ("<= " if v.get("max") else ">= ") + str(v["threshold"]), v["met"]]
                   for k, v in tgt.items() if isinstance(v, dict) and "threshold" in v])


if __name__ == "__main__":
    main()
