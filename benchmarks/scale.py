"""Scale: throughput and peak memory per mode as the table grows, as prefetch grows, as skew grows; and the limit.

Four sweeps in one run:

* ``size``: table rows (1e5, 1e6, 1e7 at dim 128) and width (dims 32..256 at 1e6 rows), every mode (sync,
  async@4, oac@4, plain DGL). A cheap model (one SAGE layer, fanout 10, straight to the classes) on a sparse
  power-law graph (average degree 4) so the table dominates. One child process per (rows, dim) runs the modes
  one after another (rotated order); per mode it records rows/s, batches/s, setup seconds and memory: the peak
  RSS above the process's baseline while the mode built and trained (sampled every 5 ms) and the process's
  peak RSS. A mode is skipped, with a note, when the machine's available memory is below its estimate.
* ``limit``: in the same child, on the same table, the gather stage's ceiling: a contiguous copy of
  ``rows_per_batch`` rows vs a random-row ``index_select`` of the same bytes (uniform ids, and the last timed
  batch's real ids); each mode's rows/s is reported as a fraction of the random-gather ceiling.
* ``prefetch``: async and oac at depths 1..16 (2-layer SAGE, fanouts 10,5, 300k nodes): throughput and
  conflict rate vs depth (interleaved rounds).
* ``skew``: async@4 and oac@4 as the degree exponent of the graph falls (heavier tail, more hubs): conflict
  rate and throughput vs skew.

Targets: 1e7 x 128 float32 trains in every mode on this 24 GiB machine; per-row throughput falls < 2x from 1e5
to 1e7 rows.

    python benchmarks/scale.py
    python benchmarks/scale.py --quick
"""
from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _omp  # noqa: E402,F401  (OMP_WAIT_POLICY must be set before torch loads)
import torch  # noqa: E402
from tqdm.auto import tqdm  # noqa: E402

import _common as C  # noqa: E402

NAME = "scale"
SIZE_MODES = ("sync", "async@4", "oac@4", "dgl")
OPT_STATE = {"adagrad": lambda d: d, "adam": lambda d: 2 * d + 1}


def parse(argv: Optional[List[str]] = None):
    p = C.base_parser(__doc__.split("\n\n")[0], NAME)
    p.add_argument("--rows", default="100000,1000000,10000000", help="table sizes (rows) at --base-dim")
    p.add_argument("--base-dim", type=int, default=128)
    p.add_argument("--dims", default="32,64,128,256", help="dims swept at --dims-rows rows")
    p.add_argument("--dims-rows", type=int, default=1_000_000)
    p.add_argument("--size-avg-degree", type=float, default=4.0, help="average degree of the size-sweep graphs")
    p.add_argument("--size-batch", type=int, default=2048)
    p.add_argument("--size-fanouts", default="10")
    p.add_argument("--optimizer", default="adagrad", choices=sorted(OPT_STATE))
    p.add_argument("--size-steps", type=int, default=20)
    p.add_argument("--prefetch", default="1,2,4,8,16")
    p.add_argument("--powers", default="1.6,2.1,2.6,3.5", help="degree exponents for the skew sweep")
    p.add_argument("--sweep-nodes", type=int, default=300_000, help="graph size of the prefetch and skew sweeps")
    p.add_argument("--sweep-dim", type=int, default=128)
    p.add_argument("--sweep-steps", type=int, default=20)
    p.add_argument("--rounds", type=int, default=2, help="interleaved rounds of the prefetch and skew sweeps")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's choice)")
    p.add_argument("--skip", default="", help="comma-separated sweeps to skip: size, prefetch, skew")
    p.add_argument("--cache", default=None, help="folder for generated graphs (default: a temporary folder)")
    p.add_argument("--margin-gib", type=float, default=3.0,
                   help="skip a mode unless the machine has its estimated memory plus this much available")
    p.add_argument("--child", default=None, help=argparse_hidden())
    args = p.parse_args(argv)
    if args.quick:
        args.rows, args.base_dim, args.dims, args.dims_rows = "10000,30000", 16, "16", 10_000
        args.size_batch, args.size_steps, args.sweep_steps, args.warmup = 512, 4, 4, 1
        args.prefetch, args.powers, args.sweep_nodes, args.sweep_dim, args.rounds = "1,4", "1.8,3.0", 8_000, 16, 1
    return args


def argparse_hidden() -> str:
    import argparse
    return argparse.SUPPRESS


# ------------------------------------------------------------------------------------------------ child side
class PeakRSS:
    """Highest current RSS (MiB) seen by a 5 ms sampler between ``start`` and ``stop``."""

    def __init__(self) -> None:
        self.peak = 0.0
        self._stop = threading.Event()
        self._t: Optional[threading.Thread] = None

    def start(self) -> "PeakRSS":
        self.peak = C.rss_mib()
        self._stop.clear()
        self._t = threading.Thread(target=self._run, name="bench-rss", daemon=True)
        self._t.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, C.rss_mib())

    def stop(self) -> float:
        self._stop.set()
        if self._t is not None:
            self._t.join()
        self.peak = max(self.peak, C.rss_mib())
        return self.peak


def dataset(cache: Path, nodes: int, avg_degree: float, power: float, seed: int):
    """The synthetic node dataset, generated once per (nodes, degree, power, seed) and cached on disk."""
    from dgl_oac.app.data import load

    path = cache / f"synthetic-n{nodes}-d{avg_degree:g}-p{power:g}-s{seed}.pt"
    if path.exists():
        return torch.load(path, weights_only=False), 0.0
    t = time.perf_counter()
    ds = load("synthetic", num_nodes=nodes, avg_degree=avg_degree, power=power, task="node", seed=seed)
    gen = time.perf_counter() - t
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
    torch.save(ds, tmp)
    os.replace(tmp, path)
    return ds, gen


def ceiling(table: torch.Tensor, n: int, batch_ids: Optional[torch.Tensor], reps: int = 5) -> Dict[str, float]:
    """Gather ceiling on ``table: float32[R, W]``: contiguous copy vs random-row index_select of n rows."""
    n = min(n, table.shape[0])
    out = torch.empty(n, table.shape[1], dtype=table.dtype)
    gen = torch.Generator().manual_seed(0)
    ids = [torch.randint(table.shape[0], (n,), generator=gen) for _ in range(reps)]
    start = [int(x) for x in torch.randint(max(table.shape[0] - n, 1), (reps,), generator=gen)]

    def best(fn) -> float:
        fn(0)
        ts = []
        for i in range(reps):
            t = time.perf_counter()
            fn(i)
            ts.append(time.perf_counter() - t)
        return min(ts)

    nbytes = n * table.shape[1] * table.element_size()
    t_copy = best(lambda i: out.copy_(table[start[i]:start[i] + n]))
    t_rand = best(lambda i: torch.index_select(table, 0, ids[i], out=out))
    res = {"rows": n, "row_bytes": table.shape[1] * table.element_size(),
           "contiguous_gb_s": nbytes / t_copy / 1e9, "contiguous_rows_s": n / t_copy,
           "random_gb_s": nbytes / t_rand / 1e9, "random_rows_s": n / t_rand}
    if batch_ids is not None and batch_ids.numel():
        bo = torch.empty(batch_ids.numel(), table.shape[1], dtype=table.dtype)
        t_b = best(lambda i: torch.index_select(table, 0, batch_ids, out=bo))
        res["batch_ids_rows_s"] = batch_ids.numel() / t_b
        res["batch_ids_gb_s"] = batch_ids.numel() * res["row_bytes"] / t_b / 1e9
    return res


def need_gib(mode: str, rows: int, dim: int, optimizer: str) -> float:
    """Estimated extra memory of one mode (table + optimizer state, and dgl-oac's widen transient)."""
    state = OPT_STATE[optimizer](dim)
    if mode == "dgl":
        return rows * (dim + state) * 4 / 2**30
    return rows * (2 * dim + state) * 4 / 2**30  # table of dim+state, plus the value-only table while widening


def warm_up(spec: Dict[str, Any]) -> None:
    """First-call costs (lazy imports, DGL kernels, allocator) on a tiny graph, before anything is timed."""
    from dgl_oac.app.data import load
    from dgl_oac.app.tasks.common import TrainConfig
    from dgl_oac.app.tasks.node import NodeTask

    ds = load("synthetic", num_nodes=2000, avg_degree=4, task="node", seed=0)
    for mode in ("sync", "oac", "dgl"):
        cfg = TrainConfig(task="node", mode=mode, dim=8, hidden=8, fanouts=spec["fanouts"], batch_size=256,
                          optimizer=spec["optimizer"], device="cpu", progress=False)
        task = NodeTask(cfg, ds)
        try:
            C.timed_steps(task, 1, 2)
        finally:
            C.release(task)


def child(spec: Dict[str, Any]) -> Dict[str, Any]:
    """One (rows, dim) point: every mode in turn on one cached graph."""
    from dgl_oac.app.tasks.common import TrainConfig
    from dgl_oac.app.tasks.node import NodeTask

    if spec.get("threads"):
        torch.set_num_threads(spec["threads"])
    warm_up(spec)
    base0 = C.rss_mib()
    ds, gen_s = dataset(Path(spec["cache"]), spec["rows"], spec["avg_degree"], spec["power"], spec["seed"])
    base = C.rss_mib()
    out: Dict[str, Any] = {"rows": spec["rows"], "dim": spec["dim"], "edges": ds.graph.num_edges(),
                           "generate_s": gen_s, "rss_start_mib": base0, "rss_with_graph_mib": base,
                           "torch_threads": torch.get_num_threads(), "modes": {}}
    for m in spec["modes"]:
        mode, _, depth = m.partition("@")
        need = need_gib(mode, spec["rows"], spec["dim"], spec["optimizer"])
        avail = C.available_gib()
        if need + spec["margin_gib"] > avail:
            out["modes"][m] = {"skipped": f"needs ~{need:.1f} GiB + {spec['margin_gib']} GiB margin, "
                                          f"{avail:.1f} GiB available"}
            continue
        torch.manual_seed(spec["seed"])
        cfg = TrainConfig(task="node", mode=mode, prefetch=int(depth or 1), dim=spec["dim"], hidden=16,
                          fanouts=spec["fanouts"], batch_size=spec["batch"], optimizer=spec["optimizer"],
                          seed=spec["seed"], device="cpu", progress=False)
        before = C.rss_mib()
        peak = PeakRSS().start()
        t = time.perf_counter()
        task = NodeTask(cfg, ds)
        if mode == "dgl":
            C.align_dgl_loader(task, spec["seed"])
        build_s = time.perf_counter() - t
        last_ids: List[torch.Tensor] = []
        try:
            res = C.timed_steps(task, spec["warmup"], spec["steps"])
            emb = task.emb._emb if hasattr(task.emb, "_emb") else task.emb
            table = emb.store.table if mode != "dgl" else emb.weight
            batch = next(iter(task.loader))  # a real batch's ids, for the ceiling on real (skewed) ids
            last_ids.append(batch[0].cpu())
            res["ceiling"] = ceiling(table, int(res["rows_per_batch"]), last_ids[0])
            res["table_floats_per_row"] = int(table.shape[1])
            # the table the mode keeps (dgl: value + optimizer state, held apart)
            state = OPT_STATE[spec["optimizer"]](spec["dim"])
            res["table_gib"] = spec["rows"] * (spec["dim"] + state) * 4 / 2**30
            del table, emb, batch
        finally:
            C.release(task)
            del task
            gc.collect()
        res["build_s"] = build_s
        res["peak_rss_mib"] = peak.stop()
        res["peak_above_baseline_mib"] = res["peak_rss_mib"] - before
        res["rss_after_release_mib"] = C.rss_mib()
        res["rows_per_s_fraction_of_random_gather"] = res["rows_per_s"] / res["ceiling"]["random_rows_s"]
        out["modes"][m] = res
    out["process_peak_rss_mib"] = C.peak_rss_mib()
    return out


# ----------------------------------------------------------------------------------------------- parent side
def size_points(args) -> List[Dict[str, int]]:
    pts = [{"rows": r, "dim": args.base_dim} for r in C.int_list(args.rows)]
    pts += [{"rows": args.dims_rows, "dim": d} for d in C.int_list(args.dims)
            if {"rows": args.dims_rows, "dim": d} not in pts]
    return sorted(pts, key=lambda p: (p["rows"], p["dim"]))


def run_size(args, cache: Path, bar) -> Dict[str, Any]:
    results = []
    for i, pt in enumerate(size_points(args)):
        spec = {**pt, "modes": C.rotated(SIZE_MODES, i), "cache": str(cache), "avg_degree": args.size_avg_degree,
                "power": 2.1, "seed": args.seed, "fanouts": args.size_fanouts, "batch": args.size_batch,
                "optimizer": args.optimizer, "warmup": args.warmup, "steps": args.size_steps,
                "threads": args.threads, "margin_gib": args.margin_gib}
        bar.set_postfix_str(f"size {pt['rows']:.0e} x {pt['dim']}")
        cmd = [sys.executable, str(Path(__file__).resolve()), "--child", json.dumps(spec), "--no-progress"]
        if args.omp_wait_policy:
            cmd += ["--omp-wait-policy", args.omp_wait_policy]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        line = next((ln for ln in reversed(proc.stdout.splitlines()) if ln.startswith("{")), None)
        if proc.returncode != 0 or line is None:
            results.append({**pt, "error": f"child exited {proc.returncode}: {proc.stderr[-2000:]}"})
        else:
            results.append(json.loads(line))
        bar.update()
    return {"points": results}


def in_process_runs(args, configs: List[Dict[str, Any]], datasets: Dict[Any, Any], key: str, bar
                    ) -> Dict[str, List[Dict[str, Any]]]:
    """Interleaved rounds of in-process runs (2-layer SAGE, fanouts 10,5, batch 1024)."""
    from dgl_oac.app.tasks.common import TrainConfig
    from dgl_oac.app.tasks.node import NodeTask

    runs: Dict[str, List[Dict[str, Any]]] = {c["label"]: [] for c in configs}
    for r in range(args.rounds):
        for c in C.rotated(configs, r):
            bar.set_postfix_str(f"{key} {c['label']}")
            torch.manual_seed(args.seed)
            cfg = TrainConfig(task="node", mode=c["mode"], prefetch=c["prefetch"], dim=args.sweep_dim, hidden=64,
                              fanouts="10,5", batch_size=1024 if not args.quick else 256,
                              optimizer=args.optimizer, seed=args.seed, device="cpu", progress=False)
            task = NodeTask(cfg, datasets[c.get("power", 2.1)])
            try:
                res = C.timed_steps(task, args.warmup, args.sweep_steps)
            finally:
                C.release(task)
            res["round"] = r
            runs[c["label"]].append(res)
            bar.update()
    return runs


def summarise_runs(runs: Dict[str, List[Dict[str, Any]]]) -> Dict[str, Any]:
    return {lab: {"batches_per_s": C.spread([x["batches_per_s"] for x in rs]),
                  "rows_per_s": C.spread([x["rows_per_s"] for x in rs]),
                  "conflict_rate": C.median(x.get("conflict_rate") for x in rs),
                  "rows_per_batch": C.median(x["rows_per_batch"] for x in rs),
                  "max_in_flight": max(x.get("max_in_flight", 0) for x in rs)} for lab, rs in runs.items()}


def paired(runs, a: str, b: str) -> Dict[str, float]:
    return C.spread([x["batches_per_s"] / y["batches_per_s"] for x, y in zip(runs[a], runs[b])])


def run_prefetch(args, cache: Path, bar) -> Dict[str, Any]:
    ds, _ = dataset(cache, args.sweep_nodes, 10.0, 2.1, args.seed)
    depths = C.int_list(args.prefetch)
    cfgs = [{"mode": m, "prefetch": p, "label": f"{m}@{p}"} for p in depths for m in ("async", "oac")]
    runs = in_process_runs(args, cfgs, {2.1: ds}, "prefetch", bar)
    return {"depths": depths, "runs": runs, "summary": summarise_runs(runs),
            "oac_over_async": {p: paired(runs, f"oac@{p}", f"async@{p}") for p in depths}}


def run_skew(args, cache: Path, bar) -> Dict[str, Any]:
    powers = C.float_list(args.powers)
    dss = {p: dataset(cache, args.sweep_nodes, 10.0, p, args.seed)[0] for p in powers}
    degree_stats = {}
    for p, ds in dss.items():
        deg = ds.graph.in_degrees().float()
        degree_stats[p] = {"max_degree": float(deg.max()), "top1pct_edge_share":
                           float(deg.sort(descending=True).values[: max(1, deg.numel() // 100)].sum() / deg.sum())}
    cfgs = [{"mode": m, "prefetch": 4, "power": p, "label": f"{m}@4/p{p:g}"} for p in powers
            for m in ("async", "oac")]
    runs = in_process_runs(args, cfgs, dss, "skew", bar)
    return {"powers": powers, "degree_stats": degree_stats, "runs": runs, "summary": summarise_runs(runs),
            "oac_over_async": {p: paired(runs, f"oac@4/p{p:g}", f"async@4/p{p:g}") for p in powers}}


def size_targets(args, size: Dict[str, Any]) -> Dict[str, Any]:
    pts = {(p["rows"], p["dim"]): p for p in size["points"] if "modes" in p}
    rows = C.int_list(args.rows)
    lo, hi = pts.get((rows[0], args.base_dim)), pts.get((rows[-1], args.base_dim))
    out: Dict[str, Any] = {}
    big = hi["modes"] if hi else {}
    out["largest_trains_in_all_modes"] = {
        "rows": rows[-1], "dim": args.base_dim,
        "met": bool(hi) and all("rows_per_s" in big.get(m, {}) for m in SIZE_MODES),
        "per_mode": {m: ("ok" if "rows_per_s" in big.get(m, {}) else big.get(m, {}).get("skipped", "missing"))
                     for m in SIZE_MODES}}
    falls = {}
    for m in SIZE_MODES:
        a = (lo or {}).get("modes", {}).get(m, {}).get("rows_per_s")
        b = big.get(m, {}).get("rows_per_s")
        falls[m] = a / b if a and b else None
    out["per_row_throughput_fall"] = {"ratio_smallest_over_largest": falls, "threshold": 2.0,
                                      "met": all(v is not None and v < 2.0 for v in falls.values())}
    return out


def plot(args, result: Dict[str, Any], png: Path) -> None:
    plt = C.pyplot()
    fig, axes = plt.subplots(2, 3, figsize=(17, 9))
    colors = {"sync": "tab:blue", "dgl": "tab:gray", "async@4": "tab:orange", "oac@4": "tab:green"}
    size = result.get("size")
    if size:
        pts = [p for p in size["points"] if "modes" in p]
        for col, (fixed, xkey, xlabel) in enumerate([("dim", "rows", "table rows"), ("rows", "dim", "dim")]):
            sel = [p for p in pts if p[fixed] == (args.base_dim if fixed == "dim" else args.dims_rows)]
            sel.sort(key=lambda p: p[xkey])
            ax, axm = axes[0][col], axes[1][col]
            for m in SIZE_MODES:
                xs = [p[xkey] for p in sel if "rows_per_s" in p["modes"].get(m, {})]
                ys = [p["modes"][m]["rows_per_s"] for p in sel if "rows_per_s" in p["modes"].get(m, {})]
                ms = [p["modes"][m]["peak_above_baseline_mib"] / 1024 for p in sel
                      if "rows_per_s" in p["modes"].get(m, {})]
                ax.plot(xs, ys, "o-", color=colors[m], label=m)
                axm.plot(xs, ms, "o-", color=colors[m], label=m)
            cx = [p[xkey] for p in sel if "oac@4" in p["modes"] and "ceiling" in p["modes"]["oac@4"]]
            cy = [p["modes"]["oac@4"]["ceiling"]["random_rows_s"] for p in sel
                  if "oac@4" in p["modes"] and "ceiling" in p["modes"]["oac@4"]]
            ax.plot(cx, cy, "k:", label="random-row gather ceiling (dgl-oac row width)")
            for a in (ax, axm):
                a.set_xscale("log")
                a.set_xlabel(xlabel)
                a.grid(alpha=0.3)
            ax.set_yscale("log")
            ax.set_ylabel("embedding rows / s")
            axm.set_ylabel("peak RSS the mode added (GiB)")
            tx = [p[xkey] for p in sel]
            state = OPT_STATE[args.optimizer]
            axm.plot(tx, [p["rows"] * (p["dim"] + state(p["dim"])) * 4 / 2**30 for p in sel], "k:",
                     label="table + optimizer state (steady)")
            axm.axhline(result["env"]["memory_gib"], color="r", ls=":", lw=1, label="machine memory")
            ax.set_title(f"throughput vs {xlabel}" + (f" (dim {args.base_dim})" if fixed == "dim" else
                                                        f" ({args.dims_rows:,} rows)"))
            axm.set_title(f"peak memory vs {xlabel}")
            ax.legend(fontsize=7)
            axm.legend(fontsize=7)
    pf = result.get("prefetch")
    if pf:
        ax = axes[0][2]
        d = pf["depths"]
        for m, c in (("async", "tab:orange"), ("oac", "tab:green")):
            ax.plot(d, [pf["summary"][f"{m}@{p}"]["batches_per_s"]["median"] for p in d], "o-", color=c, label=m)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("prefetch depth")
        ax.set_ylabel("batches / s")
        ax2 = ax.twinx()
        ax2.plot(d, [pf["summary"][f"oac@{p}"]["conflict_rate"] for p in d], "s--", color="tab:red",
                 label="conflict rate")
        ax2.set_ylabel("conflict rate (oac)", color="tab:red")
        ax.legend(loc="upper left", fontsize=8)
        ax.set_title("prefetch depth")
    sk = result.get("skew")
    if sk:
        ax = axes[1][2]
        ps = sk["powers"]
        ax.plot(ps, [sk["summary"][f"oac@4/p{p:g}"]["conflict_rate"] for p in ps], "s--", color="tab:red",
                label="conflict rate (oac@4)")
        ax.set_xlabel("degree exponent (lower = more skewed)")
        ax.set_ylabel("conflict rate", color="tab:red")
        ax2 = ax.twinx()
        ax2.plot(ps, [sk["oac_over_async"][p]["median"] for p in ps], "o-", color="tab:green",
                 label="oac / async (batches/s)")
        ax2.set_ylabel("oac / async")
        ax.legend(loc="upper right", fontsize=8)
        ax2.legend(loc="lower right", fontsize=8)
        ax.set_title("skew")
    fig.suptitle(f"dgl-oac scale ({args.optimizer} rows; torch threads {result['torch_threads']}, "
                 f"OMP_WAIT_POLICY {result['env']['omp_wait_policy']})", fontsize=10)
    C.save_figure(fig, png, dpi=100)


def report(args, result: Dict[str, Any]) -> None:
    size = result.get("size")
    if size:
        rows = []
        for p in size["points"]:
            if "error" in p:
                rows.append([f"{p['rows']:.0e}", p["dim"], "ERROR", p["error"][-80:], *[""] * 8])
                continue
            for m in SIZE_MODES:
                r = p["modes"].get(m, {})
                if "skipped" in r:
                    rows.append([f"{p['rows']:.0e}", p["dim"], m, "skipped: " + r["skipped"], *[""] * 8])
                    continue
                ce = r["ceiling"]
                rows.append([f"{p['rows']:.0e}", p["dim"], m, r["rows_per_s"], r["batches_per_s"],
                             r["build_s"], r["peak_rss_mib"] / 1024, r["peak_above_baseline_mib"] / 1024,
                             r["table_gib"],
                             ce["random_rows_s"], ce["contiguous_gb_s"] / max(ce["random_gb_s"], 1e-9),
                             f"{100 * r['rows_per_s_fraction_of_random_gather']:.1f}%"])
        C.print_table("size sweep (rows/s = embedding rows trained per second)",
                      ["rows", "dim", "mode", "rows/s", "batch/s", "setup s", "peak GiB", "mode GiB", "table GiB",
                       "gather ceil rows/s", "contig/random", "of ceiling"], rows)
        tg = result["targets"]
        print(f"\n1e7-row target: {tg['largest_trains_in_all_modes']}")
        print(f"per-row throughput fall (smallest/largest table): {tg['per_row_throughput_fall']}")
    pf = result.get("prefetch")
    if pf:
        C.print_table("prefetch sweep", ["depth", "rows/batch", "async b/s", "oac b/s", "oac/async", "conflict rate"],
                      [[p, pf["summary"][f"oac@{p}"]["rows_per_batch"], pf["summary"][f"async@{p}"]["batches_per_s"]["median"],
                        pf["summary"][f"oac@{p}"]["batches_per_s"]["median"], pf["oac_over_async"][p]["median"],
                        pf["summary"][f"oac@{p}"]["conflict_rate"]] for p in pf["depths"]])
    sk = result.get("skew")
    if sk:
        C.print_table("skew sweep (prefetch 4)", ["power", "max deg", "top1% edge share", "rows/batch", "async b/s",
                                                  "oac b/s", "oac/async", "conflict rate"],
                      [[p, sk["degree_stats"][p]["max_degree"], sk["degree_stats"][p]["top1pct_edge_share"],
                        sk["summary"][f"oac@4/p{p:g}"]["rows_per_batch"],
                        sk["summary"][f"async@4/p{p:g}"]["batches_per_s"]["median"],
                        sk["summary"][f"oac@4/p{p:g}"]["batches_per_s"]["median"],
                        sk["oac_over_async"][p]["median"], sk["summary"][f"oac@4/p{p:g}"]["conflict_rate"]]
                       for p in sk["powers"]])


def main(argv: Optional[List[str]] = None) -> Dict[str, Any]:
    args = parse(argv)
    if args.child:
        print(json.dumps(child(json.loads(args.child)), default=float))
        return {}
    if args.threads:
        torch.set_num_threads(args.threads)
    env = C.environment()
    skip = set(C.str_list(args.skip))
    with tempfile.TemporaryDirectory(prefix="dgl-oac-scale-") as tmp:
        cache = Path(args.cache) if args.cache else Path(tmp)
        cache.mkdir(parents=True, exist_ok=True)
        total = (0 if "size" in skip else len(size_points(args)))
        total += 0 if "prefetch" in skip else 2 * len(C.int_list(args.prefetch)) * args.rounds
        total += 0 if "skew" in skip else 2 * len(C.float_list(args.powers)) * args.rounds
        bar = tqdm(total=total, desc=NAME, disable=not args.progress, dynamic_ncols=True)
        result: Dict[str, Any] = {"benchmark": NAME, "env": env, "args": vars(args),
                                  "torch_threads": torch.get_num_threads()}
        if "size" not in skip:
            result["size"] = run_size(args, cache, bar)
            result["targets"] = size_targets(args, result["size"])
        if "prefetch" not in skip:
            result["prefetch"] = run_prefetch(args, cache, bar)
        if "skew" not in skip:
            result["skew"] = run_skew(args, cache, bar)
        bar.close()
    return C.publish(args, NAME, result, lambda png: plot(args, result, png), lambda: report(args, result))


if __name__ == "__main__":
    main()
