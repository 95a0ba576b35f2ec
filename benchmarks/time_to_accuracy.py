"""Time to accuracy: sync, async (prefetch 1, 4, 16), async with a staleness rule (Gap-Aware, DANA-style
look-ahead; prefetch 4), oac (prefetch 4) and plain DGL, same seed, same data.

Each configuration is one call of the training driver (``dgl_oac.app.tasks.build_task`` + ``run`` with a
``TrainConfig``): the validation metric after every epoch against the training seconds so far (evaluation is
timed apart and not counted). Output: the curves (JSON), a PNG with one panel per workload and one line per
configuration, and a table of the training seconds each configuration needed to reach a target metric
(by default 95% and 99% of the best validation metric that sync, the exact reference, reached).

Several trainers: ``oac@4x2`` is oac at prefetch 4 on 2 trainers (``torchrun --standalone --nproc_per_node=2``
running this script with ``--trainer``, one torch thread each by default; ``--batch-size`` is per trainer, so an
epoch has half the steps), with DDP's all-reduce of the dense gradients; ``oac@4x2-shadow`` the same with
``dense_sync="shadow"`` (ShadowSync: dense parameters averaged in the background every 8 steps and after every
epoch; NOT exact), ``oac@4x2-shadow4`` every 4 steps. Their curve is rank 0's (it alone evaluates), their
``total_wall_s`` the subprocess's (start-up, dataset and a 3-step warm-up included); ``train_seconds`` compares.

Workloads (``--workloads``, comma-separated ``dataset:task``): ``synthetic:node`` (power-law graph with planted
classes), ``github-social:node`` (37.7k nodes, 2 classes, featureless), ``FB15k-237:kg`` (skipped, with a note
in the JSON, when ``dgl_oac/app/tasks/kg.py`` is not present).

    python benchmarks/time_to_accuracy.py
    python benchmarks/time_to_accuracy.py --quick
"""
from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _omp  # noqa: E402,F401  (OMP_WAIT_POLICY must be set before torch loads)
import torch  # noqa: E402
from tqdm.auto import tqdm  # noqa: E402

import _common as C  # noqa: E402

NAME = "time_to_accuracy"
DEFAULT_MODES = "sync,async@1,async@4,async@16,async-gap@4,async-lookahead@4,oac@4,dgl"
# per-workload training settings (full size); --quick shrinks them
WORKLOADS: Dict[str, Dict[str, Any]] = {
    # 300k-node power-law graph; 5% of the nodes are labelled for training (15 batches an epoch), so the curve
    # rises over several evaluations instead of saturating within the first epoch
    "synthetic:node": {"epochs": 6, "num_nodes": 300_000, "dim": 128, "hidden": 64, "batch_size": 1024,
                       "fanouts": "10,5", "lr": 0.01, "dense_lr": 0.01, "optimizer": "adam",
                       "extra": {"split": (0.05, 0.1, 0.85)}},
    # featureless, 2 classes (74% majority); learnable embeddings overfit after ~2 epochs at these rates
    "github-social:node": {"epochs": 5, "dim": 64, "hidden": 64, "batch_size": 256, "fanouts": "10,5",
                           "lr": 0.002, "dense_lr": 0.001, "optimizer": "adam"},
    # KG: valid/test MRR on a fixed random subset of 2000 triples per split after every epoch (a full filtered
    # ranking of FB15k-237 takes over a minute here); ``subset_eval`` keeps the last epoch on the subset too
    "fb15k-237:kg": {"epochs": 5, "dim": 128, "batch_size": 1024, "negatives": 256, "lr": 0.1, "dense_lr": 0.1,
                     "optimizer": "adagrad", "model": "distmult", "reg_weight": 0.0, "eval_limit": 2000,
                     "subset_eval": True},
}
QUICK = {"synthetic:node": {"epochs": 2, "num_nodes": 5_000, "dim": 16, "hidden": 16, "batch_size": 256,
                            "extra": {"split": (0.3, 0.2, 0.5)}},
         "github-social:node": {"epochs": 1, "dim": 16, "hidden": 16, "batch_size": 2048, "max_steps": 3},
         "fb15k-237:kg": {"epochs": 1, "dim": 16, "batch_size": 2048, "max_steps": 3, "eval_limit": 200,
                          "model": "distmult", "reg_weight": 0.0}}


def parse(argv: Optional[List[str]] = None):
    p = C.base_parser(__doc__.split("\n\n")[0], NAME)
    p.add_argument("--workloads", default=None,
                   help="comma-separated dataset:task pairs (default synthetic:node,github-social:node,FB15k-237:kg; "
                        "with --quick: synthetic:node)")
    p.add_argument("--modes", default=DEFAULT_MODES,
                   help="configurations: sync, dgl, async@P, oac@P, async-gap@P, async-lookahead@P; with N trainers "
                        "under torchrun: oac@PxN (DDP's all-reduce of the dense gradients), oac@PxN-shadow[K] "
                        "(ShadowSync, NOT exact: dense parameters averaged in the background every K steps, "
                        "default 8)")
    p.add_argument("--epochs", type=int, default=None, help="override every workload's epoch count")
    p.add_argument("--threads", type=int, default=None,
                   help="torch intra-op threads (default: torch's choice; with N trainers: the CPUs / N each)")
    p.add_argument("--target", type=float, default=None,
                   help="absolute target metric (default: 95%% and 99%% of sync's best validation metric)")
    p.add_argument("--device", default="cpu",
                   help="compute device of every configuration: cpu, cuda or cuda:N (the tables stay in CPU memory)")
    p.add_argument("--background-priority", default="auto", choices=["auto", "idle", "normal"],
                   help="DataLoader background_priority of the pipelined modes; 'normal' on a machine shared with "
                        "other jobs, where SCHED_IDLE gather and write-back threads starve")
    p.add_argument("--rounds", type=int, default=None,
                   help="runs of every configuration, interleaved in a rotated order; each mode's curve is its "
                        "run with the median training time (default 3; 1 with --quick)")
    p.add_argument("--trainer", default=None, metavar="SPEC",
                   help="internal: be one trainer of a multi-trainer configuration (torchrun starts the script "
                        "so, with the configuration in the JSON file SPEC)")
    args = p.parse_args(argv)
    if args.rounds is None:
        args.rounds = 1 if args.quick else 3
    if args.rounds < 1:
        p.error("--rounds must be >= 1")
    if args.workloads is None:
        args.workloads = "synthetic:node" if args.quick else "synthetic:node,github-social:node,FB15k-237:kg"
    return args


_MODE = re.compile(r"(?P<mode>[a-z]+)(?:-(?P<staleness>[a-z]+))?"
                   r"(?:@(?P<depth>\d+)(?:x(?P<trainers>\d+))?(?P<shadow>-shadow(?P<every>\d*))?)?")


def parse_mode(text: str) -> Tuple[Dict[str, Any], int]:
    """``(TrainConfig fields, trainers)`` of a configuration name: ``async-gap@4`` is mode async with staleness
    gap at prefetch 4, ``oac@4x2-shadow4`` mode oac at prefetch 4 on 2 trainers with ShadowSync every 4 steps."""
    m = _MODE.fullmatch(text)
    if m is None:
        raise ValueError(f"bad configuration {text!r}: expected MODE[-RULE][@P[xN][-shadow[K]]], e.g. async-gap@4, "
                         f"oac@4x2-shadow4")
    fields: Dict[str, Any] = {"mode": m["mode"], "staleness": m["staleness"], "prefetch": int(m["depth"] or 1)}
    if m["shadow"]:
        fields["dense_sync"] = "shadow"
        if m["every"]:
            fields["shadow_every"] = int(m["every"])
    return fields, int(m["trainers"] or 1)


def style_key(text: str) -> str:
    """The plot style of a configuration: its mode and rule, ``xN`` and ``-shadow`` for several trainers."""
    fields, trainers = parse_mode(text)
    key = fields["mode"] + (f"-{fields['staleness']}" if fields["staleness"] else "")
    return key + (f" x{trainers}" if trainers > 1 else "") + ("-shadow" if "dense_sync" in fields else "")


def key_of(workload: str) -> str:
    dataset, _, task = workload.partition(":")
    return f"{dataset.lower()}:{task or 'node'}"


def memoize_loads() -> None:
    """Load each dataset once per process: ``build_task`` calls ``dgl_oac.app.data.load`` for every configuration."""
    import dgl_oac.app.data as data

    if getattr(data.load, "_bench_cache", None) is not None:
        return
    original, cache = data.load, {}

    def load(name, root=None, **kwargs):
        key = (str(name), str(root), tuple(sorted((k, repr(v)) for k, v in kwargs.items())))
        if key not in cache:
            cache[key] = original(name, root=root, **kwargs)
        return cache[key]

    load._bench_cache = cache  # type: ignore[attr-defined]
    data.load = load


def valid_key(point: Dict[str, Any]) -> Optional[str]:
    for k in ("valid_acc", "valid_mrr", "valid_hits@10", "test_acc", "test_mrr"):
        if k in point:
            return k
    return None


def time_to(curve: List[Dict[str, Any]], key: str, target: float) -> Optional[float]:
    for p in curve:
        if p.get(key, float("-inf")) >= target:
            return p["train_seconds"]
    return None


def timed_run(cfg: Any, build: Callable[[Any], Any], seed: int, threads: Optional[int]) -> Dict[str, Any]:
    """The driver's summary of ``run(cfg, build(cfg))`` from ``torch.manual_seed(seed)`` (the same initial table
    and model in every configuration) plus ``total_wall_s``; ``{"error": ...}`` if it raised, so that one broken
    configuration never loses the others."""
    from dgl_oac.app.tasks.common import run

    torch.manual_seed(seed)
    if threads:
        torch.set_num_threads(threads)
    t0 = time.perf_counter()
    try:
        res = run(cfg, build(cfg))
    except Exception as exc:  # noqa: BLE001 - reported in the result
        res = {"error": f"{type(exc).__name__}: {exc}"}
    res["total_wall_s"] = time.perf_counter() - t0
    return res


def build(cfg: Any, subset_eval: bool) -> Any:
    """The task of ``cfg``. With ``subset_eval`` (KG) it is built with a larger epoch count than the driver runs:
    the KG task ranks the full splits once ``epochs`` evaluations have run, so it stays on the fixed subset."""
    from dgl_oac.app.tasks import build_task

    return build_task(dataclasses.replace(cfg, epochs=cfg.epochs + 10_000) if subset_eval else cfg)


def torchrun_run(cfg: Any, trainers: int, subset_eval: bool, threads: Optional[int]) -> Dict[str, Any]:
    """Rank 0's summary of ``cfg`` trained by ``trainers`` processes under ``torchrun --standalone`` (this script
    with ``--trainer``), plus ``total_wall_s`` (the subprocess's); ``{"error": ...}`` if it failed."""
    threads = threads or max(1, (os.cpu_count() or 1) // trainers)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="dgl-oac-tta-") as tmp:
        spec, out = Path(tmp) / "spec.json", Path(tmp) / "rank0.json"
        spec.write_text(json.dumps({"cfg": {**dataclasses.asdict(cfg), "out": str(out), "threads": threads},
                                    "subset_eval": subset_eval}))
        path = os.pathsep.join([str(C.REPO), os.environ.get("PYTHONPATH", "")])
        proc = subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={trainers}",
             str(Path(__file__).resolve()), "--trainer", str(spec)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
            env={**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONPATH": path})
        try:
            _, err = proc.communicate(timeout=3600)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # torchrun and its trainers
            proc.communicate()
            err = "timed out after 3600 s; killed"
        res = json.loads(out.read_text()) if proc.returncode == 0 and out.exists() else {
            "error": f"torchrun exited {proc.returncode}: {err[-2000:]}"}
    res["total_wall_s"] = time.perf_counter() - t0
    return res


def trainer(spec_path: str) -> None:
    """One of the trainers of :func:`torchrun_run`: a 3-step warm-up (first-call costs, as the one-process
    configurations have theirs before timing), then the configuration; rank 0 writes its summary."""
    from dgl_oac.app.tasks import launch
    from dgl_oac.app.tasks.common import TrainConfig, run

    spec = json.loads(Path(spec_path).read_text())
    cfg = TrainConfig(**spec["cfg"])
    torch.set_num_threads(cfg.threads)
    memoize_loads()
    launch.start(cfg)
    try:
        warm = dataclasses.replace(cfg, epochs=1, max_steps=3, out=None)
        run(warm, build(warm, spec["subset_eval"]))
        torch.manual_seed(cfg.seed)
        run(cfg, build(cfg, spec["subset_eval"]))
    finally:
        launch.stop()


def run_workload(args, workload: str, modes: List[str], bar) -> Dict[str, Any]:
    from dgl_oac.app.tasks.common import TrainConfig, run

    dataset, _, task = workload.partition(":")
    task = task or "node"
    key = key_of(workload)
    if task == "kg" and importlib.util.find_spec("dgl_oac.app.tasks.kg") is None:
        bar.update(args.rounds * len(modes))
        return {"skipped": "dgl_oac/app/tasks/kg.py does not exist yet (KG task not implemented when this ran)"}
    settings = dict(WORKLOADS.get(key, WORKLOADS["synthetic:node"] if task == "node" else {}))
    if args.quick:
        settings.update(QUICK.get(key, {}))
    if args.epochs:
        settings["epochs"] = args.epochs
    out: Dict[str, Any] = {"settings": dict(settings), "runs": {}}
    subset_eval = settings.pop("subset_eval", False)

    # warm the process up (first-call costs of DGL kernels, allocator, dataset load) outside any timed run; the
    # trainers of a multi-trainer configuration warm themselves up (trainer())
    in_process = any(parse_mode(m)[1] == 1 for m in modes)
    for mode in ("oac", "dgl") if in_process else ():
        warm = {**settings, "epochs": 1, "max_steps": 3}
        try:
            wcfg = TrainConfig(task=task, dataset=dataset, mode=mode, seed=args.seed, device=args.device, progress=False,
                               **warm)
            run(wcfg, build(wcfg, subset_eval))
        except Exception:  # noqa: BLE001 - the timed runs report errors
            pass
    every: Dict[str, List[Dict[str, Any]]] = {m: [] for m in modes}
    for r in range(args.rounds):
        for m in C.rotated(modes, r):
            fields, trainers = parse_mode(m)
            bar.set_postfix_str(f"{workload} {m} round {r + 1}")
            cfg = TrainConfig(task=task, dataset=dataset, seed=args.seed, background_priority=args.background_priority,
                              device=args.device, progress=False, threads=args.threads, **fields, **settings)
            if trainers > 1:
                res = torchrun_run(cfg, trainers, subset_eval, args.threads)
            else:
                res = timed_run(cfg, lambda c: build(c, subset_eval), args.seed, args.threads)
            res["round"] = r
            every[m].append(res)
            bar.update()
    for m, rs in every.items():  # each mode's curve: its run with the median training time
        good = sorted((x for x in rs if x.get("curve")), key=lambda x: x["train_seconds"])
        out["runs"][m] = good[(len(good) - 1) // 2] if good else rs[0]
    out["train_seconds_per_round"] = {m: [x.get("train_seconds") for x in rs] for m, rs in every.items()}
    if "sync" in every:  # same round = same machine conditions: the ratio of training times, per round
        out["train_time_vs_sync_per_round"] = {
            m: C.spread([x["train_seconds"] / y["train_seconds"] for x, y in zip(rs, every["sync"])
                         if x.get("curve") and y.get("curve")])
            for m, rs in every.items() if m != "sync"}
    ok = {m: r for m, r in out["runs"].items() if "curve" in r and r["curve"]}
    if not ok:
        return out
    first = next(iter(ok.values()))["curve"][0]
    metric = valid_key(first)
    out["metric"] = metric
    ref = ok.get("sync") or next(iter(ok.values()))
    best = max(p[metric] for p in ref["curve"])
    targets = [args.target] if args.target is not None else [0.95 * best, 0.99 * best]
    out["targets"] = targets
    out["reference_best"] = best
    out["time_to_target"] = {m: {f"{t:.4f}": time_to(r["curve"], metric, t) for t in targets} for m, r in ok.items()}
    out["final"] = {m: {"metric": r["curve"][-1][metric], "best": max(p[metric] for p in r["curve"]),
                        "train_seconds": r["train_seconds"], "batches_per_s": r["batches_per_s"],
                        "conflict_rate": (r.get("loader_stats") or {}).get("conflict_rate")}
                    for m, r in ok.items()}
    return out


#: async's prefetch depth -> (line style, marker): each staleness rule keeps its colour, and its @4 and @16 runs
#: differ in both line and marker (issue 38)
DEPTH_STYLES = {1: ("-.", "v"), 4: ("--", "o"), 16: (":", "s")}


def plot(result: Dict[str, Any], png: Path) -> None:
    plt = C.pyplot()
    wls = [w for w, r in result["workloads"].items() if "metric" in r]
    if not wls:
        return
    fig, axes = plt.subplots(1, len(wls), figsize=(6 * len(wls), 4.3), squeeze=False)
    styles = {"sync": ("tab:blue", "-"), "dgl": ("tab:gray", "-"), "oac": ("tab:green", "-"),
              "async": ("tab:orange", "--"), "async-gap": ("tab:brown", "--"), "async-lookahead": ("tab:purple", "--"),
              "oac x2": ("tab:olive", "-"), "oac x2-shadow": ("tab:red", "--")}
    for ax, w in zip(axes[0], wls):
        r = result["workloads"][w]
        metric = r["metric"]
        for m, run in r["runs"].items():
            if "curve" not in run:
                continue
            color, ls = styles.get(style_key(m), ("k", "-"))
            fields = parse_mode(m)[0]
            if fields["mode"] == "async":  # a rule's colour, its depth's line and marker: @4 and @16 apart
                ls, marker = DEPTH_STYLES.get(fields["prefetch"], (ls, "o"))
            else:
                marker = "o"
            ls = {1: ":", 2: "-."}.get(fields.get("shadow_every"), ls)  # ShadowSync's period: one dash pattern each
            ax.plot([0.0] + [p["train_seconds"] for p in run["curve"]],
                    [float("nan")] + [p[metric] for p in run["curve"]], marker=marker, ms=4, color=color, ls=ls,
                    label=m)
        for t in r["targets"]:
            ax.axhline(t, color="k", lw=0.7, ls=":")
        ax.set_xlabel("training seconds (evaluation excluded)")
        ax.set_ylabel(metric)
        ax.set_title(w)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("metric vs training time, one line per configuration (async: colour = rule, dashed/circles = @4, "
                 "dotted/squares = @16; thin dotted: 95% / 99% of sync's best)", fontsize=10)
    C.save_figure(fig, png)


def main(argv: Optional[List[str]] = None) -> Optional[Dict[str, Any]]:
    args = parse(argv)
    if args.trainer:
        trainer(args.trainer)
        return None
    memoize_loads()
    env = C.environment()
    modes = C.str_list(args.modes)
    workloads = C.str_list(args.workloads)
    result: Dict[str, Any] = {"benchmark": NAME, "env": env, "args": vars(args), "workloads": {}}
    bar = tqdm(total=args.rounds * len(modes) * len(workloads), desc=NAME, disable=not args.progress,
               dynamic_ncols=True)
    for w in workloads:
        result["workloads"][key_of(w)] = run_workload(args, w, modes, bar)
    bar.close()
    result["torch_threads"] = torch.get_num_threads()
    return C.publish(args, NAME, result, lambda png: plot(result, png), lambda: report(result))


def report(result: Dict[str, Any]) -> None:
    for w, r in result["workloads"].items():
        if "skipped" in r:
            print(f"\n{w}: skipped ({r['skipped']})")
            continue
        if "metric" not in r:
            print(f"\n{w}: no configuration finished: " + "; ".join(f"{m}: {x.get('error')}" for m, x in
                                                                    r["runs"].items()))
            continue
        tts = r["time_to_target"]
        ts = r["targets"]
        rows = []
        for m, f in r["final"].items():
            tt = [tts[m][f"{t:.4f}"] for t in ts]
            rows.append([m, f["best"], f["metric"], f["train_seconds"], f["batches_per_s"],
                         *["not reached" if x is None else f"{x:.1f}s" for x in tt],
                         "-" if f["conflict_rate"] is None else f"{f['conflict_rate']:.3f}"])
        for m, x in r["runs"].items():
            if "error" in x:
                rows.append([m, "error", x["error"][:60], "", "", *[""] * len(ts), ""])
        C.print_table(f"{w}: {r['metric']} (targets {', '.join(f'{t:.4f}' for t in ts)})",
                      ["config", "best", "final", "train s", "batch/s", *[f"t->{t:.3f}" for t in ts], "conflict"],
                      rows)
        sync = tts.get("sync", {})
        for t in ts:
            k = f"{t:.4f}"
            if sync.get(k):
                ratios = {m: (sync[k] / v[k] if v.get(k) else None) for m, v in tts.items()}
                print(f"  speed-up to {t:.4f} vs sync: " + ", ".join(
                    f"{m}={'-' if x is None else f'{x:.2f}x'}" for m, x in ratios.items()))
        per_round = {m: v for m, v in r.get("train_time_vs_sync_per_round", {}).items() if v["n"]}
        if per_round:
            n = len(r["train_seconds_per_round"]["sync"])
            print(f"  training time / sync's in the same round, median [min, max] of {n}: " + ", ".join(
                f"{m}={v['median']:.2f} [{v['min']:.2f}, {v['max']:.2f}]" for m, v in per_round.items()))


if __name__ == "__main__":
    main()
