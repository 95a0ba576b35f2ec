"""The pieces of the sparse step, each timed against what it replaced or against its floor (issue 27).

    python benchmarks/studies/row_ops.py
    python benchmarks/studies/row_ops.py --quick

On ``bench_step``'s stream (a 300k x 128 table, 23k ids a step from a Zipf-like law, exponents 1.1 and 0.8),
rounds interleaving the pairs, median ms of ``--reps`` calls:

* ``sort``: ``torch.sort(ids, stable=True)`` against ``engine.table.stable_sort`` (padded to the radix
  sort's size), the dedup of ``emb(ids)``;
* ``gather`` / ``scatter``: the table's ``index_select`` / ``index_copy_`` of the step's unique rows (value ‖
  Adagrad state, 1 KiB each) against ``dgl_oac.native``'s, a 64 MB buffer written between calls so that the
  rows are not left in cache by the previous call;
* ``adagrad`` / ``adam``: the optimizer's ``update_rows`` on the unique rows, torch path against native;
* ``floor``: what every implementation's step contains, ``table.index_select(0, ids)`` + the model's
  multiplication + backward, beside torch's whole SGD step (``nn.Embedding(sparse=True)`` + ``SGD``).

Every pair is checked bitwise equal where it claims to be.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the shared helpers

import _common as C  # noqa: E402
import torch  # noqa: E402

import dgl_oac  # noqa: E402
from bench_step import zipf_ids  # noqa: E402
from dgl_oac import native  # noqa: E402
from dgl_oac.engine.table import stable_sort  # noqa: E402

NAME = "row_ops"


def parse(argv: Optional[List[str]] = None):
    p = C.base_parser(__doc__.split("\n\n")[0], NAME)
    p.add_argument("--rows", type=int, default=300_000)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--ids", type=int, default=23_000)
    p.add_argument("--zipf", type=C.float_list, default=[1.1, 0.8])
    p.add_argument("--reps", type=int, default=40)
    args = p.parse_args(argv)
    if args.quick:
        args.rows, args.ids, args.reps = 20_000, 16_000, 4
    return args


def _without_native(fn: Callable[[], Any]) -> Callable[[], Any]:
    def run() -> Any:
        real = native.rows.load
        native.rows.load = lambda: None  # every native op declines: torch's runs
        try:
            return fn()
        finally:
            native.rows.load = real
    return run


def pairs(args: Any, s: float) -> Any:
    """``(checks, pieces)``: piece -> {side: call}, and how to check a piece's two sides agree bitwise (default:
    their results ``torch.equal``; the floor's two sides do different work and are not checked)."""
    d = args.dim
    ids = zipf_ids(args.rows, args.ids, s, 1, args.seed)[0]
    uniq = torch.unique(ids)
    gen = torch.Generator().manual_seed(args.seed)
    table = torch.rand(args.rows, 2 * d, generator=gen)
    rows = table.index_select(0, uniq)
    grad, g = torch.randn(uniq.numel(), d, generator=gen), torch.randn(args.ids, d, generator=gen)
    opts = {name: cls([dgl_oac.NodeEmbedding(1, d, f"row_ops_{name}_{s}")], lr=0.05)
            for name, cls in (("adagrad", dgl_oac.SparseAdagrad), ("adam", dgl_oac.SparseAdam))}
    adam_rows = torch.rand(uniq.numel(), 3 * d + 1, generator=gen)
    emb = torch.nn.Embedding(args.rows, d, sparse=True)
    sgd = torch.optim.SGD(emb.parameters(), lr=0.1)
    value = table[:, :d].contiguous()

    def floor() -> None:
        (value.index_select(0, ids).requires_grad_(True) * g).sum().backward()

    def torch_sgd() -> None:
        sgd.zero_grad()
        (emb(ids) * g).sum().backward()
        sgd.step()
    update = {name: (lambda o=o, r=r: o.update_rows(r, grad, d))
              for (name, o), r in zip(opts.items(), (rows, adam_rows))}

    def scattered(side: str) -> torch.Tensor:  # the table after one side's scatter (on a copy)
        t = table.clone()
        if side == "native":
            assert native.scatter(t, uniq, rows + 1)
        else:
            t.index_copy_(0, uniq, rows + 1)
        return t
    checks = {"sort": lambda a, b: all(torch.equal(x, y) for x, y in zip(a, b)),
              "scatter": lambda a, b: torch.equal(scattered("torch"), scattered("native"))}
    return checks, {
        "sort": {"torch.sort": lambda: torch.sort(ids, stable=True), "stable_sort": lambda: stable_sort(ids)},
        "gather": {"index_select": lambda: table.index_select(0, uniq), "native": lambda: native.gather(table, uniq)},
        "scatter": {"index_copy_": lambda: table.index_copy_(0, uniq, rows),
                    "native": lambda: native.scatter(table, uniq, rows)},
        "adagrad": {"torch path": _without_native(update["adagrad"]), "native": update["adagrad"]},
        "adam": {"torch path": _without_native(update["adam"]), "native": update["adam"]},
        "floor": {"torch SGD step": torch_sgd, "gather + model + backward": floor},
    }


def run(args: Any, s: float) -> Dict[str, Any]:
    checks, ps = pairs(args, s)
    flush = torch.empty(16 * 2 ** 20)
    out: Dict[str, Any] = {}
    for piece, sides in ps.items():
        a, b = (f() for f in sides.values())
        if piece != "floor" and not checks.get(piece, torch.equal)(a, b):
            raise AssertionError(f"{piece}: {list(sides)} differ")
        ms: Dict[str, List[float]] = {k: [] for k in sides}
        for r in range(args.reps):
            for k in C.rotated(list(sides), r):
                flush.add_(1.0)  # evict the table's rows: each call starts as a step would
                t0 = time.perf_counter()
                sides[k]()
                ms[k].append((time.perf_counter() - t0) * 1e3)
        old, new = list(sides)
        out[piece] = {"ms": {k: C.spread(v) for k, v in ms.items()},
                      "ratio": C.median(ms[old]) / C.median(ms[new])}
    return out


def main(argv: Optional[List[str]] = None) -> Dict[str, Any]:
    args = parse(argv)
    if native.rows.load() is None:
        raise SystemExit(f"the native library is not available here: {native.status()}")
    results = {str(s): run(args, s) for s in args.zipf}
    result = {"args": vars(args), "env": C.environment(), "results": results}
    rows = [(s, piece, r) for s, per in results.items() for piece, r in per.items()]

    def report() -> None:
        C.print_table("median ms (ratio: first / second)", ["Zipf s", "piece", "first", "ms", "second", "ms",
                                                             "ratio"],
                      [[s, p, *[x for k, v in r["ms"].items() for x in (k, v["median"])], r["ratio"]]
                       for s, p, r in rows])

    def plot(png: Path) -> None:
        plt = C.pyplot()
        fig, axes = plt.subplots(1, len(results), figsize=(6.5 * len(results), 3.8), squeeze=False)
        for ax, (s, per) in zip(axes[0], results.items()):
            names = list(per)
            xs = range(len(names))
            for i, off in ((0, -0.2), (1, 0.2)):
                ax.bar([x + off for x in xs], [list(per[n]["ms"].values())[i]["median"] for n in names], 0.4,
                       label=("torch (or the floor's torch step)", "dgl-oac (or the floor)")[i])
            ax.set_xticks(list(xs), names)
            ax.set_title(f"Zipf s={s}")
            ax.set_ylabel("median ms")
            ax.legend(fontsize=8)
        C.save_figure(fig, png)
    return C.publish(args, NAME, result, plot, report)


if __name__ == "__main__":
    main()
