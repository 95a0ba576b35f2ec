"""Throughput of sync vs async vs oac (and plain DGL, and the device-resident table) on the SAME batches,
side by side, in one run.

Workloads (``--workload``, default all; ``benchmarks/_workloads.py``): synthetic power-law graphs (300k nodes,
average degree 10, exponent 2.1) under node classification (GraphSAGE), link prediction (GraphSAGE, shared
negatives) and KG embedding (ComplEx); SGD, Adagrad and Adam rows; dims 32 to 256; one workload
(``node-sgd-32-model``) whose step is dominated by the model rather than the rows. Each workload is measured
on its own (its configurations interleaved), one after the other; the JSON holds one section per workload.

Every configuration builds the same task from the same seed and trains the same batches: the dgl-oac modes
share one batch stream (a function of the seed); the plain-DGL baseline (``dgl.nn.NodeEmbedding`` +
``dgl.optim.SparseAdam`` + ``dgl.dataloading.DataLoader``, same model) gets the same seed nodes per batch (its
neighbour samples come from DGL's own RNG). Each run warms up, then times ``--steps`` batches (write-back
flushed inside the window). Rounds interleave all configurations in a rotated order; ratios are taken within a
round and summarised by their median over rounds.

``resident`` (:mod:`_resident`) is the ceiling: the same task with the whole table and its optimizer state on the
compute device, the same row kernels, no pipeline (on the CPU: sync's table in place, without copies).

A fair race: every configuration of a run gets the same warm-up, past ``prefetch="auto"``'s probe when an auto
configuration is in the run; on CUDA the device is synchronized before each timed window starts and before its
clock stops; no step reads its loss on the host (:meth:`dgl_oac.app.tasks.base.Task.optimize`); every mode
copies its new rows back through the same pinned path (:mod:`dgl_oac.engine.table`). On CUDA each step's
time on the compute stream is measured too (``device_step``, CUDA events), for the cost model.

Reported per configuration: batches/s, rows/s, per-step stage milliseconds (``loader.stats``: sample, gather,
copy, wait, validate, commit; write-back busy time; and the training step itself), conflict rate (oac), the
ratios oac/async at every prefetch depth, oac/sync, oac/dgl, oac/resident, and validate time as a share of a
step. The
background threads run at the DataLoader's default priority (``auto``: idle while the cores are ours); async and
oac at the target depth also run at ``normal`` priority, interleaved with the rest, for the ratio auto/normal. Async
with each staleness rule (``async-gap``, ``async-lookahead``: :mod:`dgl_oac.baselines.staleness`) runs at the target
depth, for its cost over
async.

    python benchmarks/bench_modes.py                          # every workload, full size (see RESULTS.md)
    python benchmarks/bench_modes.py --workload node-adam-128  # one workload
    python benchmarks/bench_modes.py --quick                  # smoke run, about a minute
    python benchmarks/bench_modes.py --device cuda --modes sync,async,oac,resident --stream out/bench_modes.jsonl

``--modes`` keeps some modes only (ratios and targets that need a missing one are left out); ``--stream PATH``
appends one JSON line per finished run (configuration and round), per workload and at the end, each flushed to
disk at once, so a run that is killed keeps what it measured (``pipeline_model.py`` reads such a file too).
"""
from __future__ import annotations

import copy
import os
import sys
import time
from pathlib import Path
from typing import Any, ContextManager, Dict, List, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _omp  # noqa: E402,F401  (OMP_WAIT_POLICY must be set before torch loads)
import torch  # noqa: E402
from tqdm.auto import tqdm  # noqa: E402

import _common as C  # noqa: E402
import _workloads as W  # noqa: E402
from dgl_oac.config import PRIORITIES  # noqa: E402

NAME = "bench_modes"
TARGETS = {"oac_vs_async_at_target_prefetch": 0.95, "oac_vs_sync": 1.3, "oac_vs_dgl": 1.3,
           "validate_share_max": 0.05, "oac_default_vs_sync": 1.0, "oac_default_vs_dgl": 1.5}
STALENESS_RULES = ("gap", "lookahead")  # async with a staleness rule (DataLoader(staleness=...)), at the target depth
AUTO_WARMUP = 72  # prefetch="auto" probes its depths over its first 64 batches: time the steady state after
#: every mode a run can hold (--modes); "dgl" is plain DGL, "resident" the device-resident ceiling (_resident.py)
MODES = ("sync", "dgl", "resident", "async", "oac") + tuple(f"async-{rule}" for rule in STALENESS_RULES)
WARM_UP_NODES = 300_000  # the largest graph a workload's warm-up runs on (the default workloads' size)


def parse(argv: List[str] = None):
    p = C.base_parser(__doc__.split("\n\n")[0], NAME)
    p.add_argument("--workload", default="all", help=f"'all' or comma-separated names: {', '.join(W.WORKLOADS)}")
    p.add_argument("--num-nodes", type=int, default=None, help="graph size of every workload (default: 300k)")
    p.add_argument("--avg-degree", type=float, default=None,
                   help=f"average degree of every workload's graph (default: the workload's, else {W.AVG_DEGREE})")
    p.add_argument("--power", type=float, default=2.1, help="degree exponent of the synthetic graph")
    p.add_argument("--prefetch", default="1,2,4,8", help="prefetch depths for async and oac")
    p.add_argument("--target-prefetch", type=int, default=4, help="depth at which oac is compared with the rest")
    p.add_argument("--num-workers", default="0",
                   help="sampling worker processes of the dgl-oac loaders (plain DGL samples on its caller): the "
                        "first for every configuration; each further count adds sync, oac at --target-prefetch and "
                        "oac@auto with that many workers at the first thread count and priority")
    p.add_argument("--threads", default="2,1",
                   help="torch intra-op thread counts; the first gets the full prefetch sweep, the others only "
                        "sync, dgl, async and oac at --target-prefetch")
    p.add_argument("--device", default="cpu",
                   help="compute device of every configuration: cpu, cuda or cuda:N (the tables stay in CPU memory)")
    p.add_argument("--priorities", default="auto,normal",
                   help="background-thread priorities (DataLoader background_priority); the first gets every "
                        "configuration, the others only async and oac at --target-prefetch and the first thread "
                        "count")
    p.add_argument("--warmup", type=int, default=30,
                   help="untimed steps before each timed window (first touches of oac's write-log ring and of the "
                        "row-buffer pools page-fault): the timed window measures the steady state")
    p.add_argument("--steps", type=int, default=24, help="timed steps per run")
    p.add_argument("--rounds", default="3",
                   help="interleaved repetitions of every configuration: one count, or one per --workload in its "
                        "order (a GPU-sized workload's table takes seconds to build for every run)")
    p.add_argument("--modes", default=",".join(MODES),
                   help=f"comma-separated modes to run, of {', '.join(MODES)}")
    p.add_argument("--stream", default=None,
                   help="append a JSON line per finished run (and per workload) to this file, flushed at once")
    p.add_argument("--no-dgl", dest="dgl", action="store_false",
                   help="leave out the plain-DGL baseline: on a GPU it needs DGL's CUDA build (PyPI's DGL is a CPU "
                        "build and cannot move a batch's graphs to the device); its ratios are then absent")
    args = p.parse_args(argv)
    if args.quick:  # graph and batch sizes: _workloads.QUICK
        args.prefetch, args.target_prefetch, args.threads, args.priorities = "4", 4, "2", "auto"
        args.warmup, args.steps, args.rounds = 1, 3, "1"
    try:
        args.workloads = W.names(args.workload, args.device, args.quick)
    except ValueError as exc:
        p.error(str(exc))
    try:
        rounds = C.int_list(args.rounds)
    except ValueError:
        rounds = []
    if len(rounds) not in (1, len(args.workloads)) or min(rounds, default=0) < 1:
        p.error(f"--rounds {args.rounds!r}: one positive count, or one per workload ({len(args.workloads)})")
    args.rounds_of = dict(zip(args.workloads, rounds * len(args.workloads) if len(rounds) == 1 else rounds))
    args.modes = C.str_list(args.modes)
    unknown = [m for m in args.modes if m not in MODES]
    if unknown or not args.modes:
        p.error(f"--modes: unknown {unknown or args.modes!r}; expected some of {', '.join(MODES)}")
    args.dgl = args.dgl and "dgl" in args.modes
    if any(x not in PRIORITIES for x in priorities(args)) or not priorities(args):
        p.error(f"--priorities takes some of {', '.join(PRIORITIES)}")
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
        out += [{"mode": "sync", "prefetch": 1, "threads": t}] + \
            ([{"mode": "dgl", "prefetch": 1, "threads": t}] if args.dgl else []) + \
            [{"mode": "resident", "prefetch": 1, "threads": t},
             {"mode": "oac", "prefetch": "auto", "threads": t}]  # the DataLoader's default
        for p in (C.int_list(args.prefetch) if i == 0 else [args.target_prefetch]):
            out += [{"mode": "async", "prefetch": p, "threads": t}, {"mode": "oac", "prefetch": p, "threads": t}]
    # sync on one thread: the work a step is, for work_ceiling (the CPU's cores bound a CPU run only)
    if 1 not in threads and str(args.device).split(":")[0] == "cpu":
        out.append({"mode": "sync", "prefetch": 1, "threads": 1})
    # the staleness rules of async (dgl_oac.baselines.staleness) at the target depth: their cost over naive async
    out += [{"mode": f"async-{rule}", "prefetch": args.target_prefetch, "threads": threads[0]}
            for rule in STALENESS_RULES]
    for c in out:
        c["priority"] = first
    out += [{"mode": m, "prefetch": args.target_prefetch, "threads": threads[0], "priority": prio}
            for prio in others for m in ("async", "oac")]
    w0, *more = C.int_list(args.num_workers)
    for c in out:
        c["workers"] = w0
    out += [{"mode": m, "prefetch": p, "threads": threads[0], "priority": first, "workers": n}
            for n in more for m, p in (("sync", 1), ("oac", args.target_prefetch), ("oac", "auto"))]
    modes = getattr(args, "modes", MODES)
    out = [c for c in out if c["mode"] in modes]
    for c in out:
        c["label"] = label(c["mode"], c["prefetch"], c["threads"], "" if c["priority"] == first else c["priority"],
                           c["workers"] if c["workers"] != w0 else None)
    return out


def label(mode: str, prefetch: Any, threads: int, priority: str = "", workers: Optional[int] = None) -> str:
    """``oac@4/t2``; ``oac@4/t2/normal`` for a background priority other than the run's first; ``oac@4/t2/w1``
    for a sampling worker count other than the run's first."""
    return (f"{mode}@{prefetch}" if mode.startswith(("async", "oac")) else mode) + f"/t{threads}" + \
        (f"/{priority}" if priority else "") + (f"/w{workers}" if workers is not None else "")


def workload(w):
    """The synthetic dataset of workload ``w`` (:func:`_workloads.settings`)."""
    return W.dataset(w)


def warm_up(ds, w, threads: int, dgl: bool = True) -> None:
    """First-call costs (allocator, DGL kernels, lazy imports) of both code paths, before anything is measured.
    A workload larger than :data:`WARM_UP_NODES` warms up on a graph of that size: the first calls are the same,
    and a GPU-sized table takes seconds to build."""
    if w.num_nodes > WARM_UP_NODES:
        w = copy.copy(w)
        w.num_nodes = WARM_UP_NODES
        ds = workload(w)
    for m in ("oac", "dgl") if dgl else ("oac",):
        run_one(ds, w, {"mode": m, "prefetch": w.target_prefetch, "threads": threads}, 1, 2)


def run_one(ds, w, cfg: Dict[str, Any], warmup: int, steps: int, window: Optional[ContextManager] = None
            ) -> Dict[str, Any]:
    """One configuration's run of workload ``w``: ``C.timed_steps`` (``window`` around its timed steps) of a
    fresh task."""
    torch.set_num_threads(cfg["threads"])
    torch.manual_seed(w.seed)  # same model initialisation in every configuration
    task = W.build_task(w, ds, cfg["mode"], cfg["prefetch"], cfg.get("priority", "auto"), cfg.get("workers", 0))
    if cfg["mode"] == "dgl":
        C.align_dgl_loader(task, w.seed)
    if cfg["prefetch"] == "auto" and not w.quick:  # (a --quick epoch is shorter than the probe)
        warmup = max(warmup, AUTO_WARMUP)
    if warmup + steps > len(task.loader):
        C.release(task)
        raise ValueError(f"workload {w.name}: {warmup} warm-up + {steps} timed steps need more batches than its "
                         f"epoch has ({len(task.loader)}): lower --steps/--warmup or raise --num-nodes")
    try:
        res = C.timed_steps(task, warmup, steps, window)
    finally:
        C.release(task)
    res["torch_threads"] = torch.get_num_threads()
    return res


def per_step_ms(run: Dict[str, Any], mode: str = "") -> Dict[str, float]:
    """Milliseconds per step, split by where they were spent (main thread vs background). ``resident``: its
    gather is the table read in ``emb(ids)``, its commit the sparse step (its loader has no tables)."""
    n = run["batches"]
    st = run.get("stages", {})
    main = run["main"]
    train = main["step"] - main["sparse_step"] - main["emb_lookup"]
    out = {"step_total": 1e3 * run["wall_s"] / n, "fwd_bwd_dense": 1e3 * train / n,
           "cpu_main": 1e3 * run["cpu_main_s"] / n, "cpu_process": 1e3 * run["cpu_process_s"] / n,
           "sparse_step": 1e3 * main["sparse_step"] / n, "next": 1e3 * main["next"] / n,
           "writeback_bg": 1e3 * run["writeback_busy_s"] / n}
    if "device_step_s" in run:  # CUDA: the step's time on the compute stream
        out["device_step"] = 1e3 * run["device_step_s"] / n
    if st:
        for k, v in st.items():
            out[k] = 1e3 * v / n
        if mode == "resident":
            out["gather"], out["commit"] = 1e3 * main["emb_lookup"] / n, out["sparse_step"]
    else:  # plain DGL: next() samples, emb(ids) gathers
        out["sample"] = out["next"]
        out["gather"] = 1e3 * main["emb_lookup"] / n
        out["commit"] = out["sparse_step"]
    return out


def summarise(args, cfgs, runs: Dict[str, List[Dict[str, Any]]]) -> Dict[str, Any]:
    summary: Dict[str, Any] = {}
    for c in cfgs:
        rs = runs[c["label"]]
        ms = [per_step_ms(r, c["mode"]) for r in rs]
        summary[c["label"]] = {
            **{k: c[k] for k in ("mode", "prefetch", "threads", "priority", "workers")},
            "batches_per_s": C.spread([r["batches_per_s"] for r in rs]),
            "rows_per_s": C.spread([r["rows_per_s"] for r in rs]),
            "rows_per_batch": C.median(r["rows_per_batch"] for r in rs),
            "ms_per_step": {k: C.median(m[k] for m in ms) for k in ms[0]},
            "conflict_rate": C.median(r.get("conflict_rate") for r in rs) if c["mode"] == "oac" else None,
            "background_threads": max((r.get("background_threads", 0) for r in rs), default=0),
            "validate_share": C.median(r["stages"]["validate"] / r["wall_s"] for r in rs) if "stages" in rs[0]
            else None,
        }
        if c["threads"] == 1:  # see cpu_bound_estimate
            summary[c["label"]]["cpu_bound_estimate_batches_per_s"] = C.median(cpu_bound_estimate(r) for r in rs)
    return summary


def cores() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def work_ceiling(summary: Dict[str, Any], t0: int) -> Optional[Dict[str, float]]:
    """The most batches/s ANY schedule of this workload can reach on this machine's cores, from the work a step is:
    sync's CPU ms per step with one torch thread (no OpenMP team, so no spin-wait counted as work: the caller's
    sampling, gather, model, row kernel and write, one core) spread perfectly over every core. oac does all of that
    work and more (validation, the write log), at every depth, so it cannot beat ``cores / work``; nor can it beat
    plain DGL by more than ``ceiling / DGL``. A bound, not a prediction: it assumes a perfectly parallel step with
    no memory-bandwidth contention. None without a ``sync/t1`` run (``--threads`` must include 1)."""
    one = summary.get(label("sync", 1, 1))
    if one is None or t0 == 1:
        return None
    work_ms = one["ms_per_step"]["cpu_process"]
    ceiling = 1000.0 * cores() / work_ms
    out = {"cores": cores(), "sync_t1_work_ms": work_ms, "batches_per_s": ceiling,
           "vs_sync": ceiling / summary[label("sync", 1, t0)]["batches_per_s"]["median"]}
    if label("dgl", 1, t0) in summary:
        out["vs_dgl"] = ceiling / summary[label("dgl", 1, t0)]["batches_per_s"]["median"]
    return out


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
    """Per-round ratios of batches/s between configurations, each where both ran (``--modes``, ``--no-dgl``)."""
    out: Dict[str, Any] = {}

    def pair(key: str, a: str, b: str) -> None:
        if runs.get(a) and runs.get(b):
            out[key] = paired(runs, a, b)

    tp = args.target_prefetch
    t0 = C.int_list(args.threads)[0]
    first, *others = priorities(args)
    for prio in others:  # the same configuration with the background threads at another priority
        for m in ("async", "oac"):
            pair(f"{m}@{tp}/t{t0}: {first}/{prio} priority", label(m, tp, t0), label(m, tp, t0, prio))
    w0, *more = C.int_list(args.num_workers)
    for n in more:  # the same configuration sampling in n worker processes
        for m, p in (("sync", 1), ("oac", tp), ("oac", "auto")):
            pair(f"{label(m, p, t0)}: w{n}/w{w0}", label(m, p, t0, "", n), label(m, p, t0))
        pair(f"oac@auto/t{t0}/w{n} / sync/t{t0}/w{w0}", label("oac", "auto", t0, "", n), label("sync", 1, t0))
    for rule in STALENESS_RULES:  # what a staleness rule costs over naive async, same depth, same round
        pair(f"async-{rule}/async@{tp}/t{t0}", label(f"async-{rule}", tp, t0), label("async", tp, t0))
    for t in C.int_list(args.threads):
        depths = C.int_list(args.prefetch) if t == t0 else [tp]
        for p in depths:
            pair(f"oac/async@{p}/t{t}", label("oac", p, t), label("async", p, t))
        oac = label("oac", tp, t)
        for base in ("sync", "dgl", "resident"):  # oac at the target depth and at auto, against each baseline
            pair(f"oac@{tp}/{base}/t{t}", oac, label(base, 1, t))
            pair(f"oac@auto/{base}/t{t}", label("oac", "auto", t), label(base, 1, t))
        pair(f"async@{tp}/sync/t{t}", label("async", tp, t), label("sync", 1, t))
        pair(f"sync/dgl/t{t}", label("sync", 1, t), label("dgl", 1, t))
        pair(f"sync/resident/t{t}", label("sync", 1, t), label("resident", 1, t))
        if runs.get(oac) and runs.get(label("async", tp, t)):
            # oac's own validation work: its validate stage minus async's (which also builds the leaf), per step
            extra = [(o["stages"]["validate"] / o["batches"] - a["stages"]["validate"] / a["batches"])
                     / (o["wall_s"] / o["batches"]) for o, a in zip(runs[oac], runs[label("async", tp, t)])]
            out[f"oac_validate_overhead_share@{tp}/t{t}"] = C.spread(extra)
        if t == 1 and runs.get(oac):
            for other in [x for x in (label("async", tp, t), label("sync", 1, t), label("dgl", 1, t)) if runs.get(x)]:
                out[f"cpu-bound estimate: {oac.split('/')[0]}/{other.split('/')[0]}/t1"] = C.spread(
                    [cpu_bound_estimate(x) / cpu_bound_estimate(y) for x, y in zip(runs[oac], runs[other])])
    return out


def _target(rat: Dict[str, Any], key: str, name: str) -> Optional[Dict[str, Any]]:
    """``{"value", "threshold"}`` of target ``name`` from ratio ``key``, None where the ratio was not measured."""
    return {"value": rat[key]["median"], "threshold": TARGETS[name]} if key in rat else None


def targets(args, summary, rat) -> Dict[str, Any]:
    """The issue's targets on this workload, each where its configurations ran; the best thread setting per
    mode; the work ceiling."""
    t0 = C.int_list(args.threads)[0]
    tp = args.target_prefetch
    best = {}
    for t in C.int_list(args.threads):  # the best thread setting per mode, as a user would pick it
        for m in ("sync", "dgl", "async", "oac", "resident"):
            lab = label(m, tp if m in ("async", "oac") else 1, t)
            if lab not in summary:  # --no-dgl, --modes
                continue
            v = summary[lab]["batches_per_s"]["median"]
            if m not in best or v > best[m][1]:
                best[m] = (lab, v)
    res: Dict[str, Any] = {
        "oac_vs_async_at_target_prefetch": _target(rat, f"oac/async@{tp}/t{t0}", "oac_vs_async_at_target_prefetch"),
        "oac_vs_sync": _target(rat, f"oac@{tp}/sync/t{t0}", "oac_vs_sync"),
        "oac_default_vs_sync": _target(rat, f"oac@auto/sync/t{t0}", "oac_default_vs_sync"),
        "oac_vs_dgl": _target(rat, f"oac@{tp}/dgl/t{t0}", "oac_vs_dgl"),
        "oac_default_vs_dgl": _target(rat, f"oac@auto/dgl/t{t0}", "oac_default_vs_dgl"),
        "best_thread_setting": {m: {"label": lab, "batches_per_s": v} for m, (lab, v) in best.items()},
    }
    if label("oac", tp, t0) in summary:
        res["validate_share"] = {"value": summary[label("oac", tp, t0)]["validate_share"],
                                 "threshold": TARGETS["validate_share_max"], "max": True}
    for other in ("sync", "async", "dgl", "resident"):
        if "oac" in best and other in best:
            res[f"best_oac_vs_best_{other}"] = best["oac"][1] / best[other][1]
    res = {k: v for k, v in res.items() if v is not None}
    ceiling = work_ceiling(summary, t0)
    if ceiling is not None:
        res["work_ceiling"] = ceiling
        if "vs_dgl" in ceiling and "oac_default_vs_dgl" in res:
            res["oac_default_vs_dgl"]["ceiling"] = ceiling["vs_dgl"]
        if "oac_default_vs_sync" in res:
            res["oac_default_vs_sync"]["ceiling"] = ceiling["vs_sync"]
    for k, v in res.items():
        if isinstance(v, dict) and "threshold" in v:
            v["met"] = bool(v["value"] <= v["threshold"]) if v.get("max") else bool(v["value"] >= v["threshold"])
    return res


def plot(args, sections: Dict[str, Dict[str, Any]], png: Path) -> None:
    """One row of panels per workload."""
    plt = C.pyplot()
    fig, axes = plt.subplots(len(sections), 3, figsize=(17, 4.8 * len(sections)), squeeze=False)
    for row, (name, sec) in zip(axes, sections.items()):
        plot_workload(args, sec, row)
    C.save_figure(fig, png)


def plot_workload(args, sec: Dict[str, Any], axes) -> None:
    cfgs, summary, rat, w = sec["configs"], sec["summary"], sec["ratios"], sec["workload"]
    colors = {"sync": "tab:blue", "dgl": "tab:gray", "async": "tab:orange", "oac": "tab:green",
              "async-gap": "tab:brown", "async-lookahead": "tab:pink", "resident": "tab:purple"}
    t0 = C.int_list(args.threads)[0]
    # (1) throughput per configuration
    ax = axes[0]
    labs = [c["label"] for c in cfgs]
    med = [summary[lb]["batches_per_s"]["median"] for lb in labs]
    lo = [m - summary[lb]["batches_per_s"]["min"] for m, lb in zip(med, labs)]
    hi = [summary[lb]["batches_per_s"]["max"] - m for m, lb in zip(med, labs)]
    ax.bar(range(len(labs)), med, yerr=[lo, hi], color=[colors[summary[lb]["mode"]] for lb in labs], capsize=2)
    ax.set_xticks(range(len(labs)), labs, rotation=70, fontsize=7)
    ax.set_ylabel("batches / s (median, min-max over rounds)")
    ax.set_title(f"{w['name']}: {w['nodes']:,} nodes, dim {w['dim']}, {w['optimizer']}, batch "
                 f"{w['batch_size']}: throughput, same batches", fontsize=9)
    # (2) per-step breakdown at the target depth
    ax = axes[1]
    tp = args.target_prefetch
    shown = [lb for lb in (label(m, tp if m in ("async", "oac") else 1, t0)
                           for m in ("dgl", "sync", "async", "oac", "resident")) if lb in summary]
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
    ax.set_ylim(0, 1.35 * max([*bottom, *(summary[lb]["ms_per_step"]["step_total"] for lb in shown), 1e-3]))
    ax.legend(fontsize=7, ncol=4, loc="upper center")
    # (3) oac vs async and conflict rate vs depth (the depths where both ran)
    ax = axes[2]
    depths = [p for p in C.int_list(args.prefetch) if f"oac/async@{p}/t{t0}" in rat]
    if not depths:
        ax.text(0.5, 0.5, "no async and oac pair in --modes", ha="center", va="center", transform=ax.transAxes)
        return
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


def main(argv: List[str] = None) -> Dict[str, Any]:
    args = parse(argv)
    env = C.environment()
    cfgs = configs(args)
    stream = None if args.stream is None else C.JsonLines(args.stream)
    if stream is not None:
        stream.append({"kind": "start", "benchmark": NAME, "env": env, "args": vars(args)})
    sections = {name: measure(args, W.settings(args, name), cfgs, stream) for name in args.workloads}
    torch.set_num_threads(env["torch_threads_default"])
    result = {"benchmark": NAME, "env": env, "args": vars(args), "workloads": sections,
              "targets": {name: sec["targets"] for name, sec in sections.items()}}
    out = C.publish(args, NAME, result, lambda png: plot(args, sections, png), lambda: report(args, sections))
    if stream is not None:
        stream.append({"kind": "end", "out": str(C.out_path(args, NAME))})
    return out


def steady_warmup(args, cfgs: List[Dict[str, Any]]) -> int:
    """The warm-up steps of EVERY configuration of a run: ``--warmup``, raised past ``prefetch="auto"``'s probe
    when the run has an auto configuration (so every mode is timed at the same point of its epoch)."""
    auto = any(c["prefetch"] == "auto" for c in cfgs)
    return max(args.warmup, AUTO_WARMUP) if auto and not args.quick else args.warmup


def measure(args, w, cfgs: List[Dict[str, Any]], stream: Optional[C.JsonLines] = None) -> Dict[str, Any]:
    """Every configuration of workload ``w``, ``args.rounds_of[w.name]`` interleaved rounds: its section of the
    JSON (each run, then the section less its runs, appended to ``stream`` as it finishes)."""
    t = time.perf_counter()
    ds = workload(w)
    gen_s = time.perf_counter() - t
    warm_up(ds, w, C.int_list(args.threads)[0], args.dgl)
    warmup = steady_warmup(args, cfgs)
    runs: Dict[str, List[Dict[str, Any]]] = {c["label"]: [] for c in cfgs}
    order = []
    rounds = args.rounds_of[w.name]
    bar = tqdm(total=rounds * len(cfgs), desc=f"bench_modes {w.name}", disable=not args.progress,
               dynamic_ncols=True)
    for r in range(rounds):
        for c in C.rotated(cfgs, r):
            bar.set_postfix_str(c["label"])
            try:
                res = run_one(ds, w, c, warmup, args.steps)
            except BaseException as exc:  # recorded before it ends the run
                if stream is not None:
                    stream.append({"kind": "error", "workload": w.name, **c, "round": r, "error": repr(exc)})
                raise
            res["round"] = r
            runs[c["label"]].append(res)
            order.append(c["label"])
            if stream is not None:
                stream.append({"kind": "run", "workload": w.name, **c, "steps": res["batches"],
                               "seconds": res["wall_s"], "steps_per_s": res["batches_per_s"], "warmup": warmup,
                               **res})
            bar.update()
    bar.close()
    summary = summarise(args, cfgs, runs)
    rat = ratios(args, runs)
    info = {"name": w.name, "task": w.task, "model": w.model, "optimizer": w.optimizer, "dim": w.dim,
            "hidden": w.hidden, "fanouts": w.fanouts, "batch_size": w.batch_size, "negatives": w.negatives,
            "nodes": ds.graph.num_nodes(), "edges": ds.graph.num_edges(), "generate_s": gen_s,
            "row_floats": W.row_floats(w.optimizer, w.dim), "warmup": warmup, "device": str(w.device)}
    section = {"workload": info, "configs": cfgs, "run_order": order, "runs": runs, "summary": summary,
               "ratios": rat, "targets": targets(args, summary, rat)}
    if stream is not None:
        stream.append({"kind": "workload", "name": w.name, "target_prefetch": args.target_prefetch,
                       **{k: v for k, v in section.items() if k != "runs"}})
    return section


def report(args, sections: Dict[str, Dict[str, Any]]) -> None:
    for name, sec in sections.items():
        print(f"\n=== workload {name} ===")
        report_workload(sec["configs"], sec["summary"], sec["ratios"], sec["targets"])
    t0, tp = C.int_list(args.threads)[0], args.target_prefetch
    rows = []
    for name, sec in sections.items():
        rat, tgt = sec["ratios"], sec["targets"]
        ms = sec["summary"].get(label("sync", 1, t0), {}).get("ms_per_step")
        ceil = tgt.get("work_ceiling") or {}
        rows.append([name, *(rat.get(f"oac@{p}/{base}/t{t0}", {}).get("median", "-")
                             for p in ("auto", tp) for base in ("sync", "dgl", "resident")),
                     tgt.get("validate_share", {}).get("value", "-"),
                     ms["fwd_bwd_dense"] / ms["step_total"] if ms else "-",
                     ceil.get("vs_sync", "-"), ceil.get("vs_dgl", "-")])
    C.print_table(f"every workload (medians over rounds, torch threads {t0}; @{tp} = --target-prefetch; "
                  f"resident = the table on the compute device, the ceiling; model share = sync's fwd+bwd / its "
                  f"step; ceiling = the most any schedule can reach on {cores()} cores, from sync's one-thread "
                  f"work per step: see work_ceiling)",
                  ["workload", "oac@auto/sync", "oac@auto/dgl", "oac@auto/resident", f"oac@{tp}/sync",
                   f"oac@{tp}/dgl", f"oac@{tp}/resident", "validate share", "model share", "ceiling/sync",
                   "ceiling/dgl"], rows)


def report_workload(cfgs, summary, rat, tgt) -> None:
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
