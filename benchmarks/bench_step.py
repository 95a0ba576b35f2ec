"""The sparse step at its kernel's speed: ms per ``emb(ids)`` + backward + ``opt.step()``, every method side by side.

A table of ``--rows`` x ``--dim`` float32 rows; each step reads ``--ids`` ids drawn from a Zipf-like law (rank ``k``
with probability ~ ``1 / k ** s``, ranks scattered over the table), the model is ``(rows * g).sum()`` with a random
gradient ``g`` per occurrence. Methods, for each optimizer (SGD, Adagrad, Adam, row-wise Adagrad):

* ``dgl-oac``: the public API, ``x = emb(ids)``, backward, ``opt.step()``, outside a loader (sync's path);
* ``dgl-oac loader sync`` / ``oac``: the same through a ``dgl_oac.DataLoader`` whose batch is the step's unique
  ids (what a sampler hands out); the model reads ``emb(ids)``, a read of the batch's rows with repeats. The
  time includes ``next(loader)`` (oac gathers the next batches in the background and writes back behind);
* ``kernel path``: the floor around the same row kernel, written by hand: ``unique``, one gather of value ‖
  state per unique id, the user's rows ``[n, D]``, the same backward, the per-occurrence mean, ``update_rows``,
  one ``index_copy_`` back;
* ``torch``: ``nn.Embedding(sparse=True)`` + ``torch.optim.SGD`` / ``Adagrad`` / ``SparseAdam``;
* ``dgl``: ``dgl.nn.NodeEmbedding`` + ``dgl.optim.SparseAdagrad`` / ``SparseAdam`` (no SGD, no row-wise);
* ``fbgemm``: fbgemm-gpu-cpu's ``SplitTableBatchedEmbeddingBagsCodegen`` on the CPU (SUM pooling, bags of one),
  EXACT_SGD / EXACT_ADAGRAD / EXACT_ROWWISE_ADAGRAD (no CPU Adam), when importable (``pip install
  dgl-oac[fbgemm]``); skipped with a message otherwise.

Rounds interleave the methods (rotated order); the median of ``--steps`` steps after ``--warmup`` is reported,
with the median number of minor page faults a step (fresh memory mapped in: a cost of each step's allocations).

    python benchmarks/bench_step.py                  # Zipf exponents 1.1 and 0.8
    python benchmarks/bench_step.py --quick
"""
from __future__ import annotations

import gc
import resource
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _omp  # noqa: E402,F401  (OMP_WAIT_POLICY must be set before torch loads)
import dgl  # noqa: E402
import torch  # noqa: E402
from tqdm.auto import tqdm  # noqa: E402

import _common as C  # noqa: E402
import dgl_oac  # noqa: E402

NAME = "bench_step"
OURS = {"sgd": dgl_oac.SparseSGD, "adagrad": dgl_oac.SparseAdagrad, "adam": dgl_oac.SparseAdam,
        "rowwise_adagrad": dgl_oac.SparseRowWiseAdagrad}
LR = {"sgd": 0.1, "adagrad": 0.05, "adam": 0.01, "rowwise_adagrad": 0.05}
PUBLIC = ("dgl-oac", "dgl-oac loader sync", "dgl-oac loader oac")
Step = Callable[[int], None]


def parse(argv: Optional[List[str]] = None):
    p = C.base_parser(__doc__.split("\n\n")[0], NAME)
    p.add_argument("--rows", type=int, default=300_000, help="table rows")
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--ids", type=int, default=23_000, help="ids read per step (with repeats)")
    p.add_argument("--zipf", type=C.float_list, default=[1.1, 0.8], help="Zipf exponents, one run each")
    p.add_argument("--optimizers", type=C.str_list, default=list(OURS))
    p.add_argument("--steps", type=int, default=30, help="timed steps per method")
    p.add_argument("--warmup", type=int, default=5)
    args = p.parse_args(argv)
    if args.quick:
        args.rows, args.dim, args.ids, args.steps, args.warmup = 20_000, 32, 2_000, 4, 1
    bad = [o for o in args.optimizers if o not in OURS]
    if bad:
        p.error(f"unknown optimizer(s) {bad}: expected some of {list(OURS)}")
    return args


def zipf_ids(rows: int, n: int, s: float, steps: int, seed: int) -> List[torch.Tensor]:
    """``steps`` batches of ``n`` ids: rank k drawn with probability ~ 1 / k ** s, ranks scattered over the table."""
    gen = torch.Generator().manual_seed(seed)
    prob = torch.arange(1, rows + 1, dtype=torch.float64).pow_(-s)
    perm = torch.randperm(rows, generator=gen)
    return [perm[torch.multinomial(prob, n, replacement=True, generator=gen)] for _ in range(steps)]


class StreamSampler(dgl.dataloading.Sampler):
    """Batch ``i`` (the loader's seed) is the unique ids of the stream's step ``i``, over a graph of no edges
    (where a sampler's block would be): what a loader hands out before the model reads ``emb(ids)``."""

    def __init__(self, batches: List[torch.Tensor]) -> None:
        super().__init__()
        self.batches = batches

    def sample(self, g: Any, seeds: torch.Tensor) -> Any:
        uniq = torch.unique(self.batches[int(seeds[0])])
        return uniq, dgl.graph(([], []), num_nodes=uniq.numel()), []


def our_public(opt_name: str, init: torch.Tensor, batches, grads, mode: Optional[str]) -> Step:
    n, d = init.shape
    emb = dgl_oac.NodeEmbedding(n, d, f"bench_{mode}", init_func=lambda t: t.copy_(init))
    opt = OURS[opt_name]([emb], lr=LR[opt_name])
    it = None
    if mode is not None:
        loader = dgl_oac.DataLoader(dgl.graph(([], []), num_nodes=n), torch.arange(len(batches)),
                                    StreamSampler(batches), embeddings=[emb], mode=mode, batch_size=1,
                                    prefetch=4 if mode == "oac" else 1, background_priority="normal")
        it = iter(loader)

    def step(r: int) -> float:
        t0 = time.perf_counter()
        if it is not None:
            next(it)
        t1 = time.perf_counter()
        x = emb(batches[r])
        (x * grads[r % len(grads)]).sum().backward()
        opt.step()
        return t1 - t0  # the hand-out's share (sync: the gather; oac: waiting for the background's)
    step.close = emb.close  # type: ignore[attr-defined]
    return step


def kernel_path(opt_name: str, init: torch.Tensor, batches, grads) -> Step:
    n, d = init.shape
    opt = OURS[opt_name]([dgl_oac.NodeEmbedding(1, d, "bench_kernel_hyper")], lr=LR[opt_name])
    table = torch.zeros(n, d + opt.state_width(d))
    table[:, :d] = init

    def step(r: int) -> None:
        uniq, inverse, counts = torch.unique(batches[r], return_inverse=True, return_counts=True)
        rows = table.index_select(0, uniq)
        x = rows[:, :d].index_select(0, inverse).requires_grad_(True)
        (x * grads[r % len(grads)]).sum().backward()
        grad = torch.zeros(uniq.numel(), d).index_add_(0, inverse, x.grad).div_(counts.unsqueeze(1))
        with torch.no_grad():
            table.index_copy_(0, uniq, opt.update_rows(rows, grad, d))
    return step


def torch_sparse(opt_name: str, init: torch.Tensor, batches, grads) -> Optional[Step]:
    make = {"sgd": torch.optim.SGD, "adagrad": torch.optim.Adagrad, "adam": torch.optim.SparseAdam}.get(opt_name)
    if make is None:
        return None
    emb = torch.nn.Embedding(*init.shape, sparse=True)
    with torch.no_grad():
        emb.weight.copy_(init)
    opt = make(emb.parameters(), lr=LR[opt_name])

    def step(r: int) -> None:
        opt.zero_grad()
        (emb(batches[r]) * grads[r % len(grads)]).sum().backward()
        opt.step()
    return step


def dgl_native(opt_name: str, init: torch.Tensor, batches, grads, tag: str) -> Optional[Step]:
    make = {"adagrad": dgl.optim.SparseAdagrad, "adam": dgl.optim.SparseAdam}.get(opt_name)
    if make is None:
        return None
    emb = dgl.nn.NodeEmbedding(*init.shape, f"bench_dgl_{tag}", init_func=lambda t: t.copy_(init))
    opt = make([emb], lr=LR[opt_name])

    def step(r: int) -> None:
        opt.zero_grad()  # before step(): without it dgl.optim re-applies earlier reads
        (emb(batches[r]) * grads[r % len(grads)]).sum().backward()
        opt.step()
    return step


def fbgemm(opt_name: str, init: torch.Tensor, batches, grads) -> Optional[Step]:
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation, PoolingMode
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
        ComputeDevice, SplitTableBatchedEmbeddingBagsCodegen)
    kind = {"sgd": EmbOptimType.EXACT_SGD, "adagrad": EmbOptimType.EXACT_ADAGRAD,
            "rowwise_adagrad": EmbOptimType.EXACT_ROWWISE_ADAGRAD}.get(opt_name)
    if kind is None:
        return None
    n, d = init.shape
    module = SplitTableBatchedEmbeddingBagsCodegen([(n, d, EmbeddingLocation.HOST, ComputeDevice.CPU)],
                                                   optimizer=kind, learning_rate=LR[opt_name],
                                                   pooling_mode=PoolingMode.SUM, device="cpu")
    with torch.no_grad():
        module.split_embedding_weights()[0].copy_(init)
    offsets = torch.arange(batches[0].numel() + 1)

    def step(r: int) -> None:  # the update happens inside backward(), in FBGEMM's kernel
        (module(batches[r], offsets) * grads[r % len(grads)]).sum().backward()
    return step


def fbgemm_available() -> str:
    """"" if fbgemm-gpu-cpu imports, else why not."""
    try:
        import fbgemm_gpu  # noqa: F401
        return ""
    except Exception as exc:  # noqa: BLE001 - a missing or broken optional extra is reported, not fatal
        return f"{type(exc).__name__}: {exc}".splitlines()[0][:200]


def run_one(args, s: float, opt_name: str, tag: str) -> Dict[str, Any]:
    total = args.warmup + args.steps
    batches = zipf_ids(args.rows, args.ids, s, total, args.seed)
    gen = torch.Generator().manual_seed(args.seed + 1)
    grads = [torch.randn(args.ids, args.dim, generator=gen) for _ in range(4)]
    init = torch.empty(args.rows, args.dim).uniform_(-0.1, 0.1, generator=gen)
    methods: Dict[str, Step] = {
        "dgl-oac": our_public(opt_name, init, batches, grads, None),
        "dgl-oac loader sync": our_public(opt_name, init, batches, grads, "sync"),
        "dgl-oac loader oac": our_public(opt_name, init, batches, grads, "oac"),
        "kernel path": kernel_path(opt_name, init, batches, grads),
    }
    for name, make in (("torch", lambda: torch_sparse(opt_name, init, batches, grads)),
                       ("dgl", lambda: dgl_native(opt_name, init, batches, grads, tag)),
                       ("fbgemm", lambda: None if args.fbgemm_missing else fbgemm(opt_name, init, batches, grads))):
        made = make()
        if made is not None:
            methods[name] = made
    times: Dict[str, List[float]] = {m: [] for m in methods}
    faults: Dict[str, List[float]] = {m: [] for m in methods}  # minor page faults a step (fresh pages mapped in)
    handout: Dict[str, List[float]] = {m: [] for m in PUBLIC[1:]}
    bar = tqdm(total=total * len(methods), desc=f"{NAME} s={s} {opt_name}", disable=not args.progress,
               dynamic_ncols=True)
    for r in range(total):
        for name in C.rotated(list(methods), r):
            f0, t0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, time.perf_counter()
            inner = methods[name](r)
            if r >= args.warmup:
                times[name].append((time.perf_counter() - t0) * 1e3)
                faults[name].append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
                if name in handout:
                    handout[name].append(times[name][-1] - inner * 1e3)
            bar.update()
    bar.close()
    for step in methods.values():
        getattr(step, "close", lambda: None)()
    unique = sum(torch.unique(b).numel() for b in batches) / (total * args.ids)
    out = {"unique_fraction": unique, "ms": {m: C.spread(t) for m, t in times.items()},
           "ms_without_next": {m: C.spread(t) for m, t in handout.items()},
           "minor_faults": {m: C.median(f) for m, f in faults.items()}}
    med = {m: out["ms"][m]["median"] for m in times}
    for m in PUBLIC:
        out.setdefault("ratios", {})[m] = {
            "over_kernel_path": med[m] / med["kernel path"],
            "speedup_vs_torch": med["torch"] / med[m] if "torch" in med else None,
            "speedup_vs_dgl": med["dgl"] / med[m] if "dgl" in med else None,
            "speedup_vs_fbgemm": med["fbgemm"] / med[m] if "fbgemm" in med else None}
    del methods
    gc.collect()
    return out


def main(argv: Optional[List[str]] = None) -> Dict[str, Any]:
    args = parse(argv)
    missing = fbgemm_available()
    args.fbgemm_missing = bool(missing)
    if missing:
        print(f"fbgemm: skipped ({missing}); pip install 'dgl-oac[fbgemm]' to compare with it", flush=True)
    env = C.environment()
    results: Dict[str, Any] = {}
    for i, s in enumerate(args.zipf):
        for opt_name in args.optimizers:
            results.setdefault(str(s), {})[opt_name] = run_one(args, s, opt_name, f"{i}_{opt_name}")
    result = {"args": {k: v for k, v in vars(args).items()}, "fbgemm": missing or "ok", "env": env,
              "results": results}

    def plot(png: Path) -> None:
        plt = C.pyplot()
        fig, axes = plt.subplots(1, len(results), figsize=(6.5 * len(results), 4.2), squeeze=False)
        for ax, (s, per_opt) in zip(axes[0], results.items()):
            names = sorted({m for r in per_opt.values() for m in r["ms"]}, key=lambda m: list(
                next(iter(per_opt.values()))["ms"]).index(m) if m in next(iter(per_opt.values()))["ms"] else 99)
            width = 0.8 / len(names)
            for j, m in enumerate(names):
                xs = [i + j * width for i, r in enumerate(per_opt.values()) if m in r["ms"]]
                ys = [r["ms"][m]["median"] for r in per_opt.values() if m in r["ms"]]
                ax.bar(xs, ys, width, label=m)
            ax.set_xticks([i + 0.4 - width / 2 for i in range(len(per_opt))], list(per_opt))
            ax.set_ylabel("median ms per step")
            ax.set_title(f"Zipf s={s}: {args.ids:,} ids/step, {args.rows:,} x {args.dim}")
        axes[0][0].legend(fontsize=7)
        C.save_figure(fig, png)

    def report() -> None:
        for s, per_opt in results.items():
            for opt_name, r in per_opt.items():
                C.print_table(f"Zipf s={s}, {opt_name} ({r['unique_fraction']:.0%} unique): median ms per step",
                              ["method", "ms", "min", "max", "ms without next(loader)", "page faults"],
                              [[m, v["median"], v["min"], v["max"],
                                r["ms_without_next"][m]["median"] if m in r["ms_without_next"] else "-",
                                r["minor_faults"][m]] for m, v in r["ms"].items()])
                C.print_table("ratios", ["method", "/ kernel path", "x torch", "x dgl", "x fbgemm"],
                              [[m, q["over_kernel_path"], q["speedup_vs_torch"] or "-", q["speedup_vs_dgl"] or "-",
                                q["speedup_vs_fbgemm"] or "-"] for m, q in r["ratios"].items()])
    return C.publish(args, NAME, result, plot, report)


if __name__ == "__main__":
    main()
