"""The public sparse step with and without the native row operations, in one process (issue 27).

    python benchmarks/native_ab.py                 # Zipf 1.1 and 0.8; SGD, Adagrad, Adam
    python benchmarks/native_ab.py --quick

``dgl_oac.native`` runs a table's row gather and scatter (``index_select`` / ``index_copy_`` with the next
rows prefetched) and Adagrad's and Adam's row update (two passes instead of one per op) in compiled code; with
it off, every one of them is torch's op. Both give the same bits; this times ``emb(ids)`` + backward +
``opt.step()`` of the two side by side: two tables of the same initial rows, the same batches
(``bench_step``'s Zipf stream), rounds alternating which goes first. Checks that both tables (values and
optimizer state) end bitwise equal.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as C  # noqa: E402
import torch  # noqa: E402
from tqdm.auto import tqdm  # noqa: E402

import dgl_oac  # noqa: E402
from bench_step import zipf_ids  # noqa: E402
from dgl_oac.native import rows as native_rows  # noqa: E402

NAME = "native_ab"
OPTS = {"sgd": dgl_oac.SparseSGD, "adagrad": dgl_oac.SparseAdagrad, "adam": dgl_oac.SparseAdam}
SIDES = ("native", "torch ops")


def parse(argv: Optional[List[str]] = None):
    p = C.base_parser(__doc__.split("\n\n")[0], NAME)
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


def run(args: Any, s: float, opt_name: str, bar: Any) -> Dict[str, Any]:
    total = args.warmup + args.steps
    batches = zipf_ids(args.rows, args.ids, s, total, args.seed)
    gen = torch.Generator().manual_seed(args.seed + 1)
    grads = [torch.randn(args.ids, args.dim, generator=gen) for _ in range(4)]
    init = torch.empty(args.rows, args.dim).uniform_(-0.1, 0.1, generator=gen)
    real_load = native_rows.load
    if real_load() is None:
        raise SystemExit(f"the native library is not available here: {dgl_oac.native.status()}")
    sides = {}
    for name in SIDES:
        emb = dgl_oac.NodeEmbedding(args.rows, args.dim, f"ab_{name}_{s}_{opt_name}", init_func=lambda t: t.copy_(init))
        sides[name] = (emb, OPTS[opt_name]([emb], lr=0.05))
    ms: Dict[str, List[float]] = {name: [] for name in sides}
    try:
        for r in range(total):
            for name in C.rotated(list(sides), r):
                emb, opt = sides[name]
                native_rows.load = real_load if name == "native" else (lambda: None)
                t0 = time.perf_counter()
                (emb(batches[r]) * grads[r % 4]).sum().backward()
                opt.step()
                if r >= args.warmup:
                    ms[name].append((time.perf_counter() - t0) * 1e3)
                bar.update()
        (a, _), (b, _) = sides.values()
        equal = torch.equal(a.weight, b.weight) and torch.equal(a.optm_state, b.optm_state)
    finally:
        native_rows.load = real_load
        for emb, _ in sides.values():
            emb.close()
    if not equal:
        raise AssertionError(f"zipf {s} {opt_name}: the two tables differ: the native ops are not torch's bits")
    return {"ms": {k: C.spread(v) for k, v in ms.items()}, "bitwise_equal": equal,
            "speedup": C.median(ms["torch ops"]) / C.median(ms["native"])}


def main(argv: Optional[List[str]] = None) -> Dict[str, Any]:
    args = parse(argv)
    bar = tqdm(total=len(args.zipf) * len(OPTS) * len(SIDES) * (args.warmup + args.steps), desc=NAME,
               disable=not args.progress)
    results = {str(s): {o: run(args, s, o, bar) for o in OPTS} for s in args.zipf}
    bar.close()
    result = {"args": vars(args), "env": C.environment(), "results": results}

    def report() -> None:
        C.print_table("median ms per public step (emb(ids) + backward + step())",
                      ["Zipf s", "optimizer", "native", "torch ops", "speedup", "bitwise equal"],
                      [[s, o, r["ms"]["native"]["median"], r["ms"]["torch ops"]["median"], r["speedup"],
                        r["bitwise_equal"]] for s, per in results.items() for o, r in per.items()])

    def plot(png: Path) -> None:
        plt = C.pyplot()
        fig, ax = plt.subplots(figsize=(9, 3.6))
        labels = [f"s={s} {o}" for s, per in results.items() for o in per]
        new = [r["ms"]["native"]["median"] for per in results.values() for r in per.values()]
        old = [r["ms"]["torch ops"]["median"] for per in results.values() for r in per.values()]
        xs = range(len(labels))
        ax.bar([x - 0.2 for x in xs], old, 0.4, label="torch ops (DGL_OAC_NATIVE=0)")
        ax.bar([x + 0.2 for x in xs], new, 0.4, label="native row ops")
        ax.set_xticks(list(xs), labels)
        ax.set_ylabel("median ms per step")
        ax.legend()
        C.save_figure(fig, png)
    return C.publish(args, NAME, result, plot, report)


if __name__ == "__main__":
    main()
