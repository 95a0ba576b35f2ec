"""An A/B of the public sparse step in one process, shared by ``segment_sums_ab.py`` and ``native_ab.py``.

Two tables of the same initial rows, the same batches (``bench_step``'s Zipf stream), one switch: before each
side's step the switch is set for that side (``Switch.set(new: bool)``), rounds alternate which side goes first;
times ``emb(ids)`` + backward + ``opt.step()`` (and counts the minor page faults of each step), and checks that both tables (values and optimizer state) end
bitwise equal, since each switch claims to change speed only.
"""
from __future__ import annotations

import resource
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

import _common as C
import torch
from tqdm.auto import tqdm

import dgl_oac
from bench_step import zipf_ids


@dataclass
class Switch:
    name: str                       # the benchmark's name (results/<name>.json)
    new: str                        # label of the side with the switch on
    old: str                        # label of the side with it off
    set: Callable[[bool], None]     # turn the switch on (True) or off (False); off again after the run
    opts: Dict[str, type]           # optimizer name -> class
    claim: str                      # what a difference between the tables would disprove


def parse(doc: str, sw: Switch, argv: Optional[List[str]] = None):
    p = C.base_parser(doc.split("\n\n")[0], sw.name)
    p.add_argument("--rows", type=int, default=300_000)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--ids", type=int, default=23_000)
    p.add_argument("--zipf", type=C.float_list, default=[1.1, 0.8])
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--warmup", type=int, default=5)
    args = p.parse_args(argv)
    if args.quick:
        args.rows, args.dim, args.ids, args.steps, args.warmup = 20_000, 32, 2_000, 6, 1
    return args


def run(args: Any, sw: Switch, s: float, opt_name: str, bar: Any) -> Dict[str, Any]:
    total = args.warmup + args.steps
    batches = zipf_ids(args.rows, args.ids, s, total, args.seed)
    gen = torch.Generator().manual_seed(args.seed + 1)
    grads = [torch.randn(args.ids, args.dim, generator=gen) for _ in range(4)]
    init = torch.empty(args.rows, args.dim).uniform_(-0.1, 0.1, generator=gen)
    sides = {}
    for name in (sw.new, sw.old):
        emb = dgl_oac.NodeEmbedding(args.rows, args.dim, f"ab_{sw.name}_{name}_{s}_{opt_name}",
                                    init_func=lambda t: t.copy_(init))
        sides[name] = (emb, sw.opts[opt_name]([emb], lr=0.05))
    ms: Dict[str, List[float]] = {name: [] for name in sides}
    faults: Dict[str, List[float]] = {name: [] for name in sides}  # minor page faults a step
    try:
        for r in range(total):
            for name in C.rotated(list(sides), r):
                emb, opt = sides[name]
                sw.set(name == sw.new)
                f0, t0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, time.perf_counter()
                (emb(batches[r]) * grads[r % 4]).sum().backward()
                opt.step()
                if r >= args.warmup:
                    ms[name].append((time.perf_counter() - t0) * 1e3)
                    faults[name].append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
                bar.update()
        (a, _), (b, _) = sides.values()
        equal = torch.equal(a.weight, b.weight) and torch.equal(a.optm_state, b.optm_state)
    finally:
        sw.set(True)
        for emb, _ in sides.values():
            emb.close()
    if not equal:
        raise AssertionError(f"zipf {s} {opt_name}: the two tables differ: {sw.claim}")
    return {"ms": {k: C.spread(v) for k, v in ms.items()}, "bitwise_equal": equal,
            "minor_faults": {k: C.median(v) for k, v in faults.items()},
            "speedup": C.median(ms[sw.old]) / C.median(ms[sw.new])}


def main(doc: str, sw: Switch, argv: Optional[List[str]] = None) -> Dict[str, Any]:
    args = parse(doc, sw, argv)
    bar = tqdm(total=len(args.zipf) * len(sw.opts) * 2 * (args.warmup + args.steps), desc=sw.name,
               disable=not args.progress)
    results = {str(s): {o: run(args, sw, s, o, bar) for o in sw.opts} for s in args.zipf}
    bar.close()
    result = {"args": vars(args), "env": C.environment(), "results": results}
    rows = [(s, o, r) for s, per in results.items() for o, r in per.items()]

    def report() -> None:
        C.print_table("median ms per public step (emb(ids) + backward + step())",
                      ["Zipf s", "optimizer", sw.new, sw.old, "speedup", "bitwise equal", "page faults a step"],
                      [[s, o, r["ms"][sw.new]["median"], r["ms"][sw.old]["median"], r["speedup"], r["bitwise_equal"],
                        " / ".join(f"{r['minor_faults'][k]:.0f}" for k in (sw.new, sw.old))] for s, o, r in rows])

    def plot(png: Path) -> None:
        plt = C.pyplot()
        fig, ax = plt.subplots(figsize=(max(7, 1.5 * len(rows)), 3.6))
        xs = range(len(rows))
        ax.bar([x - 0.2 for x in xs], [r["ms"][sw.old]["median"] for _, _, r in rows], 0.4, label=sw.old)
        ax.bar([x + 0.2 for x in xs], [r["ms"][sw.new]["median"] for _, _, r in rows], 0.4, label=sw.new)
        ax.set_xticks(list(xs), [f"s={s} {o}" for s, o, _ in rows])
        ax.set_ylabel("median ms per step")
        ax.legend()
        C.save_figure(fig, png)
    return C.publish(args, sw.name, result, plot, report)
