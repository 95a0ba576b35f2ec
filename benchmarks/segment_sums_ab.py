"""The public sparse step with and without segment sums, in one process (issue 27).

    python benchmarks/segment_sums_ab.py                 # Zipf 1.1 and 0.8, Adagrad and Adam
    python benchmarks/segment_sums_ab.py --quick

``emb(ids)`` of fresh ids sorts them (stably) to find the unique rows; the commit then sums each row's
gradients over that sort's segments with one ``embedding_bag`` (``dgl_oac.engine.combine.segment_sums``).
Without the segments (``Read.segments`` left None, as before) it sums them with ``index_add_``. Both give the
same bits; this times ``emb(ids)`` + backward + ``opt.step()`` of the two side by side: two tables of the same
initial rows, the same batches (``bench_step``'s Zipf stream), rounds alternating which goes first. Checks that
both tables end bitwise equal.
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
from dgl_oac.engine import pending  # noqa: E402

NAME = "segment_sums_ab"
OPTS = {"adagrad": dgl_oac.SparseAdagrad, "adam": dgl_oac.SparseAdam}


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
    real_read = pending.PendingBatches.read

    def without_segments(self, batch, pos, whole, segments=None):  # the commit falls back to index_add_
        return real_read(self, batch, pos, whole, None)
    sides = {}
    for name in ("segments", "index_add"):
        emb = dgl_oac.NodeEmbedding(args.rows, args.dim, f"ab_{name}_{s}_{opt_name}", init_func=lambda t: t.copy_(init))
        sides[name] = (emb, OPTS[opt_name]([emb], lr=0.05))
    ms: Dict[str, List[float]] = {name: [] for name in sides}
    try:
        for r in range(total):
            for name in C.rotated(list(sides), r):
                emb, opt = sides[name]
                pending.PendingBatches.read = real_read if name == "segments" else without_segments
                t0 = time.perf_counter()
                (emb(batches[r]) * grads[r % 4]).sum().backward()
                opt.step()
                if r >= args.warmup:
                    ms[name].append((time.perf_counter() - t0) * 1e3)
                bar.update()
        equal = torch.equal(sides["segments"][0].weight, sides["index_add"][0].weight)
    finally:
        pending.PendingBatches.read = real_read
        for emb, _ in sides.values():
            emb.close()
    if not equal:
        raise AssertionError(f"zipf {s} {opt_name}: the two tables differ: segment sums are not index_add_'s bits")
    return {"ms": {k: C.spread(v) for k, v in ms.items()}, "bitwise_equal": equal,
            "speedup": C.median(ms["index_add"]) / C.median(ms["segments"])}


def main(argv: Optional[List[str]] = None) -> Dict[str, Any]:
    args = parse(argv)
    bar = tqdm(total=len(args.zipf) * len(OPTS) * 2 * (args.warmup + args.steps), desc=NAME,
               disable=not args.progress)
    results = {str(s): {o: run(args, s, o, bar) for o in OPTS} for s in args.zipf}
    bar.close()
    result = {"args": vars(args), "env": C.environment(), "results": results}

    def report() -> None:
        C.print_table("median ms per public step (emb(ids) + backward + step())",
                      ["Zipf s", "optimizer", "segment sums", "index_add_", "speedup", "bitwise equal"],
                      [[s, o, r["ms"]["segments"]["median"], r["ms"]["index_add"]["median"], r["speedup"],
                        r["bitwise_equal"]] for s, per in results.items() for o, r in per.items()])

    def plot(png: Path) -> None:
        plt = C.pyplot()
        fig, ax = plt.subplots(figsize=(7, 3.6))
        labels = [f"s={s} {o}" for s, per in results.items() for o in per]
        seg = [r["ms"]["segments"]["median"] for per in results.values() for r in per.values()]
        old = [r["ms"]["index_add"]["median"] for per in results.values() for r in per.values()]
        xs = range(len(labels))
        ax.bar([x - 0.2 for x in xs], old, 0.4, label="index_add_ (before)")
        ax.bar([x + 0.2 for x in xs], seg, 0.4, label="segment sums (now)")
        ax.set_xticks(list(xs), labels)
        ax.set_ylabel("median ms per step")
        ax.legend()
        C.save_figure(fig, png)
    return C.publish(args, NAME, result, plot, report)


if __name__ == "__main__":
    main()
