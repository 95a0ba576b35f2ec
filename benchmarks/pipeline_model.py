"""A cost model of dgl-oac's schedule, fed by the stage times of a ``bench_modes.py`` run: predicted against
measured throughput on the CPU, then a PREDICTION for a GPU from stated parameters.

Stages per batch (ms, medians over rounds, from ``loader.stats`` and the benchmark's step timers): S sample,
G gather + copy, V validate (+ patch), C the model's forward/backward and dense step, U the sparse step
(commit; in sync it also writes the rows through), W the write-back thread's busy time, O the rest of the
caller's loop. Stage costs are taken from the sync run (where nothing overlaps, so they are costs, not
contended times), and from each pipelined run only what that mode adds or moves: its V, U and W.

Overlap rules (``cores`` CPU cores, the model's ops on ``t`` torch threads):
  - sync: nothing overlaps, a step is the sum S + G + V + C + U + O.
  - async/oac at depth k >= 1: the caller runs S + V + C + U + O; G (gather thread) and W (write-back thread)
    run in the background at idle priority, so only on cores the caller leaves free: one core while the caller
    is in its single-threaded parts, ``cores - t`` cores while it is in the model's compute. Background work
    that does not fit there is paid as a wait, spread over at most ``min(cores, 2)`` threads. A step is at
    least the slowest single stage (G, W: each is one thread). Depth only enters through the measured V of
    that depth (conflict rate).
  - prefetch="auto": the controller keeps the faster of depth 0 (sync's step) and depth k.
On 2 cores with t = 2 the model's compute leaves no core free: a pipelined step gains only what the
background work can hide in the caller's serial parts (sampling, validate, commit, Python).

GPU: C and U run on the device (``device_ms`` per batch: forward, backward, dense and row optimizer steps), rows
cross the bus both ways (``--h2d-gbps``, rows x row floats x 4 bytes each way), oac patches stale rows on the
device (``--patch-ns-per-row`` x conflict rate x rows). The CPU keeps S, G and W (measured); the caller thread
only launches device work, so background threads have every core. Async with a staleness rule (``async-gap``,
``async-lookahead``) runs async's schedule and adds, on the device, the catch-up to the current rows (the same
patch as oac's, at commit) and its own per-row arithmetic (``--rule-ns-per-row`` x rows). ``resident`` (the
table and its state on the device: the ceiling) is the caller's path of async with nothing else: S +
``device_ms`` + O, no bus, no gather, no write-back.

From a run on the device (``modes``: each pipelined mode's own measured V, U, G and W there) the model uses what
that run shows: the caller's thread launches the model's work while the device runs it, so C and the device
time overlap (the larger counts); the caller also runs the mode's own validate V and sparse step U (hand-out
and launches, on the CPU); and the gather and write-back threads take the time they took in that mode (on the
H200 the gather thread took 11-16 ms a batch where sync's caller, with every torch thread, took 2). A sync run
measured on the device is the sum of its own stages (S + G + V + max(C, device) + U + O: the bus is inside G and
U). Without ``modes`` (a CPU run, a plan) the stated parameters alone, as above.

``device_ms`` is MEASURED: from a bench_modes run on the device, it is each step's time on the compute stream
(CUDA events around the training step, ``ms_per_step["device_step"]``) of the resident configuration (else oac's,
else async's at the target depth); the prediction is then set beside the same run's measured batches/s. From a
CPU run there is nothing to measure it from: give ``--device-ms`` (the prediction is skipped otherwise).

    python benchmarks/pipeline_model.py                                # bench_modes.py's default output
    python benchmarks/pipeline_model.py --input out/bench_modes.json   # a run on the device: measured device ms
    python benchmarks/pipeline_model.py --input out/bench_modes.jsonl  # its --stream, if it was cut short
    python benchmarks/pipeline_model.py --input X.json --h2d-gbps 12 --device-ms 4
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as C  # noqa: E402

NAME = "pipeline_model"
TARGET_ERROR = 0.15


def sync_stages(ms: Dict[str, float]) -> Dict[str, float]:
    """Stage costs (ms per batch) of a sync run's ``ms_per_step``: S, G, V, C, U and the rest O."""
    st = {"S": ms["sample"], "G": ms["gather"] + ms.get("copy", 0.0), "V": ms["validate"],
          "C": ms["fwd_bwd_dense"], "U": ms["sparse_step"]}
    st["O"] = max(ms["step_total"] - sum(st.values()), 0.0)
    return st


def predict_sync(st: Dict[str, float]) -> float:
    """ms per step: every stage in turn."""
    return st["S"] + st["G"] + st["V"] + st["C"] + st["U"] + st["O"]


def predict_pipelined(st: Dict[str, float], V: float, U: float, W: float, cores: int, threads: int) -> float:
    """ms per step at depth >= 1: sync's costs ``st`` with the mode's own validate ``V``, sparse step ``U`` and
    write-back busy time ``W`` (module docstring: overlap rules)."""
    caller = st["S"] + V + st["C"] + U + st["O"]
    background = st["G"] + W
    free = (cores - 1) * (caller - st["C"]) + max(cores - threads, 0) * st["C"]
    wait = max(background - free, 0.0) / min(cores, 2)
    return max(caller + wait, st["G"], W)


def predict_gpu(st: Dict[str, float], W: float, rows: float, row_floats: int, conflict: float, h2d_gbps: float,
                device_ms: float, patch_ns_per_row: float, cores: int, net_sync_ms: float = 0.0,
                net_oac_ms: float = 0.0, rule_ns_per_row: Optional[float] = None,
                modes: Optional[Dict[str, Dict[str, float]]] = None) -> Dict[str, float]:
    """ms per step on a GPU for sync, async, oac and resident (module docstring): the CPU stages S, G, O from
    the measured ``st``, the write-back ``W``; ``rows`` per batch of ``row_floats`` floats. With several trainers
    (``scale_out.py``) a step's collectives are on the caller's path: ``net_sync_ms`` (sync and async: gradients,
    dense all-reduce) and ``net_oac_ms`` (oac: those, the registration and the forwarded rows). With
    ``rule_ns_per_row``, also ``"rule"``: async with a staleness rule (one process). ``modes``: stages measured
    on the device, ``{"async"|"oac": {"V", "U", "G", "W"}}`` (module docstring)."""
    bus = rows * row_floats * 4 / (h2d_gbps * 1e9) * 1e3  # ms one way
    patch = conflict * rows * patch_ns_per_row * 1e-6
    if modes is not None:
        rule_ms = None if rule_ns_per_row is None else rows * rule_ns_per_row * 1e-6
        return _predict_measured_gpu(st, modes, bus, patch, device_ms, rule_ms)
    sync = st["S"] + st["G"] + bus + device_ms + bus + W + st["O"] + net_sync_ms
    cpu_bound = (st["S"] + st["G"] + W + st["O"]) / cores
    a = max(st["S"] + device_ms + st["O"] + net_sync_ms, st["G"] + bus, W + bus, cpu_bound)
    o = max(st["S"] + device_ms + patch + st["O"] + net_oac_ms, st["G"] + bus, W + bus, cpu_bound)
    resident = st["S"] + device_ms + st["O"]  # the table on the device: the caller's path alone
    out = {"sync": sync, "async": a, "oac": o, "resident": resident, "bus_ms_one_way": bus, "patch_ms": patch}
    if rule_ns_per_row is not None:  # the rules overwrite rows, as oac: oac's write-back W
        out["rule_ms"] = rows * rule_ns_per_row * 1e-6
        out["rule"] = max(st["S"] + device_ms + patch + out["rule_ms"] + st["O"] + net_sync_ms, st["G"] + bus,
                          W + bus, cpu_bound)
    return out


def _predict_measured_gpu(st: Dict[str, float], modes: Dict[str, Dict[str, float]], bus: float, patch: float,
                          device_ms: float, rule_ms: Optional[float] = None) -> Dict[str, float]:
    """:func:`predict_gpu` from a run on the device (module docstring): ``st`` the sync run's stages there;
    ``rule_ms``: a staleness rule's own arithmetic, beside the catch-up (oac's patch) on async's schedule."""
    model = max(st["C"], device_ms)  # the caller launches while the device runs

    def pipelined(m: Dict[str, float], extra: float) -> float:
        caller = st["S"] + m["V"] + m["U"] + model + extra + st["O"]
        return max(caller, m["G"] + bus, m["W"] + bus)

    out = {"sync": st["S"] + st["G"] + st["V"] + model + st["U"] + st["O"],
           "async": pipelined(modes["async"], 0.0), "oac": pipelined(modes["oac"], patch),
           "resident": st["S"] + device_ms + st["O"], "bus_ms_one_way": bus, "patch_ms": patch}
    if rule_ms is not None:
        out["rule_ms"], out["rule"] = rule_ms, pipelined(modes["async"], patch + rule_ms)
    return out


def model_section(sec: Dict[str, Any], cores: int) -> List[Dict[str, Any]]:
    """Predicted vs measured batches/s for every configuration of one bench_modes workload section."""
    summary = sec["summary"]
    out = []
    # (configurations sampling in worker processes, labelled .../wN, are not modelled)
    summary = {lab: s for lab, s in summary.items() if "/w" not in lab}
    syncs = {s["threads"]: sync_stages(s["ms_per_step"]) for s in summary.values() if s["mode"] == "sync"}
    deep: Dict[int, float] = {}  # threads -> best predicted pipelined ms (for auto)
    for lab, s in summary.items():
        if s["mode"] not in ("async", "oac") or s["prefetch"] == "auto" or s["priority"] == "normal":
            continue
        ms = s["ms_per_step"]
        pred = predict_pipelined(syncs[s["threads"]], ms["validate"], ms["sparse_step"], ms["writeback_bg"], cores,
                                 s["threads"])
        if s["mode"] == "oac":
            deep[s["threads"]] = min(deep.get(s["threads"], float("inf")), pred)
        out.append(row(lab, pred, s))
    for lab, s in summary.items():
        if s["mode"] == "sync":
            out.append(row(lab, predict_sync(syncs[s["threads"]]), s))
        elif s["mode"] == "oac" and s["prefetch"] == "auto" and s["threads"] in deep:
            out.append(row(lab, min(predict_sync(syncs[s["threads"]]), deep[s["threads"]]), s))
    return out


def row(label: str, predicted_ms: float, s: Dict[str, Any]) -> Dict[str, Any]:
    measured = s["batches_per_s"]["median"]
    predicted = 1e3 / predicted_ms
    return {"config": label, "predicted_batches_per_s": predicted, "measured_batches_per_s": measured,
            "error": predicted / measured - 1.0}


#: the configurations whose device time a step is the model's ``device_ms``, best first (module docstring)
DEVICE_MS_FROM = ("resident", "oac", "async")


def measured_device_ms(summary: Dict[str, Any], threads: int, depth: int) -> Optional[Tuple[str, float]]:
    """``(label, ms)``: the device time a step of the first of :data:`DEVICE_MS_FROM` that ran on the device
    (``ms_per_step["device_step"]``) with ``threads`` torch threads; None for a run without one (a CPU run)."""
    for mode in DEVICE_MS_FROM:
        for lab, s in summary.items():
            if s["mode"] == mode and s["threads"] == threads and s["prefetch"] in (1, depth) \
                    and "device_step" in s["ms_per_step"]:
                return lab, s["ms_per_step"]["device_step"]
    return None


def gpu_section(sec: Dict[str, Any], args: argparse.Namespace, depth: int) -> Dict[str, Any]:
    """The GPU prediction from the sync run and the oac run at ``depth`` (idle priority) of the first thread
    count, with ``device_ms`` measured (:func:`measured_device_ms`) or given; beside what the run measured
    when it ran on the device. ``{"skipped": why}`` where it cannot be made."""
    summary = {lab: s for lab, s in sec["summary"].items() if "/w" not in lab and s["priority"] != "normal"}
    sync = next((s for s in summary.values() if s["mode"] == "sync"), None)
    oac = next((s for s in summary.values() if s["mode"] == "oac" and s["prefetch"] == depth
                and sync is not None and s["threads"] == sync["threads"]), None)
    if sync is None or oac is None:
        return {"skipped": f"needs a sync run and an oac run at depth {depth} (idle priority)"}
    measured = measured_device_ms(summary, sync["threads"], depth)
    if args.device_ms is not None:
        device_ms, source = args.device_ms, "--device-ms"
    elif measured is not None:
        device_ms, source = measured[1], f"measured: {measured[0]}'s device time a step"
    else:
        return {"skipped": "no device time in the input (a CPU run): pass --device-ms"}
    w = sec["workload"]
    asy = next((s for s in summary.values() if s["mode"] == "async" and s["prefetch"] == depth
                and s["threads"] == sync["threads"]), None)
    modes = None
    if measured is not None and args.device_ms is None and asy is not None:  # each mode's stages on the device
        modes = {m: {"V": s["ms_per_step"]["validate"], "U": s["ms_per_step"]["sparse_step"],
                     "G": s["ms_per_step"]["gather"] + s["ms_per_step"].get("copy", 0.0),
                     "W": s["ms_per_step"]["writeback_bg"]} for m, s in (("async", asy), ("oac", oac))}
    # the rules' catch-up patches the rows oac's hand-out patches (the same read lag): oac's conflict rate
    ms = predict_gpu(sync_stages(sync["ms_per_step"]), oac["ms_per_step"]["writeback_bg"], sync["rows_per_batch"],
                     w["row_floats"], oac["conflict_rate"] or 0.0, args.h2d_gbps, device_ms,
                     args.patch_ns_per_row, args.cores, rule_ns_per_row=args.rule_ns_per_row, modes=modes)
    out: Dict[str, Any] = {**{f"{m}_batches_per_s": 1e3 / ms[m] for m in GPU_MODES}, **ms,
                           "device_ms": device_ms, "device_ms_source": source,
                           "stages_from": "each mode's run on the device" if modes else "the stated parameters"}
    if "rule" in ms:
        out["rule_batches_per_s"] = 1e3 / ms["rule"]
        out["rule_vs_async"] = ms["async"] / ms["rule"]
    if measured is not None:  # the run was on the device: each mode's prediction beside its measurement
        t = sync["threads"]
        labels = {"sync": f"sync/t{t}", "async": f"async@{depth}/t{t}", "oac": f"oac@{depth}/t{t}",
                  "resident": f"resident/t{t}"}
        out["measured"] = {m: row(lab, ms[m], summary[lab]) for m, lab in labels.items() if lab in summary}
    return out


#: the modes predict_gpu predicts for one trainer, in the order they are reported
GPU_MODES = ("sync", "async", "oac", "resident")


def parse(argv: Optional[List[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--input", default=str(C.RESULTS / "bench_modes.json"), help="a bench_modes.py JSON")
    p.add_argument("--out", default=str(C.RESULTS / f"{NAME}.json"), help="JSON output (PNG beside it)")
    p.add_argument("--cores", type=int, default=2, help="CPU cores of the machine that ran --input")
    p.add_argument("--h2d-gbps", type=float, default=12.0, help="GPU: host<->device GB/s (pinned, each way)")
    p.add_argument("--device-ms", type=float, default=None,
                   help="GPU: device ms per batch for forward, backward, dense and row optimizer steps (default: "
                        "measured by the input run on the device; a CPU run needs it given)")
    p.add_argument("--patch-ns-per-row", type=float, default=2.0, help="GPU: device ns to patch one stale row")
    p.add_argument("--rule-ns-per-row", type=float, default=4.0,
                   help="GPU: device ns of a staleness rule's own arithmetic per row of a batch (Gap-Aware: five "
                        "elementwise passes over the row's values; look-ahead: four over a moved row's moments)")
    return p.parse_args(argv)


def load_bench(path: str) -> Dict[str, Any]:
    """A bench_modes result: its JSON, or its ``--stream`` (JSON lines: the workloads it finished), in the
    JSON's layout (per-workload sections; a JSON from before ``--workload`` holds one, node-adam-128)."""
    import json

    text = Path(path).read_text()
    if path.endswith(".jsonl"):
        lines = [json.loads(x) for x in text.splitlines() if x.strip()]
        start = next((x for x in lines if x.get("kind") == "start"), None)
        if start is None:
            raise SystemExit(f"{path} is not a bench_modes.py --stream (no start line)")
        sections = {x["name"]: x for x in lines if x.get("kind") == "workload"}
        return {"benchmark": start["benchmark"], "env": start["env"], "args": start["args"], "workloads": sections}
    bench = json.loads(text)
    if "workloads" not in bench and "summary" in bench:  # a bench_modes JSON from before --workload: one workload
        bench["workloads"] = {"node-adam-128": {"summary": bench["summary"], "workload": bench["workload"]}}
    return bench


def main(argv: Optional[List[str]] = None) -> Dict[str, Any]:
    args = parse(argv)
    bench = load_bench(args.input)
    if bench.get("benchmark") != "bench_modes" or "workloads" not in bench:
        raise SystemExit(f"{args.input} is not a bench_modes.py JSON")
    device = str(bench["args"].get("device", "cpu"))
    result: Dict[str, Any] = {"benchmark": NAME, "input": args.input, "input_env": bench["env"], "args": vars(args),
                              "input_device": device, "cpu": {}, "gpu_prediction": {}}
    for name, sec in bench["workloads"].items():
        if device == "cpu":  # the CPU overlap rules: only a CPU run is theirs to predict
            result["cpu"][name] = model_section(sec, args.cores)
        result["gpu_prediction"][name] = gpu_section(sec, args, bench["args"]["target_prefetch"])
    errors = [abs(r["error"]) for rows in result["cpu"].values() for r in rows]
    result["within_target"] = within(errors)
    gpu_errors = [abs(r["error"]) for g in result["gpu_prediction"].values() for r in g.get("measured", {}).values()]
    if gpu_errors:
        result["gpu_within_target"] = within(gpu_errors)
    out = Path(args.out)
    C.finish({**result, "env": C.environment()}, out)
    plot(result, C.png_path(out))
    report(result, args)
    print(f"\nwrote {out} and {C.png_path(out)}")
    return result


def within(errors: List[float]) -> Dict[str, float]:
    """The largest absolute error and the share within :data:`TARGET_ERROR`."""
    return {"max_abs_error": max(errors, default=float("nan")), "target": TARGET_ERROR,
            "share_within": sum(e <= TARGET_ERROR for e in errors) / max(len(errors), 1)}


def report(result: Dict[str, Any], args: argparse.Namespace) -> None:
    for name, rows in result["cpu"].items():
        C.print_table(f"{name}: CPU, predicted vs measured batches/s (measured: {result['input']})",
                      ["config", "predicted", "measured", "error"],
                      [[r["config"], r["predicted_batches_per_s"], r["measured_batches_per_s"],
                        f"{100 * r['error']:+.0f}%"] for r in rows])
    if result["cpu"]:
        w = result["within_target"]
        print(f"\n{100 * w['share_within']:.0f}% of configurations within {100 * w['target']:.0f}% "
              f"(largest error {100 * w['max_abs_error']:.0f}%)")
    gpu = {n: g for n, g in result["gpu_prediction"].items() if "skipped" not in g}
    for n, g in result["gpu_prediction"].items():
        if "skipped" in g:
            print(f"\n{n}: no GPU prediction: {g['skipped']}")
    dev = result["input_device"]
    if not gpu:
        return
    C.print_table(f"GPU prediction ({'not measured' if dev == 'cpu' else 'beside the run on ' + dev}): "
                  f"{args.h2d_gbps} GB/s each way, {args.patch_ns_per_row} ns a patched row; CPU stages as measured; "
                  f"device ms a batch: see its source",
                  ["workload", "device ms", "source", *(f"{m} b/s" for m in GPU_MODES), "oac/sync", "oac/resident",
                   "bus ms", "patch ms", "async+rule b/s", "rule/async"],
                  [[n, g["device_ms"], g["device_ms_source"], *(g[f"{m}_batches_per_s"] for m in GPU_MODES),
                    g["oac_batches_per_s"] / g["sync_batches_per_s"],
                    g["oac_batches_per_s"] / g["resident_batches_per_s"], g["bus_ms_one_way"], g["patch_ms"],
                    g["rule_batches_per_s"], g["rule_vs_async"]] for n, g in gpu.items()])
    rows = [[n, r["config"], r["predicted_batches_per_s"], r["measured_batches_per_s"], f"{100 * r['error']:+.0f}%"]
            for n, g in gpu.items() for r in g.get("measured", {}).values()]
    if rows:
        C.print_table(f"on the device: predicted vs measured batches/s (measured: {result['input']})",
                      ["workload", "config", "predicted", "measured", "error"], rows)


def plot(result: Dict[str, Any], png: Path) -> None:
    plt = C.pyplot()
    names = list(result["cpu"])
    fig, axes = plt.subplots(1, len(names) + 1, figsize=(4.5 * (len(names) + 1), 4.5), squeeze=False)
    for ax, name in zip(axes[0], names):
        rows = result["cpu"][name]
        x = range(len(rows))
        ax.bar([i - 0.2 for i in x], [r["measured_batches_per_s"] for r in rows], 0.4, label="measured")
        ax.bar([i + 0.2 for i in x], [r["predicted_batches_per_s"] for r in rows], 0.4, label="predicted")
        ax.set_xticks(list(x), [r["config"] for r in rows], rotation=70, fontsize=7)
        ax.set_title(f"{name} (CPU)", fontsize=9)
        ax.set_ylabel("batches / s")
        ax.legend(fontsize=7)
    ax = axes[0][-1]
    gpu = {n: g for n, g in result["gpu_prediction"].items() if "skipped" not in g}
    modes = (*GPU_MODES, "rule")
    width = 0.8 / len(modes)
    for j, m in enumerate(modes):
        xs = [i + width * (j - (len(modes) - 1) / 2) for i in range(len(gpu))]
        ax.bar(xs, [g[f"{m}_batches_per_s"] for g in gpu.values()], width,
               label="async + staleness rule" if m == "rule" else m)
        measured = [(x, g["measured"][m]["measured_batches_per_s"]) for x, g in zip(xs, gpu.values())
                    if m in g.get("measured", {})]
        if measured:
            ax.plot(*zip(*measured), "k_", ms=12, mew=2, label="measured" if j == 0 else None)
    ax.set_xticks(range(len(gpu)), list(gpu), rotation=30, fontsize=7)
    on_device = result["input_device"] != "cpu"
    ax.set_title("GPU: predicted (bars)" + (", measured (marks)" if on_device else ": PREDICTION, not measured"),
                 fontsize=9)
    ax.legend(fontsize=7)
    C.save_figure(fig, png)


if __name__ == "__main__":
    main()
