"""Scale-out: what N trainers cost and gain, per step and per rank, sync vs oac, 1 and 2 trainers.

Measured (CPU, gloo, one torch thread per trainer; 2 trainers are 2 spawned processes with a ``file://``
rendezvous), on one workload of ``_workloads.py`` (default ``node-adam-128`` on a smaller graph), every
configuration (``--configs``: sync, oac at prefetch 1 and 4) at 1 and 2 trainers:
  - bytes each rank sends per step, by purpose: the gradient all-to-all, the id registration (oac), the
    forwarded rows (oac), the dense all-reduce, the finite-check decision (``Group.sent``; an all-reduce counts
    its tensor once, see :class:`dgl_oac.distributed.Group`);
  - the share of the read taken off the critical path: the gather + copy time a step's rows cost (``loader
    .stats``) against the time the caller waited for them (sync gathers on the caller: share 0);
  - the stage milliseconds per step (as ``bench_modes.py``).
Time to accuracy: ``dgl-oac train --out`` (node task on the synthetic graph, ``--tta-lr``), 1 process vs
``torchrun`` with 2 trainers, the same epochs and settings (2 trainers take half the steps each, a batch per trainer
per step).

PREDICTION (no GPU, no network measured): step time for N GPUs (N = 1, 2, 4, 8), one trainer each, from stated
parameters (``--h2d-gbps``, ``--net-gbps``, ``--device-ms``, ``--patch-ns-per-row``, ``--cores-per-gpu``), the
CPU stages of the 1-trainer sync run, the write-back time of the 1-trainer oac run and the bytes, rows and conflict
rate of the 2-trainer runs (:func:`predict`). This machine has 2 cores: 2 trainers share them with each other (and with whatever else
runs), so wall-clock scaling measured here says little; bytes, shares and accuracy are what it shows.

    python benchmarks/scale_out.py                  # see RESULTS.md, "Scale-out"
    python benchmarks/scale_out.py --quick          # smoke run, under a minute

NETWORK (root): ``--network 0.2,1 --rate-gbit 10`` measures instead 2 machines over an emulated network, one
trainer each (:mod:`scale_out_net`: sync, oac@k, oac@auto, DGL's DistEmbedding; steps/s, bytes, PSS per machine).
"""
from __future__ import annotations

import contextlib
import datetime
import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _omp  # noqa: E402,F401  (OMP_WAIT_POLICY must be set before torch loads)
import torch  # noqa: E402
from tqdm.auto import tqdm  # noqa: E402

import _common as C  # noqa: E402
import scale_out_net as NET  # noqa: E402
import _workloads as W  # noqa: E402
from bench_modes import per_step_ms  # noqa: E402
from pipeline_model import predict_gpu, sync_stages  # noqa: E402

NAME = "scale_out"
KINDS = ("gradients", "registration", "forwarding", "mirror", "dense", "decision")  # Group.sent keys of a step
#: --trainers entries: processes, and whether each counts as a machine of its own ("2m": 2 trainers on 2 machines,
#: a table replica each and the written rows mirrored between them; torchrun's GROUP_RANK, on this one host)
SETUPS = {"1": (1, 1), "2": (2, 1), "2m": (2, 2)}
ALL_TO_ALL = ("gradients", "registration")  # a rank's own rows, to their owners
GPUS = (1, 2, 4, 8)


def parse(argv: Optional[List[str]] = None):
    p = C.base_parser(__doc__.split("\n\n")[0], NAME)
    p.add_argument("--workload", default="node-adam-128", choices=list(W.WORKLOADS))
    p.add_argument("--num-nodes", type=int, default=200_000, help="size of the synthetic graph")
    p.add_argument("--avg-degree", type=float, default=10.0)
    p.add_argument("--power", type=float, default=2.1, help="degree exponent of the synthetic graph")
    p.add_argument("--configs", default="sync,oac@1,oac@4", help="modes, oac as oac@<prefetch>")
    p.add_argument("--trainers", default="1,2,2m", help="trainer setups measured: 1 (in this process), 2 (2 "
                   "processes, one machine: one shared table), 2m (2 processes counted as 2 machines: a table "
                   "replica each, the written rows mirrored)")
    p.add_argument("--warmup", type=int, default=10, help="untimed steps before each timed window")
    p.add_argument("--steps", type=int, default=24, help="timed steps per configuration")
    p.add_argument("--tta-num-nodes", type=int, default=20_000, help="time to accuracy: synthetic graph size")
    p.add_argument("--tta-epochs", type=int, default=8, help="time to accuracy: epochs of both runs")
    p.add_argument("--tta-lr", type=float, default=0.003,
                   help="time to accuracy: learning rate of the table and the model (the default 0.05 / 0.01 reach "
                        "their best validation accuracy in the first epoch on this graph: no curve to compare)")
    p.add_argument("--tta-mode", default="oac@4", help="time to accuracy: the configuration of both runs")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds before a child run is killed")
    p.add_argument("--h2d-gbps", type=float, default=12.0, help="PREDICTION: host<->device GB/s per GPU, each way")
    p.add_argument("--net-gbps", type=float, default=10.0, help="PREDICTION: GB/s each trainer sends to the others")
    p.add_argument("--device-ms", type=float, default=4.0,
                   help="PREDICTION: device ms per batch for forward, backward, dense and row optimizer steps")
    p.add_argument("--patch-ns-per-row", type=float, default=2.0, help="PREDICTION: device ns per patched row")
    p.add_argument("--cores-per-gpu", type=int, default=2, help="PREDICTION: host cores per trainer")
    NET.add_arguments(p)
    args = p.parse_args(argv)
    if args.quick:  # graph and batch sizes: _workloads.QUICK
        args.num_nodes, args.warmup, args.steps, args.tta_num_nodes, args.tta_epochs = None, 1, 3, 3000, 2
        args.net_num_nodes, args.net_rounds, args.net_dim, args.net_batch_size = 3000, 1, 16, 256
    args.device = "cpu"
    if args.network is not None:
        try:
            NET.check(args)
        except (ValueError, RuntimeError) as exc:
            p.error(str(exc))
        return args
    try:
        args.config_list = [config(c) for c in C.str_list(args.configs)]
        config(args.tta_mode)
    except ValueError as exc:
        p.error(str(exc))
    args.trainer_list = C.str_list(args.trainers)
    if not args.trainer_list or any(n not in SETUPS for n in args.trainer_list):
        p.error(f"--trainers takes some of {', '.join(SETUPS)} (this script spawns at most 2 processes; 2m: on 2 "
                f"machines), got {args.trainers!r}")
    return args


def config(text: str) -> Dict[str, Any]:
    """``sync`` or ``oac@k`` -> ``{"label", "mode", "prefetch"}``."""
    mode, _, depth = text.partition("@")
    if mode == "sync" and not depth:
        return {"label": "sync", "mode": "sync", "prefetch": 1}
    if mode == "oac" and depth.isdigit() and int(depth) >= 1:
        return {"label": text, "mode": "oac", "prefetch": int(depth)}
    raise ValueError(f"a configuration is 'sync' or 'oac@<prefetch >= 1>', got {text!r}")


# -- measured: bytes, read share, stages (one process per trainer) ---------------------------------------------
@contextlib.contextmanager
def bytes_window(out: Dict[str, int]) -> Iterator[None]:
    """Fill ``out`` with the bytes this rank's collectives sent, by kind, while inside (nothing with 1 rank)."""
    from dgl_oac.distributed import current_group

    group = current_group()
    before = dict(group.sent) if group is not None else {}
    yield
    after = dict(group.sent) if group is not None else {}
    out.update({k: after.get(k, 0) - before.get(k, 0) for k in sorted(set(KINDS) | set(after))})


def read_share(mode: str, stages: Dict[str, float], steps: int) -> Dict[str, float]:
    """ms per step of the read (gather + copy, wall time: a background thread's includes the time it was not
    scheduled), of it on the caller's path, and the share taken off that path."""
    read = 1e3 * (stages["gather"] + stages["copy"]) / steps
    on_path = read if mode == "sync" else min(1e3 * stages["wait"] / steps, read)  # sync gathers on the caller
    return {"read_ms": read, "caller_waited_ms": on_path, "off_critical_path": 1.0 - on_path / read if read else 0.0}


def measure_rank(w: Any, configs: List[Dict[str, Any]], progress: bool) -> Dict[str, Any]:
    """Every configuration on this rank: ``C.timed_steps`` of a fresh task, bytes counted over the timed steps."""
    ds = W.dataset(w)
    out = {}
    for cfg in tqdm(configs, desc="configurations", disable=not progress, leave=False):
        torch.manual_seed(w.seed)
        task = W.build_task(w, ds, cfg["mode"], cfg["prefetch"], "auto", 0)
        if w.warmup + w.steps > len(task.loader):
            C.release(task)
            raise ValueError(f"{w.warmup} warm-up + {w.steps} timed steps need more batches than a trainer's epoch "
                             f"has ({len(task.loader)}): lower --steps/--warmup or raise --num-nodes")
        sent: Dict[str, int] = {}
        try:
            run = C.timed_steps(task, w.warmup, w.steps, bytes_window(sent))
        finally:
            C.release(task)
        n = run["batches"]
        out[cfg["label"]] = {
            "bytes_per_step": {k: v / n for k, v in sent.items()}, "ms_per_step": per_step_ms(run),
            "read": read_share(cfg["mode"], run["stages"], run["batches"]), "rows_per_batch": run["rows_per_batch"],
            "conflict_rate": run["conflict_rate"], "batches_per_s": run["batches_per_s"]}
    return out


def _rank_main(rank: int, world: int, init: str, w: Any, configs: List[Dict[str, Any]], outdir: str,
               machines: int) -> None:
    import torch.distributed as dist

    os.environ["GROUP_RANK"] = str(rank % machines)  # the machine this trainer counts as (torchrun's node rank)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=w.timeout))
    try:
        result = measure_rank(w, configs, progress=False)
    finally:
        dist.destroy_process_group()
    Path(outdir, f"rank{rank}.json").write_text(json.dumps(result))


def measure(w: Any, configs: List[Dict[str, Any]], setup: str) -> List[Dict[str, Any]]:
    """Per rank (in rank order), every configuration with the trainers of ``setup`` (:data:`SETUPS`)."""
    world, machines = SETUPS[setup]
    if world == 1:
        torch.set_num_threads(1)
        return [measure_rank(w, configs, w.progress)]
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory(prefix="dgl-oac-scale-out-") as tmp:
        mp.start_processes(_rank_main, args=(world, f"file://{tmp}/rendezvous", w, configs, tmp, machines),
                           nprocs=world,
                           start_method="spawn")
        return [json.loads(Path(tmp, f"rank{r}.json").read_text()) for r in range(world)]


# -- measured: time to accuracy ---------------------------------------------------------------------------------
def train_run(args: Any, trainers: int, out: Path) -> Dict[str, Any]:
    """``dgl-oac train --out`` with ``trainers`` trainers (torchrun for 2); returns its result JSON."""
    cfg = config(args.tta_mode)
    train = ["-m", "dgl_oac", "train", "--task", "node", "--num-nodes", str(args.tta_num_nodes), "--epochs",
             str(args.tta_epochs), "--mode", cfg["mode"], "--prefetch", str(cfg["prefetch"]), "--threads", "1",
             "--lr", str(args.tta_lr), "--dense-lr", str(args.tta_lr),
             "--seed", str(args.seed), "--device", "cpu", "--no-progress", "--out", str(out)]
    launch = [] if trainers == 1 else ["-m", "torch.distributed.run", "--standalone",
                                       f"--nproc_per_node={trainers}"]
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(C.REPO), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, *launch, *train], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=env, cwd=C.REPO, start_new_session=True)
    try:
        log, _ = proc.communicate(timeout=args.timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # torchrun and its trainers: one process group
        proc.communicate()
        raise RuntimeError(f"dgl-oac train with {trainers} trainer(s) ran past --timeout {args.timeout}s")
    if proc.returncode != 0:
        raise RuntimeError(f"dgl-oac train with {trainers} trainer(s) exited {proc.returncode}:\n{log[-3000:]}")
    return json.loads(out.read_text())


def time_to_accuracy(args: Any, bar: Any) -> Dict[str, Any]:
    """Both runs' curves (valid accuracy vs training seconds) and when (seconds, epoch) each first reaches 99% of
    the 1-trainer run's best valid accuracy (None: never)."""
    curves = {}
    with tempfile.TemporaryDirectory(prefix="dgl-oac-scale-out-") as tmp:
        for n in (1, 2):
            bar.set_postfix_str(f"time to accuracy, {n} trainer(s)")
            r = train_run(args, n, Path(tmp, f"tta{n}.json"))
            curves[n] = {"steps_per_trainer": r["steps"], "train_seconds": r["train_seconds"],
                         "curve": [{k: p[k] for k in ("epoch", "train_seconds", "valid_acc", "test_acc")}
                                   for p in r["curve"]]}
            bar.update()
    target = 0.99 * max(p["valid_acc"] for p in curves[1]["curve"])
    for c in curves.values():
        hit = next((p for p in c["curve"] if p["valid_acc"] >= target), None)
        c["seconds_to_target"], c["epoch_to_target"] = (hit["train_seconds"], hit["epoch"]) if hit else (None, None)
    return {"mode": args.tta_mode, "epochs": args.tta_epochs, "num_nodes": args.tta_num_nodes, "lr": args.tta_lr,
            "target_valid_acc": target, "trainers": {str(n): c for n, c in curves.items()}}


# -- PREDICTION: N GPUs -------------------------------------------------------------------------------------------
def bytes_at(sent: Dict[str, float], world: int, n: int) -> Dict[str, float]:
    """PREDICTION: bytes per step a rank sends with ``n`` trainers, from ``sent`` measured with ``world`` >= 2.
    Rules: a rank's gradients and registration are its own batch's rows, of which (n-1)/n have another owner;
    forwarded rows are rows of its batches in flight written by the others' steps, linear in the n-1 other
    trainers (overlap between their batches ignored: an upper bound); the dense gradients and the decision
    flags (``int32[world]``) are all-reduced by a ring, which sends 2(n-1)/n of the tensor."""
    if n == 1:
        return {k: 0.0 for k in KINDS}
    out = {k: sent.get(k, 0.0) * ((n - 1) / n) / ((world - 1) / world) for k in ALL_TO_ALL}
    out["forwarding"] = sent.get("forwarding", 0.0) * (n - 1) / (world - 1)
    ring = 2 * (n - 1) / n
    out["dense"] = sent.get("dense", 0.0) * ring
    out["decision"] = sent.get("decision", 0.0) / world * n * ring
    return out


def predict(n: int, stages: Dict[str, float], writeback_ms: float, rows: float, row_floats: int, conflict: float,
            sent: Dict[str, Dict[str, float]], world: int, p: Dict[str, float]) -> Dict[str, Any]:
    """PREDICTION for ``n`` GPUs, one trainer each: ms per step of sync and oac (:func:`pipeline_model
    .predict_gpu` with the step's collectives on the caller's path at ``p["net_gbps"]``). ``stages``: one
    trainer's CPU stage costs (``sync_stages``); ``writeback_ms``: one trainer's write-back of a step's rows into
    the CPU table, a background thread in one process but inside ``step()`` with several (an owner writes its rows
    through: no write-back thread), so on the caller's path for n > 1; ``sent[mode]``: bytes per step measured
    with ``world`` trainers; ``conflict`` (measured with ``world``) grows with the writers, as the forwarded rows
    do: x n / world."""
    b = {m: bytes_at(sent[m], world, n) for m in ("sync", "oac")}
    net = {m: sum(b[m].values()) / (p["net_gbps"] * 1e9) * 1e3 for m in b}
    inline = writeback_ms if n > 1 else 0.0
    g = predict_gpu(stages, writeback_ms - inline, rows, row_floats, min(1.0, conflict * n / world), p["h2d_gbps"],
                    p["device_ms"], p["patch_ns_per_row"], p["cores_per_gpu"], net["sync"] + inline,
                    net["oac"] + inline)
    return {"gpus": n, "bytes_per_step": b, "net_ms": net, "bus_ms_one_way": g["bus_ms_one_way"],
            "patch_ms": g["patch_ms"], "ms_per_step": {m: g[m] for m in ("sync", "oac")},
            "batches_per_s_all_trainers": {m: n * 1e3 / g[m] for m in ("sync", "oac")}}


def rank_mean(ranks: List[Dict[str, Any]], label: str, *keys: str) -> float:
    """The mean over ranks of ``ranks[r][label][keys...]``."""
    vals = []
    for r in ranks:
        v = r[label]
        for k in keys:
            v = v[k]
        vals.append(v)
    return sum(vals) / len(vals)


def prediction(args: Any, w: Any, measured: Dict[str, List[Dict[str, Any]]]) -> Optional[Dict[str, Any]]:
    """The PREDICTION for ``GPUS`` from the 1-trainer sync and deepest oac runs (CPU stages, write-back) and the
    2-trainer sync and deepest oac runs (bytes, rows, conflict rate)."""
    oac = [c["label"] for c in args.config_list if c["mode"] == "oac"]
    if "1" not in measured or "2" not in measured or "sync" not in [c["label"] for c in args.config_list] or not oac:
        return None
    deep = max(oac, key=lambda lab: config(lab)["prefetch"])
    two = measured["2"]
    sent = {"sync": {k: rank_mean(two, "sync", "bytes_per_step", k) for k in KINDS},
            "oac": {k: rank_mean(two, deep, "bytes_per_step", k) for k in KINDS}}
    params = {k: getattr(args, k)
              for k in ("h2d_gbps", "net_gbps", "device_ms", "patch_ns_per_row", "cores_per_gpu")}
    inputs = {"stages_ms": sync_stages(measured["1"][0]["sync"]["ms_per_step"]),
              "writeback_ms": measured["1"][0][deep]["ms_per_step"]["writeback_bg"],
              "rows": rank_mean(two, deep, "rows_per_batch"), "row_floats": W.row_floats(w.optimizer, w.dim),
              "conflict": rank_mean(two, deep, "conflict_rate"), "sent": sent, "world": 2, "oac": deep}
    rows = [predict(n, inputs["stages_ms"], inputs["writeback_ms"], inputs["rows"], inputs["row_floats"],
                    inputs["conflict"], sent, 2, params) for n in GPUS]
    return {"label": "PREDICTION (not measured: no GPU, no network)", "params": params, "inputs": inputs,
            "by_gpus": rows}


# -- the run ------------------------------------------------------------------------------------------------------
def main(argv: Optional[List[str]] = None) -> Dict[str, Any]:
    args = parse(argv)
    if args.network is not None:
        return network_main(args)
    w = W.settings(args, args.workload)
    result: Dict[str, Any] = {
        "benchmark": NAME, "args": vars(args), "env": C.environment(),
        "note": "2 cores: the trainers share them, so wall-clock scaling here says little. The gradient and dense "
                "bytes and the accuracies are load-independent; oac's registration and forwarded bytes and the "
                "read shares depend on how far ahead the gather thread got, i.e. on the load, as the times do",
        "workload": {"name": w.name, "task": w.task, "optimizer": w.optimizer, "dim": w.dim,
                     "batch_size": w.batch_size, "num_nodes": w.num_nodes,
                     "row_floats": W.row_floats(w.optimizer, w.dim)},
        "measured": {}}
    with tqdm(total=len(args.trainer_list) + 2, desc=NAME, disable=not args.progress) as bar:
        for n in args.trainer_list:
            bar.set_postfix_str(f"{n} trainer(s)")
            result["measured"][n] = measure(w, args.config_list, n)
            bar.update()
        result["time_to_accuracy"] = time_to_accuracy(args, bar)
    result["prediction"] = prediction(args, w, result["measured"])
    return C.publish(args, NAME, result, lambda png: plot(result, png), lambda: report(result))


def network_main(args: Any) -> Dict[str, Any]:
    """``--network``: only the emulated-network runs (:mod:`scale_out_net`), to ``scale_out_network.json``."""
    result: Dict[str, Any] = {"benchmark": f"{NAME}_network", "args": vars(args), "env": C.environment(),
                              "note": "2 machines emulated by network namespaces on one host: they share its "
                                      "cores (and whatever else runs), so the ratios, not the rates, carry"}
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a kill still tears the namespaces down (finally)
    NET.run(args, result)

    def plot(png: Path) -> None:
        plt = C.pyplot()
        fig, ax = plt.subplots(1, 1, figsize=(7, 4.5))
        NET.plot(result, ax)
        C.save_figure(fig, png)

    return C.publish(args, f"{NAME}_network", result, plot, lambda: NET.report(result))


def report(result: Dict[str, Any]) -> None:
    print(f"\n{result['note']}")
    for n, ranks in result["measured"].items():
        rows = []
        for r, per in enumerate(ranks):
            for lab, m in per.items():
                b = m["bytes_per_step"]
                rd = m["read"]
                rows.append([lab, r, *(b.get(k, 0.0) for k in KINDS), rd["read_ms"], rd["caller_waited_ms"],
                             rd["off_critical_path"], m["ms_per_step"]["step_total"], m["conflict_rate"]])
        C.print_table(f"{n} trainer(s): per step and rank (bytes sent; the read's ms, the caller's wait for it, "
                      f"the share off the caller's path)",
                      ["config", "rank", *KINDS, "read ms", "waited ms", "off path", "ms/step", "conflict"], rows)
    t = result["time_to_accuracy"]
    C.print_table(f"time to accuracy ({t['mode']}, {t['epochs']} epochs, {t['num_nodes']} nodes; target valid acc "
                  f"{t['target_valid_acc']:.4f} = 99% of 1 trainer's best)",
                  ["trainers", "steps each", "train s", "best valid", "s to target", "epoch to target"],
                  [[n, c["steps_per_trainer"], c["train_seconds"], max(p["valid_acc"] for p in c["curve"]),
                    c["seconds_to_target"], c["epoch_to_target"]] for n, c in t["trainers"].items()])
    pred = result["prediction"]
    if pred:
        p = pred["params"]
        C.print_table(f"{pred['label']}: {p['h2d_gbps']} GB/s host<->device, {p['net_gbps']} GB/s network, "
                      f"{p['device_ms']} ms device compute a batch, {p['patch_ns_per_row']} ns a patched row, "
                      f"{p['cores_per_gpu']} cores per GPU",
                      ["GPUs", "sync ms", "oac ms", "sync b/s all", "oac b/s all", "net sync ms", "net oac ms"],
                      [[g["gpus"], g["ms_per_step"]["sync"], g["ms_per_step"]["oac"],
                        g["batches_per_s_all_trainers"]["sync"], g["batches_per_s_all_trainers"]["oac"],
                        g["net_ms"]["sync"], g["net_ms"]["oac"]] for g in pred["by_gpus"]])


def plot(result: Dict[str, Any], png: Path) -> None:
    plt = C.pyplot()
    fig, axes = plt.subplots(1, 4, figsize=(19, 4.5))
    ax = axes[0]  # bytes per step per rank, stacked by kind
    bars = [(f"{lab}\n{n}t r{r}", m["bytes_per_step"]) for n, ranks in result["measured"].items()
            for r, per in enumerate(ranks) for lab, m in per.items() if n != "1"]
    bottom = [0.0] * len(bars)
    for k in KINDS:
        vals = [b.get(k, 0.0) / 1024 for _, b in bars]
        ax.bar(range(len(bars)), vals, bottom=bottom, label=k)
        bottom = [x + y for x, y in zip(bottom, vals)]
    ax.set_xticks(range(len(bars)), [lab for lab, _ in bars], fontsize=7)
    ax.set_ylabel("KiB sent per step per rank")
    ax.set_title("bytes by purpose", fontsize=9)
    ax.legend(fontsize=7)
    ax = axes[1]  # read off the critical path
    shares = [(f"{lab}\n{n}t r{r}", m["read"]["off_critical_path"]) for n, ranks in result["measured"].items()
              for r, per in enumerate(ranks) for lab, m in per.items()]
    ax.bar(range(len(shares)), [s for _, s in shares])
    ax.set_xticks(range(len(shares)), [lab for lab, _ in shares], fontsize=6)
    ax.set_ylim(0, 1)
    ax.set_title("share of the read off the caller's path (under load)", fontsize=9)
    ax = axes[2]  # time to accuracy
    t = result["time_to_accuracy"]
    for n, c in t["trainers"].items():
        ax.plot([p["train_seconds"] for p in c["curve"]], [p["valid_acc"] for p in c["curve"]], "o-",
                label=f"{n} trainer(s)")
    ax.axhline(t["target_valid_acc"], ls=":", c="grey")
    ax.set_xlabel("training seconds (under load, 2 cores)")
    ax.set_ylabel("valid accuracy")
    ax.set_title(f"time to accuracy, {t['mode']}", fontsize=9)
    ax.legend(fontsize=7)
    ax = axes[3]
    pred = result["prediction"]
    if pred:
        for m in ("sync", "oac"):
            ax.plot([g["gpus"] for g in pred["by_gpus"]],
                    [g["batches_per_s_all_trainers"][m] for g in pred["by_gpus"]], "o-", label=m)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("GPUs (one trainer each)")
        ax.set_ylabel("batches / s, all trainers")
        ax.legend(fontsize=7)
    ax.set_title("PREDICTION (not measured)", fontsize=9)
    C.save_figure(fig, png)


if __name__ == "__main__":
    main()
