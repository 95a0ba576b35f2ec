"""``scale_out.py --network``: 2 machines over an emulated network (``scripts/netns.py``), one trainer each.

For each round trip in ``--network`` (ms) a network of 2 namespaces is up for the whole run (all at once, on
their own subnets), and each round runs every (latency, configuration, layout) once, in a rotated order
(``_common.rotated``), so ratios between modes are taken over runs that saw the same machine load. A run is
``torchrun --nnodes=2`` (an agent per namespace, rendezvous on machine 0's address) of ``dgl-oac train --task
node`` (the synthetic graph, SparseAdam rows, ``--out`` and ``--checkpoint-dir``), or DGL's own
``DistEmbedding`` + ``dgl.distributed.optim.SparseAdam`` through DGL's servers (``dgl_dist_embedding.py``).

Per run: steps/s of a trainer in the last epoch (the first warms up: threads, ``prefetch="auto"``'s choice), that
epoch's seconds, bytes per step and machine (the interface's transmit counter, whole run / steps: what the wire
carried, headers included; and rank 0's ``Group.sent`` by kind: the collectives' payload), peak PSS per machine
(its namespace's processes summed, torchrun's agent included), and whether the final table (value and optimizer
state, from the checkpoint) is bitwise the sync run's of the same latency and round.

``async@k`` is naive async with several trainers (stale reads, never patched; the N-trainer step): not exact,
so it is left out of the bitwise check.
"""
from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Dict, List, Optional

from tqdm.auto import tqdm

import _common as C
import netrun

def add_arguments(p: Any) -> None:
    g = p.add_argument_group("--network: 2 machines over an emulated network (root; scripts/netns.py)")
    g.add_argument("--network", default=None, help="round trips to measure, ms, comma-separated (e.g. 0.2,1)")
    g.add_argument("--rate-gbit", type=float, default=10.0, help="each machine's link rate, Gbit/s")
    g.add_argument("--net-configs", default="sync,async@4,oac@1,oac@4,oac@auto,dgl",
                   help="sync, async@k, oac@k, oac@auto, dgl (DGL's DistEmbedding + its SparseAdam)")
    g.add_argument("--net-layouts", default="auto",
                   help="table layouts: replicated, rows; 'auto': replicated, and rows when `dgl-oac train` has "
                        "--sharding")
    g.add_argument("--net-rounds", type=int, default=2, help="rounds (each runs every configuration once)")
    g.add_argument("--net-num-nodes", type=int, default=50_000, help="synthetic graph size")
    g.add_argument("--net-epochs", type=int, default=2, help="epochs a run (steps/s: the last)")
    g.add_argument("--net-dim", type=int, default=128)
    g.add_argument("--net-batch-size", type=int, default=1024)
    g.add_argument("--net-priority", default="idle", choices=["idle", "normal"],
                   help="--background-priority of the trainers")


def net_config(text: str) -> Dict[str, Any]:
    """``sync``, ``async@k``, ``oac@k``, ``oac@auto`` or ``dgl`` -> ``{"label", "mode", "prefetch"}``."""
    mode, _, depth = text.partition("@")
    if text in ("sync", "dgl"):
        return {"label": text, "mode": text, "prefetch": "1"}
    if mode in ("async", "oac") and (depth.isdigit() and int(depth) >= 1 or mode == "oac" and depth == "auto"):
        return {"label": text, "mode": mode, "prefetch": depth}
    raise ValueError(f"a --net-configs entry is sync, async@<k>, oac@<k>, oac@auto or dgl, got {text!r}")


def sharding_available() -> bool:
    """Whether ``dgl-oac train`` takes ``--sharding`` (the row-sharded layout)."""
    out = subprocess.run([sys.executable, "-m", "dgl_oac", "train", "--help"], capture_output=True, text=True,
                         cwd=C.REPO, env=netrun.env(_NoNet())).stdout
    return "--sharding" in out


class _NoNet:
    def env(self) -> Dict[str, str]:
        return {}


def check(args: Any) -> None:
    """Resolve the network settings on ``args`` (``latencies``, ``net_config_list``, ``layouts``)."""
    args.latencies = C.float_list(args.network)
    if not args.latencies or any(x < 0 for x in args.latencies):
        raise ValueError(f"--network takes round trips in ms >= 0, got {args.network!r}")
    args.net_config_list = [net_config(c) for c in C.str_list(args.net_configs)]
    layouts = C.str_list(args.net_layouts)
    if layouts == ["auto"]:
        layouts = ["replicated", "rows"] if sharding_available() else ["replicated"]
    if not layouts or any(x not in ("replicated", "rows") for x in layouts):
        raise ValueError(f"--net-layouts takes replicated, rows or auto, got {args.net_layouts!r}")
    args.layouts = layouts
    why = netrun.netns.available()
    if why is not None:
        raise RuntimeError(f"--network needs network namespaces (root): {why}")


def train_program(args: Any, cfg: Dict[str, Any], layout: str, out: Path, ckpt: Path) -> List[str]:
    prog = ["-m", "dgl_oac", "train", "--task", "node", "--num-nodes", str(args.net_num_nodes), "--epochs",
            str(args.net_epochs), "--mode", cfg["mode"], "--prefetch", cfg["prefetch"], "--threads", "1",
            "--optimizer", "adam", "--dim", str(args.net_dim), "--batch-size", str(args.net_batch_size),
            "--background-priority", args.net_priority, "--seed", str(args.seed), "--no-progress",
            "--out", str(out), "--checkpoint-dir", str(ckpt)]
    return prog + (["--sharding", layout] if layout != "replicated" else [])


def table_digest(ckpt: Path) -> Dict[str, Optional[str]]:
    """``{"table_sha256"}``: sha256 of the trained table (value ‖ optimizer state, every owner's rows) in
    ``ckpt``'s checkpoint; None, with ``table_error``, when the checkpoint cannot be read back."""
    from dgl_oac.checkpoint import CheckpointError, CheckpointReader

    try:
        with CheckpointReader(ckpt / "checkpoint.ckpt") as reader:
            return {"table_sha256": hashlib.sha256(reader.table("emb").contiguous().numpy().tobytes()).hexdigest()}
    except CheckpointError as exc:
        return {"table_sha256": None, "table_error": str(exc)[-300:]}


def run_dgl_oac(args: Any, net: Any, cfg: Dict[str, Any], layout: str, port: int, tmp: Path) -> Dict[str, Any]:
    out, ckpt = tmp / "run.json", tmp / "ckpt"
    prog = train_program(args, cfg, layout, out, ckpt)
    got = netrun.launch(net, [netrun.torchrun(net, i, port, prog) for i in range(net.machines)],
                        args.timeout, f"dgl-oac train {cfg['label']} {layout}")
    r = json.loads(out.read_text())
    steps, epochs = r["steps"], len(r["curve"])
    last = r["curve"][-1]["epoch_seconds"]
    return {"steps": steps, "steps_per_s": steps / epochs / last, "epoch_s": last, "train_s": r["train_seconds"],
            "sent_per_step_rank0": {k: v / steps for k, v in r.get("bytes_sent", {}).items()},
            "metrics": [{k: v for k, v in p.items() if k not in ("train_seconds", "epoch_seconds", "eval_seconds")}
                        for p in r["curve"]], **table_digest(ckpt), **_common_fields(got, steps),
            "patched": r["loader_stats"].get("rows_patched")}


def _common_fields(got: Dict[str, Any], steps: int) -> Dict[str, Any]:
    return {"wire_tx_bytes_per_step": [w["tx_bytes"] / steps for w in got["wire"]],
            "pss_peak_bytes": got["pss_peak_bytes"], "wall_s": got["wall_s"]}


def run(args: Any, result: Dict[str, Any]) -> Dict[str, Any]:
    """Every round; fills ``result["network"]``."""
    import dgl_dist_embedding as D

    items = [(lat, cfg, layout) for lat in args.latencies for cfg in args.net_config_list
             for layout in (args.layouts if cfg["mode"] != "dgl" else ["-"])]
    nets = [netrun.netns.Net(2, lat, args.rate_gbit, prefix=f"dgl-oac-l{j}", subnet=f"10.77.{10 + j}",
                             tag=f"doac{j}") for j, lat in enumerate(args.latencies)]
    runs: List[Dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="dgl-oac-net-") as tmpdir:
        tmp = Path(tmpdir)
        dgl_parts = D.prepare(args, tmp / "dgl") if any(c["mode"] == "dgl" for c in args.net_config_list) else None
        try:
            for net in nets:
                netrun.netns.down(net)  # a crashed run's
                netrun.netns.up(net)
            result["network"] = {"rate_gbit": args.rate_gbit, "layouts": args.layouts,
                                 "round_trip_ms": {str(n.delay_ms): n.rtt_ms for n in nets}, "runs": runs}
            todo = len(items) * args.net_rounds
            with tqdm(total=todo, desc="network runs", disable=not args.progress) as bar:
                for r in range(args.net_rounds):
                    for k, (lat, cfg, layout) in enumerate(C.rotated(items, r)):
                        net = nets[args.latencies.index(lat)]
                        row = {"round": r, "latency_ms": lat, "config": cfg["label"], "layout": layout}
                        bar.set_postfix_str(f"{lat} ms {cfg['label']} {layout}")
                        port = 29500 + (r * len(items) + k) % 500
                        with tempfile.TemporaryDirectory(dir=tmp) as one:
                            if cfg["mode"] == "dgl":
                                row.update(D.run(args, net, dgl_parts, port, Path(one)))
                            else:
                                row.update(run_dgl_oac(args, net, cfg, layout, port, Path(one)))
                        runs.append(row)
                        bar.update()
        finally:
            for net in nets:
                netrun.netns.down(net)
    result["network"]["summary"] = summarize(runs)
    result["network"]["agreement"] = agreement(runs)
    return result


def agreement(runs: List[Dict[str, Any]]) -> Dict[str, Any]:
    """Across every dgl-oac run (each latency, mode and layout): whether all have the same per-epoch losses and
    accuracies, and how many distinct table digests the readable checkpoints hold (1: bitwise one table)."""
    ours = [x for x in runs if "metrics" in x and not x["config"].startswith("async")]  # async: not exact
    digests = {x["table_sha256"] for x in ours if x.get("table_sha256")}
    return {"runs": len(ours), "same_metrics": all(x["metrics"] == ours[0]["metrics"] for x in ours),
            "tables_read": sum(1 for x in ours if x.get("table_sha256")), "distinct_tables": len(digests)}


def summarize(runs: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Per (latency, config, layout): medians over rounds; the ratio of steps/s to sync's (same layout, or
    replicated for dgl), taken per round, median; whether every round's table is bitwise sync's."""
    done = [x for x in runs if "skipped" not in x]
    keys = sorted({(x["latency_ms"], x["config"], x["layout"]) for x in runs}, key=lambda k: (k[0], k[1], k[2]))
    out = []
    for lat, label, layout in keys:
        mine = [x for x in done if (x["latency_ms"], x["config"], x["layout"]) == (lat, label, layout)]
        skipped = next((x["skipped"] for x in runs if (x["latency_ms"], x["config"]) == (lat, label)
                        and "skipped" in x), None)
        if not mine:
            out.append({"latency_ms": lat, "config": label, "layout": layout, "skipped": skipped})
            continue
        base_layout = "replicated" if layout == "-" else layout
        sync = {x["round"]: x for x in done if (x["latency_ms"], x["config"], x["layout"]) == (lat, "sync", base_layout)}
        ratios = [x["steps_per_s"] / sync[x["round"]]["steps_per_s"] for x in mine if x["round"] in sync]
        pairs = [(x, sync[x["round"]]) for x in mine if x["round"] in sync and "metrics" in x]
        # equal: every epoch's loss and accuracies, and the table (value ‖ state) where both checkpoints read back
        equal = [x["metrics"] == y["metrics"] and (x["table_sha256"] == y["table_sha256"] or
                                                   None in (x["table_sha256"], y["table_sha256"])) for x, y in pairs]
        tables = sum(1 for x, y in pairs if None not in (x["table_sha256"], y["table_sha256"]))
        out.append({"latency_ms": lat, "config": label, "layout": layout, "rounds": len(mine),
                    "steps_per_s": C.median(x["steps_per_s"] for x in mine),
                    "epoch_s": C.median(x["epoch_s"] for x in mine),
                    "vs_sync": C.spread(ratios),
                    "wire_tx_bytes_per_step": [C.median(x["wire_tx_bytes_per_step"][i] for x in mine) for i in (0, 1)],
                    "sent_per_step_rank0": mine[0].get("sent_per_step_rank0"),
                    "pss_peak_bytes": [max(x["pss_peak_bytes"][i] for x in mine) for i in (0, 1)],
                    "bitwise_equal_to_sync": all(equal) if equal else None, "tables_compared": tables,
                    "table_errors": sorted({x["table_error"] for x in mine if x.get("table_error")})})
    return out


def report(result: Dict[str, Any]) -> None:
    n = result["network"]
    rtt = ", ".join(f"{k} ms asked: {v['median']:.3f} measured" for k, v in n["round_trip_ms"].items())
    rows = []
    for s in n["summary"]:
        if s.get("skipped"):
            rows.append([s["latency_ms"], s["config"], s["layout"], "skipped", *[""] * 7])
            continue
        rows.append([s["latency_ms"], s["config"], s["layout"], s["steps_per_s"], s["vs_sync"]["median"],
                     s["epoch_s"], s["wire_tx_bytes_per_step"][0] / 1e6, s["wire_tx_bytes_per_step"][1] / 1e6,
                     s["pss_peak_bytes"][0] / 2**20, s["pss_peak_bytes"][1] / 2**20,
                     s["bitwise_equal_to_sync"]])
    C.print_table(f"2 machines, {n['rate_gbit']} Gbit/s links ({rtt}); steps/s of a trainer (last epoch), median "
                  f"over rounds", ["RTT ms", "config", "layout", "steps/s", "x sync", "epoch s", "MB/step m0",
                                   "MB/step m1", "PSS MiB m0", "PSS MiB m1", "== sync"], rows)
    for s in n["summary"]:
        if s.get("skipped"):
            print(f"  {s['config']}: {s['skipped']}")
    a = n.get("agreement")
    if a:
        print(f"  every dgl-oac run ({a['runs']}): same losses and accuracies every epoch: {a['same_metrics']}; "
              f"{a['tables_read']} tables read back from checkpoints, {a['distinct_tables']} distinct")


def plot(result: Dict[str, Any], ax: Any) -> None:
    """Steps/s against the round trip, one line per configuration and layout."""
    n = result["network"]
    lines: Dict[str, List[Any]] = {}
    for s in n["summary"]:
        if not s.get("skipped"):
            lines.setdefault(f"{s['config']} ({s['layout']})" if s["layout"] != "-" else s["config"], []).append(
                (s["latency_ms"], s["steps_per_s"]))
    ax.set_ylabel("steps / s (a trainer, 2 machines)")
    rtts = sorted({p[0] for pts in lines.values() for p in pts})
    if len(rtts) == 1:  # one round trip: bars, one per configuration and layout (a line needs two points)
        labels = sorted(lines)
        ax.bar(range(len(labels)), [lines[k][0][1] for k in labels], color="tab:blue")
        ax.set_xticks(range(len(labels)), labels, rotation=30, ha="right", fontsize=7)
        ax.set_title(f"2 machines, {n['rate_gbit']} Gbit/s, {rtts[0]:g} ms round trip (emulated)", fontsize=9)
        return
    for label, pts in lines.items():
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=label)
    ax.set_xlabel("round trip between machines, ms (emulated)")
    ax.set_title(f"2 machines, {n['rate_gbit']} Gbit/s", fontsize=9)
    ax.legend(fontsize=7)
