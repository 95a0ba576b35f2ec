"""Train a file-backed embedding table larger than this machine's RAM, for a bounded number of steps.

    python scripts/big_table.py --rows 80000000 --dim 128 --dir /tmp/big   # 41 GB of float32 rows
    python scripts/big_table.py --small                                      # the quick version the tests run
    sudo python scripts/big_table.py --rows 8000000 --memory-limit 1.6G --mode sync   # 3.8 GiB, 1.6 GB cgroup

``--memory-limit`` runs the training in a new cgroup v1 memory cgroup (``/sys/fs/cgroup/memory/``) limited to
that size, then removes the cgroup: the page cache cannot hold the table, the same effect as a table larger
than RAM without a 40 GB file. Creating one needs root; without the rights it stops with an error saying so.

The table is ``dgl_oac.NodeEmbedding(rows, dim, storage=<dir>/table.bin)`` (a shared memory map of a file),
initialised with N(0, 0.1) rows (written in 1M-row chunks: every page holds data, so a row not in the page
cache is a real disk read), then trained as a KG-style link predictor: batches of ``--batch`` random edges (uniform
endpoints, or with ``--power`` a power law of row popularity) plus
``--negatives`` shared uniform negatives (dgl_oac.dgl_frontend.sampling.edge.EdgeBatchSampler, lean layout), dot-product
scores, softplus loss, SparseSGD (no optimizer-state columns, so the table is not widened). After training it
flushes the write-back, ``sync_to_disk()``s the file, re-reads a sample of trained rows with ``read()`` (not
the map) to check they reached the file, and deletes the file (``--keep`` keeps it). ``--storage memory`` trains
the same table in memory instead: the reference a file table that fits in memory is measured against.

It refuses to start unless the disk has the table's size plus 10% free. Prints one JSON line: table and RAM
sizes, init seconds, training steps/s and rows/s, major page faults during training, the bytes it read and
dirtied, the reads and writes per second the disk completed meanwhile (every process's), peak RSS.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parent))
from memory_cgroup import MemoryCgroup, parse_size  # noqa: E402 (a sibling module of this script)

import dgl
import psutil
import torch
import torch.nn.functional as F

import dgl_oac
from dgl_oac.dgl_frontend.sampling.edge import EdgeBatchSampler
from dgl_oac.engine.table import anonymous_memory


def endpoints(rows: int, n: int, power: float, gen: torch.Generator) -> torch.Tensor:
    """``int64[n]`` row ids: uniform (``power`` 0), or the row of popularity rank r drawn with probability
    proportional to ``(r + 1) ** -power``, the ranks laid over the rows in a random order (a real graph's hot nodes
    are anywhere in the file)."""
    if power == 0:
        return torch.randint(0, rows, (n,), generator=gen)
    weights = torch.arange(1, rows + 1, dtype=torch.float64).pow_(-power)
    ranks = torch.multinomial(weights, n, replacement=True, generator=gen)
    return torch.randperm(rows, generator=gen)[ranks]


def top_share(rows: int, power: float, share: float = 0.1) -> float:
    """The probability that an endpoint drawn by :func:`endpoints` falls on the ``share`` most popular rows."""
    weights = torch.arange(1, rows + 1, dtype=torch.float64).pow_(-power)
    return float(weights[: max(1, int(rows * share))].sum() / weights.sum())


def build_graph(rows: int, edges: int, seed: int, power: float = 0.0) -> dgl.DGLGraph:
    gen = torch.Generator().manual_seed(seed)
    return dgl.graph((endpoints(rows, edges, power, gen), endpoints(rows, edges, power, gen)), num_nodes=rows)


def loss_of(batch: Any, name: str) -> torch.Tensor:
    _, pair, neg, _ = batch
    x = pair.ndata[name]
    src, dst = pair.edges()
    cand = neg.edges()[0]  # lean layout: the shared negatives, as self-loops
    pos = (x[src] * x[dst]).sum(1)
    negs = x[src] @ x[cand].T
    return F.softplus(-pos).mean() + F.softplus(negs).mean()


def disk_io() -> Dict[str, int]:
    """Bytes this process made the kernel read from / write to the disk (Linux /proc/self/io; {} elsewhere)."""
    try:
        fields = dict(line.split(": ") for line in Path("/proc/self/io").read_text().splitlines())
        return {"read": int(fields["read_bytes"]), "write": int(fields["write_bytes"])}
    except (OSError, KeyError, ValueError):
        return {}


def device_ops(folder: Path) -> Dict[str, int]:
    """Reads and writes the block device holding ``folder`` has completed (Linux /sys/dev/block; {} elsewhere).
    Every process's I/O to that device counts, so on a shared machine this is an upper bound for ours."""
    try:
        dev = os.stat(folder).st_dev
        fields = Path(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}/stat").read_text().split()
        return {"reads": int(fields[0]), "writes": int(fields[4]), "write_sectors": int(fields[6])}
    except (OSError, IndexError, ValueError):
        return {}


def check_rows_on_disk(emb: dgl_oac.NodeEmbedding, ids: torch.Tensor) -> bool:
    """Read rows ``ids`` from the table file with pread (not the map) and compare with the table."""
    width = emb.store.width
    fd = os.open(emb.store.path, os.O_RDONLY)
    try:
        for i in ids.tolist():
            raw = os.pread(fd, width * 4, i * width * 4)
            if not torch.equal(torch.frombuffer(bytearray(raw), dtype=torch.float32), emb.store.table[i]):
                return False
    finally:
        os.close(fd)
    return True


def run_limited(limit: int, argv: List[str]) -> Dict[str, Any]:
    """Run this script (without ``--memory-limit``) in a new memory cgroup of ``limit`` bytes; its report plus
    the cgroup's peak usage."""
    child = [a for i, a in enumerate(argv) if not a.startswith("--memory-limit")
             and (i == 0 or argv[i - 1] != "--memory-limit")]
    with MemoryCgroup(f"dgl-oac-big-{os.getpid()}", limit) as group:
        out = subprocess.run([sys.executable, __file__, *child], stdout=subprocess.PIPE, text=True,
                             preexec_fn=group.join_preexec)
        peak = group.peak_bytes()
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if out.returncode not in (0, 1) or not lines:
        raise SystemExit(f"big_table: the run in the memory cgroup failed (exit {out.returncode})")
    report = json.loads(lines[-1])
    report.update({"memory_limit_gib": limit / 2**30, "cgroup_peak_gib": peak / 2**30})
    print(json.dumps(report))
    return report


def main(argv: Optional[List[str]] = None) -> Dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=80_000_000)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--dir", default=str(Path(tempfile.gettempdir()) / "dgl-oac-big"),
                   help="folder for the table file")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch", type=int, default=4096, help="positive edges per batch")
    p.add_argument("--negatives", type=int, default=256, help="shared negatives per batch")
    p.add_argument("--mode", default="oac", choices=dgl_oac.MODES)
    p.add_argument("--prefetch", type=lambda v: v if v == "auto" else int(v), default=4, help="an int, or auto")
    p.add_argument("--background-priority", default="auto", choices=("auto", "idle", "normal"),
                   help="the loader's background_priority (gather and write-back threads)")
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--keep", action="store_true", help="keep the table file")
    p.add_argument("--power", type=float, default=0.0,
                   help="edge endpoints' popularity exponent: 0 uniform (default), 1.0 a power law like a real "
                        "graph's degrees (the report gives the share of reads on the top 10%% of rows)")
    p.add_argument("--storage", default="file", choices=("file", "memory"),
                   help="the table in a file under --dir (default), or in memory: the reference for a table that "
                        "fits")
    p.add_argument("--warmup", type=int, default=0,
                   help="steps trained before the timing starts (a cache's steady state; the same for every mode)")
    p.add_argument("--cache", default="auto",
                   help="the file table's row cache: 'auto' (NodeEmbedding's default), or bytes (0: none)")
    p.add_argument("--small", action="store_true", help="200k x 16 rows, 20 steps (the test suite's version)")
    p.add_argument("--memory-limit", default=None, metavar="SIZE",
                   help="run in a new cgroup v1 memory cgroup of this size (e.g. 1.6G; needs root), then remove it")
    args = p.parse_args(argv)
    if args.memory_limit is not None:
        return run_limited(parse_size(args.memory_limit), sys.argv[1:] if argv is None else list(argv))
    if args.small:
        args.rows, args.dim, args.steps, args.batch, args.negatives = 200_000, 16, 20, 256, 32
    folder = Path(args.dir)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "table.bin"
    table_bytes = args.rows * args.dim * 4
    on_file = args.storage == "file"
    free = shutil.disk_usage(folder).free + (path.stat().st_size if path.exists() else 0)
    if on_file and free < table_bytes * 1.1:
        raise SystemExit(f"big_table: {folder} has {free / 2**30:.1f} GiB free, the table needs "
                         f"{table_bytes / 2**30:.1f} GiB (+10%)")
    ram = psutil.virtual_memory().total
    torch.manual_seed(args.seed)
    report: Dict[str, Any] = {"rows": args.rows, "dim": args.dim, "table_gib": table_bytes / 2**30,
                              "ram_gib": ram / 2**30, "table_over_ram": table_bytes / ram, "mode": args.mode,
                              "storage": args.storage, "cache": args.cache}
    emb = None
    existed = path.exists()  # another run's table (NodeEmbedding refuses it): never ours to delete
    try:
        t0 = time.perf_counter()
        emb = dgl_oac.NodeEmbedding(args.rows, args.dim, "big", init_func=lambda t: t.normal_(std=0.1),
                                    storage=path if on_file else "memory",
                                    cache=args.cache if args.cache == "auto" else int(args.cache))
        report["init_s"] = time.perf_counter() - t0
        opt = dgl_oac.SparseSGD([emb], lr=args.lr)
        g = build_graph(args.rows, (args.warmup + args.steps) * args.batch, args.seed, args.power)
        report.update({"power": args.power, "endpoint_share_top10pct": top_share(args.rows, args.power)})
        sampler = EdgeBatchSampler(num_negatives=args.negatives, shared=True, materialize_negatives=False)
        loader = dgl_oac.DataLoader(g, torch.arange(g.num_edges()), sampler, embeddings=[emb], mode=args.mode,
                                    batch_size=args.batch, shuffle=True, seed=args.seed, prefetch=args.prefetch,
                                    background_priority=args.background_priority)
        proc = psutil.Process()
        steps, rows, losses, touched, anon_first, warm = 0, 0, [], [], 0, args.warmup
        cache0 = (0, 0, 0, 0)

        def timing_starts(first: bool = False) -> Tuple[Any, ...]:  # after the warm-up steps (none by default)
            # (before the first batch the cache is not made: its first gather sizes it, leaving its batch's pages)
            c = None if first else emb.store.row_cache()
            counts = (0, 0, 0, 0) if c is None else (c.hits, c.misses, c.rows_written, c.rows_cleaned)
            return (resource.getrusage(resource.RUSAGE_SELF).ru_majflt, disk_io(), device_ops(folder),
                    time.perf_counter(), counts)

        faults0, io0, ops0, t0, cache0 = timing_starts(first=True)
        for batch in loader:
            anon_first = anon_first or anonymous_memory()
            loss = loss_of(batch, emb.name)
            loss.backward()
            opt.step()
            if warm:
                warm -= 1
                if not warm:
                    faults0, io0, ops0, t0, cache0 = timing_starts()
                continue
            steps += 1
            rows += batch[0].numel()
            losses.append(float(loss.detach()))
            if steps <= 3:
                touched.append(batch[0][:: max(1, batch[0].numel() // 8)])
            if steps >= args.steps:
                break
        emb.flush()
        train_s = time.perf_counter() - t0
        cache = emb.store.row_cache()
        if cache is not None:  # (rows: gathered from the cache or the file; written to the file when they left)
            hits, misses = cache.hits - cache0[0], cache.misses - cache0[1]
            report.update({"cache_rows": cache.capacity, "cache_hits": hits, "cache_misses": misses,
                           "cache_hit_rate": hits / max(1, hits + misses),
                           "cache_rows_written": cache.rows_written - cache0[2],
                           "cache_rows_cleaned": cache.rows_cleaned - cache0[3], "cache_off": cache.off_reason,
                           "cache_hits_over_random": cache.hits_over_random})
        ops1 = device_ops(folder)
        loader.close()
        t1 = time.perf_counter()
        emb.store.sync_to_disk()  # (a no-op in memory)
        report.update({
            "steps": steps, "warmup_steps": args.warmup, "train_s": train_s, "steps_per_s": steps / train_s, "rows_per_s": rows / train_s,
            "gb_per_s_gathered": rows * emb.store.width * 4 / train_s / 1e9,
            "major_faults": resource.getrusage(resource.RUSAGE_SELF).ru_majflt - faults0,
            "disk_read_gb_in_training": (disk_io().get("read", 0) - io0.get("read", 0)) / 1e9,
            "dirtied_gb_in_training": (disk_io().get("write", 0) - io0.get("write", 0)) / 1e9,
            "device_reads_per_s": (ops1.get("reads", 0) - ops0.get("reads", 0)) / train_s,
            "device_writes_per_s": (ops1.get("writes", 0) - ops0.get("writes", 0)) / train_s,
            "device_write_gb": (ops1.get("write_sectors", 0) - ops0.get("write_sectors", 0)) * 512 / 1e9,
            "sync_to_disk_s": time.perf_counter() - t1, "rss_gib": proc.memory_info().rss / 2**30,
            "anonymous_gib": anonymous_memory() / 2**30, "anonymous_gib_at_first_batch": anon_first / 2**30,
            "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
            "loss_first": losses[0], "loss_last": losses[-1],
            "rows_on_disk_match": check_rows_on_disk(emb, torch.cat(touched)) if on_file else None,
            "stats": {k: round(v, 2) for k, v in loader.stats.seconds.items()}})
    finally:
        if emb is not None:
            emb.close()
            del emb
        if not args.keep and not existed and path.exists():
            path.unlink()
    report["file_deleted"] = not path.exists()
    print(json.dumps(report))
    return report


if __name__ == "__main__":
    sys.exit(0 if main()["rows_on_disk_match"] is not False else 1)
