"""Per-operation costs of one pipeline step, in isolation, at the shape of ``bench_modes``' batches.

What a step of each mode does to its rows (``n`` rows of ``W = D + S`` floats; Adam: ``S = 2D + 1``), timed op
by op with dgl-oac's own code (``RowStore``, ``SparseAdam.update_rows``, ``WriteLog.patch`` / ``reserve`` /
``append``), next to the variants RESULTS.md discusses: the ones the core used before commit 57512f2 (marked
``before``: a finite check by ``isfinite(...).all()``, a row kernel building temporaries and ``torch.cat``),
and ones proposed (marked ``proposed``), so every suggestion comes with its measured cost:

* finite check of the update: ``isfinite(new).all() & isfinite(grad).all()`` (before) vs
  ``isfinite(new.sum() + grad.sum())`` (now; a NaN/Inf element makes the sum non-finite);
* Adam row kernel: temporaries + ``cat`` (before) vs in place into a new buffer vs into the write log's ring
  slice (now, oac);
* oac validate (``WriteLog.patch`` at a given conflict rate; commit repeats it only for rows written after the
  hand-out), and the log append after ``reserve`` (only ``last_slot``);
* the write-back (``index_copy_`` for sync/oac, ``index_add_`` of ``new - old`` for async) and the gather,
  next to a contiguous copy of the same bytes (the gather's ceiling);
* allocation: a fresh ``[n, W]`` output (over glibc's 32 MiB mmap threshold: mapped, page-faulted in, unmapped
  every step) vs a reused buffer, for the gather and for a plain copy. Minor page faults per call are reported.

Rounds interleave all operations; medians are reported, for each torch thread count given.

    python benchmarks/studies/bench_stages.py
    python benchmarks/studies/bench_stages.py --quick
"""
from __future__ import annotations

import resource
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the shared helpers

import _omp  # noqa: E402,F401  (OMP_WAIT_POLICY must be set before torch loads)
import torch  # noqa: E402
from tqdm.auto import tqdm  # noqa: E402

import _common as C  # noqa: E402

NAME = "bench_stages"


def parse(argv: Optional[List[str]] = None):
    p = C.base_parser(__doc__.split("\n\n")[0], NAME)
    p.add_argument("--table-rows", type=int, default=300_000)
    p.add_argument("--rows", type=int, default=22_000, help="rows per batch (bench_modes' default workload: ~22k)")
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--conflict-rate", type=float, default=0.7, help="share of a batch's rows that oac patches")
    p.add_argument("--threads", default="1,2")
    p.add_argument("--rounds", type=int, default=7)
    args = p.parse_args(argv)
    if args.quick:
        args.table_rows, args.rows, args.dim, args.rounds = 20_000, 2_000, 32, 3
    return args


def adam_before(opt: Any, rows: torch.Tensor, grad: torch.Tensor, dim: int) -> torch.Tensor:
    """SparseAdam.update_rows as it was before 56d3545: temporaries, then one ``torch.cat``."""
    b1, b2 = opt.defaults["betas"]
    w, m, v, step = rows[:, :dim], rows[:, dim:2 * dim], rows[:, 2 * dim:3 * dim], rows[:, 3 * dim:]
    step = step + 1
    m = b1 * m + (1.0 - b1) * grad
    v = b2 * v + (1.0 - b2) * (grad * grad)
    m_hat = m / (1.0 - torch.pow(torch.tensor(b1), step))
    v_hat = v / (1.0 - torch.pow(torch.tensor(b2), step))
    return torch.cat([w - opt.lr * m_hat / (torch.sqrt(v_hat) + opt.defaults["eps"]), m, v, step], dim=1)


def setup(args) -> Dict[str, Callable[[], Any]]:
    import dgl_oac
    from dgl_oac.engine.table import WriteLog
    from dgl_oac.engine.table import RowStore

    gen = torch.Generator().manual_seed(args.seed)
    D, N, n = args.dim, args.table_rows, args.rows
    emb = dgl_oac.NodeEmbedding(8, D, "bench-stages")
    opt = dgl_oac.SparseAdam([emb], lr=0.05)
    W = D + opt.state_width(D)
    store = RowStore(N, D)
    store.widen(opt.state_width(D))
    store.table.normal_(generator=gen)
    store.table[:, 3 * D:] = torch.randint(1, 50, (N, 1), generator=gen).float()  # Adam step counts
    store.table[:, 2 * D:3 * D].abs_()
    ids = torch.randperm(N, generator=gen)[:n].sort().values[torch.randperm(n, generator=gen)]
    rows = store.gather(ids)
    grad = torch.randn(n, D, generator=gen)
    new = opt.update_rows(rows, grad, D)
    assert torch.allclose(adam_before(opt, rows, grad, D), new, rtol=1e-5, atol=1e-6), "kernels disagree"
    # a write log in which a conflict-rate share of the batch's rows was written after read version -1
    log = WriteLog(N, W, torch.device("cpu"))
    stale = ids[torch.randperm(n, generator=gen)[: int(args.conflict_rate * n)]]
    log.append(0, stale, torch.randn(stale.numel(), W, generator=gen))
    work = rows.clone()
    append_log = WriteLog(N, W, torch.device("cpu"), capacity=4 * n)
    state = {"step": 0}

    def reserve_append() -> None:
        out = append_log.reserve(n)
        append_log.append(state["step"], ids, out)
        append_log.drop_through(state["step"])
        state["step"] += 1

    kernel_log = WriteLog(N, W, torch.device("cpu"), capacity=4 * n)
    ring_slice = kernel_log.reserve(n)
    contiguous_src = store.table[: n]
    out = torch.empty(n, W)
    mask = torch.zeros(n, dtype=torch.bool)
    mask[torch.randperm(n, generator=gen)[: int(args.conflict_rate * n)]] = True
    idx = mask.nonzero().squeeze(1)
    fresh = torch.randn(idx.numel(), W, generator=gen)
    delta_out = torch.empty_like(new)
    return {
        "gather into a fresh tensor (before)": lambda: store.gather(ids),
        "gather into a pooled buffer (now)": lambda: store.gather(ids, out=out),
        "fresh [n, W] tensor, written once (page faults)": lambda: torch.empty(n, W).copy_(new),
        "reused [n, W] buffer, written once": lambda: out.copy_(new),
        "gather ceiling: contiguous copy, same bytes": lambda: out.copy_(contiguous_src),
        "leaf: rows[:, :D].contiguous()": lambda: rows[:, :D].contiguous(),
        "commit: row kernel, temporaries + cat (before)": lambda: adam_before(opt, rows, grad, D),
        "commit: row kernel, in-place ops (sync, async)": lambda: opt.update_rows(rows, grad, D),
        "commit: row kernel into the log ring (now: oac)": lambda: opt.update_rows(rows, grad, D, out=ring_slice),
        "commit: finite check isfinite(x).all() (before)":
            lambda: bool(torch.isfinite(new).all() & torch.isfinite(grad).all()),
        "commit: finite check isfinite(sum) (now)": lambda: bool(torch.isfinite(new.sum() + grad.sum())),
        "async: delta new - rows (in place)": lambda: torch.sub(new, rows, out=delta_out),
        "oac: WriteLog.patch (validate, once a batch)": lambda: log.patch(ids, work, -1),
        "oac: patch scatter rows[idx] = src": lambda: work.__setitem__(idx, fresh),
        "oac: patch scatter index_copy_ (proposed)": lambda: work.index_copy_(0, idx, fresh),
        "oac: WriteLog.reserve + append (last_slot only)": reserve_append,
        "write-back: index_copy_ (sync, oac)": lambda: store.write(ids, new),
        "write-back: index_add_ (async)": lambda: store.add(ids, delta_out),
    }


def main(argv: Optional[List[str]] = None) -> Dict[str, Any]:
    args = parse(argv)
    env = C.environment()
    threads = C.int_list(args.threads)
    ops = setup(args)
    times: Dict[int, Dict[str, List[float]]] = {t: {k: [] for k in ops} for t in threads}
    faults: Dict[str, int] = {}  # minor page faults of the op's last call (a fresh 32 MiB tensor: ~8.6k)
    bar = tqdm(total=args.rounds * len(threads), desc=NAME, disable=not args.progress, dynamic_ncols=True)
    for r in range(args.rounds):
        for t in C.rotated(threads, r):
            torch.set_num_threads(t)
            for name in C.rotated(list(ops), r):
                ops[name]()  # warm
                f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
                t0 = time.perf_counter()
                ops[name]()
                times[t][name].append(time.perf_counter() - t0)
                faults[name] = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0
            bar.update()
    bar.close()
    torch.set_num_threads(env["torch_threads_default"])
    ms = {t: {k: 1e3 * C.median(v) for k, v in d.items()} for t, d in times.items()}
    W = args.dim + 2 * args.dim + 1
    result = {"benchmark": NAME, "env": env, "args": vars(args), "row_floats": W,
              "batch_mib": args.rows * W * 4 / 2**20, "ms": ms, "minor_page_faults": faults,
              "spread_ms": {t: {k: C.spread([1e3 * x for x in v]) for k, v in d.items()} for t, d in times.items()}}
    return C.publish(args, NAME, result, lambda png: plot(args, result, png), lambda: report(args, result))


def report(args, result: Dict[str, Any]) -> None:
    ms, faults = result["ms"], result["minor_page_faults"]
    C.print_table(f"ms per op, median of {args.rounds} (n={args.rows:,} rows x {result['row_floats']} floats = "
                  f"{result['batch_mib']:.1f} MiB, table {args.table_rows:,} rows)",
                  ["op", *[f"{t} thr" for t in ms], "page faults"],
                  [[k, *[ms[t][k] for t in ms], faults[k]] for k in next(iter(ms.values()))])


def plot(args, result: Dict[str, Any], png: Path) -> None:
    plt = C.pyplot()
    ms = result["ms"]
    threads = list(ms)
    names = list(next(iter(ms.values())))
    fig, ax = plt.subplots(figsize=(10, 0.38 * len(names) + 1.5))
    h = 0.8 / len(threads)
    for i, t in enumerate(threads):
        ax.barh([j + i * h for j in range(len(names))], [ms[t][k] for k in names], height=h,
                label=f"torch threads {t}")
    ax.set_yticks([j + h * (len(threads) - 1) / 2 for j in range(len(names))], names, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("ms (median)")
    ax.set_title(f"one step's row operations: {args.rows:,} rows x {result['row_floats']} floats", fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(axis="x", alpha=0.3)
    C.save_figure(fig, png)


if __name__ == "__main__":
    main()
