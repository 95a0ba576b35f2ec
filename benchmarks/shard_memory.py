"""Memory per machine of a table trained by N machines: the replicated layout against the sharded one.

Also what each layout sends a step (rank 0), and for the replicated layout both ways of keeping the other
machines' replicas current (``--mirror``: the written rows, or the step's gradients replayed there).

Each machine is one trainer process (``GROUP_RANK`` = its rank, as ``torchrun --nnodes`` sets it; one host
here, so the "machines" share its RAM, but each replica and each shard is separate memory). Every trainer
builds one ``NodeEmbedding`` of ``--rows`` x ``--dim`` with ``SparseAdam`` (value ‖ 2D + 1 state columns),
trains ``--steps`` steps of ``--batch`` random rows (``emb(ids)`` with grad, then ``step()``), and reports its
PSS (``/proc/self/smaps_rollup``: shared pages divided among the processes mapping them). Memory per machine is
the PSS of its process; the table's own share is printed beside it (the whole table, or ``1 / machines`` of it).

    python benchmarks/shard_memory.py                        # 2 and 4 machines -> results/shard_memory.json
    python benchmarks/shard_memory.py --machines 2 --rows 100000 --steps 3   # a smoke run
"""
from __future__ import annotations

import argparse
import datetime
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from tqdm.auto import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C  # noqa: E402

NAME = "shard_memory"


def pss_bytes() -> int:
    """This process's proportional set size, in bytes."""
    with open("/proc/self/smaps_rollup") as f:
        for line in f:
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no Pss line in /proc/self/smaps_rollup")


def _trainer(rank: int, world: int, init: str, args: argparse.Namespace, out: Any) -> None:
    os.environ["GROUP_RANK"] = str(rank)  # every trainer is a machine of its own
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=600))
    try:
        import dgl_oac

        emb = dgl_oac.NodeEmbedding(args.rows, args.dim, "table", sharding=args.layout,
                                    init_func=lambda t: t.uniform_(-0.1, 0.1))
        opt = dgl_oac.SparseAdam([emb], lr=0.01)
        gen = torch.Generator().manual_seed(rank)
        before = pss_bytes()
        sent = dict(emb.group.sent)  # (building the table: rank 0's initial values to every machine)
        t0 = time.perf_counter()
        for _ in range(args.steps):
            ids = torch.randint(0, args.rows, (args.batch,), generator=gen)
            emb(ids).square().sum().backward()
            opt.step()
        seconds = time.perf_counter() - t0
        emb.group.barrier("trained")
        per_step = {k: (v - sent.get(k, 0)) / args.steps for k, v in emb.group.sent.items()}
        out.put((rank, pss_bytes(), before, emb.store.table.numel() * 4, per_step, seconds / args.steps))
        emb.group.barrier("measured")
        emb.close()
    finally:
        dist.destroy_process_group()


def measure(machines: int, layout: str, args: argparse.Namespace, mirror: str = "step") -> Dict[str, Any]:
    """One run of ``machines`` trainers; every machine's PSS and table bytes (``mirror``: what a replicated
    table's other machines get of a step, ``dgl_oac.distributed.committer.MIRROR``)."""
    os.environ["DGL_OAC_MIRROR"] = mirror  # read by the spawned trainers when they import dgl_oac
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    run = argparse.Namespace(**{**vars(args), "layout": layout})
    with tempfile.TemporaryDirectory(prefix="dgl-oac-mem-") as tmp:
        procs = [ctx.Process(target=_trainer, args=(r, machines, f"file://{tmp}/rdv", run, out))
                 for r in range(machines)]
        for p in procs:
            p.start()
        got = sorted(out.get(timeout=900) for _ in procs)
        for p in procs:
            p.join(timeout=60)
    table = args.rows * (3 * args.dim + 1) * 4  # value and Adam's state, float32
    return {"machines": machines, "layout": layout, "mirror": mirror if layout == "replicated" else None,
            "seconds_per_step": [g[5] for g in got], "table_bytes": table,
            "pss_per_machine": [g[1] for g in got], "pss_before_training": [g[2] for g in got],
            "table_bytes_per_machine": [g[3] for g in got],
            "bytes_sent_per_step": [g[4] for g in got]}


def plot(result: Dict[str, Any], png: Path) -> None:
    plt = C.pyplot()
    runs = result["runs"]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    labels = [f"{r['machines']}m {r['layout']}" + (f"\n{r['mirror']}" if r["mirror"] else "") for r in runs]
    ax.bar(labels, [max(r["pss_per_machine"]) / 2**20 for r in runs], color="tab:blue", label="PSS per machine (max)")
    ax.bar(labels, [max(r["table_bytes_per_machine"]) / 2**20 for r in runs], color="tab:orange", width=0.4,
           label="table share (value + Adam state)")
    ax.set_ylabel("MiB")
    ax.set_title(f"{result['args']['rows']:,} x {result['args']['dim']} rows, SparseAdam")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=120)
    plt.close(fig)


def report(result: Dict[str, Any]) -> None:
    for r in result["runs"]:
        layout = r["layout"] + (f" (mirror: {r['mirror']})" if r["mirror"] else "")
        sent = r["bytes_sent_per_step"][0]
        print(f"{r['machines']} machines, {layout:27s}: PSS per machine "
              f"{[round(x / 2**20) for x in r['pss_per_machine']]} MiB; table share "
              f"{[round(x / 2**20) for x in r['table_bytes_per_machine']]} MiB of {r['table_bytes'] / 2**20:.0f}; "
              f"rank 0 sends {sum(sent.values()) / 1e6:.2f} MB a step (mirror {sent.get('mirror', 0) / 1e6:.2f}, "
              f"fetch {sent.get('fetch', 0) / 1e6:.2f}); {1e3 * max(r['seconds_per_step']):.0f} ms a step")


def main(argv: Optional[List[str]] = None) -> Dict[str, Any]:
    p = C.base_parser(__doc__.split("\n\n")[0], NAME)
    p.add_argument("--machines", default="2,4", help="comma-separated machine counts")
    p.add_argument("--rows", type=int, default=2_000_000)
    p.add_argument("--dim", type=int, default=32)
    p.add_argument("--batch", type=int, default=4096)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--mirror", default="step,rows", help="replicated layout: what other machines get of a step "
                                                          "(comma-separated: step, rows)")
    args = p.parse_args(argv)
    if args.quick:
        args.machines, args.rows, args.steps = "2", 20_000, 3
    plan = [(int(m), "replicated", mirror) for m in args.machines.split(",") for mirror in args.mirror.split(",")]
    plan += [(int(m), "rows", "step") for m in args.machines.split(",")]
    runs = [measure(m, layout, args, mirror)
            for m, layout, mirror in tqdm(plan, desc="machines x layout", disable=not args.progress)]
    result = {"benchmark": NAME, "args": vars(args), "env": C.environment(), "runs": runs}
    return C.publish(args, NAME, result, lambda png: plot(result, png), lambda: report(result))


if __name__ == "__main__":
    main()
