"""Tables larger than the page cache: sync, async and oac side by side against the disk's own limit.

    sudo python benchmarks/bench_disk.py                     # 8M x 128 (3.8 GiB) in a 1.6 GB memory cgroup
    sudo python benchmarks/bench_disk.py --quick             # a smoke test

1. The limit: 4 KiB random reads with direct I/O at queue depth 1, 4 and 32 on the disk holding ``--dir``
   (fio where installed, else :func:`python_randread`: threads issuing O_DIRECT preads, one per depth unit).
   A 128-float row is 512 bytes, so a random row is one page read: the depth-32 rate in reads/s is the
   rows/s a gather of cold rows can reach. A trained row is also written back, dirtying its page, so the disk
   serves a random read and a random write per row: the mixed 50/50 random read/write rate at depth 32 is
   measured too (fio, else :func:`python_randrw`), and its reads/s are the rows/s any mode can train at once the
   table does not fit and every trained row costs a read and a write.
2. ``scripts/big_table.py --memory-limit`` once per mode and round (rounds interleaved, order rotated): a new
   table file each run, trained for ``--steps`` steps in a cgroup the table does not fit in.

Prints the limit, then a table per mode (median over rounds) with oac / sync and rows/s / the depth-32 limit.

A mode labelled ``MODE:memory`` (``--modes sync,oac,oac:memory``) trains the same table in memory with no limit: the
in-memory reference, in the same interleaved rounds. ``--power 1.0`` draws the edges' endpoints with a power law of
row popularity (``scripts/big_table.py --power``). The table gives the disk's reads and writes per trained row
(every process's I/O to that disk, over the rows the batches read) and the row cache's hit rate. ``MODE:nocache``
runs the file table without its row cache (``NodeEmbedding(cache=0)``), ``MODE=auto`` (or ``=K``) at that
prefetch; ``--warmup N`` trains N untimed steps first (a cache's steady state). A PNG of steps/s and I/Os per row
is written beside the JSON (``--replot JSON`` redraws a saved run's).

``--fits``: a file-backed table that fits in memory (default 500k x 128, 256 MB; no cgroup, no disk limit): every
mode on the file and on the same table in memory (``MODE:memory``), interleaved, and each mode's file / memory
ratio (goal: within 10%; ``tests/engine/test_disk.py`` checks that such a table makes no read-ahead or write-out
call per batch).

``--base-tree DIR`` (a checkout of an earlier commit, e.g. ``git worktree add --detach /tmp/base main``) adds
``--base-modes`` run with that checkout's ``dgl_oac`` (through PYTHONPATH; the script stays this one), labelled
``oac@base``, in the same interleaved rounds: a before/after side by side.
"""
from __future__ import annotations

import json
import mmap
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Dict, List

from _common import (base_parser, environment, finish, loadavg, median, out_path, png_path, print_table, pyplot,
                     rotated, save_figure)

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "scripts" / "big_table.py"


def fio_randread(path: Path, depth: int, seconds: float) -> float:
    """4 KiB random reads/s with direct I/O at ``depth`` (fio, libaio) over the file ``path``."""
    out = subprocess.run(["fio", "--name=rr", f"--filename={path}", "--rw=randread", "--bs=4k", "--direct=1",
                          "--ioengine=libaio", f"--iodepth={depth}", f"--runtime={seconds}", "--time_based",
                          "--output-format=json"], capture_output=True, text=True, check=True)
    return float(json.loads(out.stdout)["jobs"][0]["read"]["iops"])


def fio_randrw(path: Path, depth: int, seconds: float) -> Dict[str, float]:
    """4 KiB random reads/s and writes/s, half each, with direct I/O at ``depth`` (fio, libaio) over ``path``."""
    out = subprocess.run(["fio", "--name=rw", f"--filename={path}", "--rw=randrw", "--rwmixread=50", "--bs=4k",
                          "--direct=1", "--ioengine=libaio", f"--iodepth={depth}", f"--runtime={seconds}",
                          "--time_based", "--output-format=json"], capture_output=True, text=True, check=True)
    job = json.loads(out.stdout)["jobs"][0]
    return {"reads_per_s": float(job["read"]["iops"]), "writes_per_s": float(job["write"]["iops"])}


def python_randread(path: Path, depth: int, seconds: float) -> float:
    """fio's random-read measurement without fio (:func:`python_randrw` with no writes)."""
    return python_randrw(path, depth, seconds, write_share=0.0)["reads_per_s"]


def python_randrw(path: Path, depth: int, seconds: float, write_share: float = 0.5) -> Dict[str, float]:
    """fio's measurement without fio: ``depth`` threads, each one O_DIRECT 4 KiB pread (or, with probability
    ``write_share``, pwrite) at a time at random aligned offsets of ``path`` (os.preadv releases the GIL, so
    ``depth`` I/Os are in flight); returns ``{"reads_per_s", "writes_per_s"}``."""
    pages = path.stat().st_size // 4096
    reads, writes = [0] * depth, [0] * depth
    errors: List[BaseException] = []
    stop = time.monotonic() + seconds

    def worker(k: int) -> None:
        try:
            io(k)
        except BaseException as exc:  # noqa: BLE001 - raised in the caller below
            errors.append(exc)

    def io(k: int) -> None:
        fd = os.open(path, (os.O_RDWR if write_share else os.O_RDONLY) | os.O_DIRECT)
        buf = mmap.mmap(-1, 4096)  # page-aligned, as O_DIRECT needs
        rng = random.Random(k)
        try:
            while time.monotonic() < stop:
                offset = rng.randrange(pages) * 4096
                if write_share and rng.random() < write_share:
                    os.pwritev(fd, [buf], offset)
                    writes[k] += 1
                else:
                    os.preadv(fd, [buf], offset)
                    reads[k] += 1
        finally:
            os.close(fd)

    threads = [threading.Thread(target=worker, args=(k,), name=f"randrw-{k}") for k in range(depth)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(seconds + 30)
    if errors:
        raise errors[0]
    elapsed = time.monotonic() - t0
    return {"reads_per_s": sum(reads) / elapsed, "writes_per_s": sum(writes) / elapsed}


def disk_limit(folder: Path, size_gib: float, seconds: float) -> Dict[str, Any]:
    """Random-read rates at depths 1, 4, 32 on a ``size_gib`` file written in ``folder`` (deleted after)."""
    path = folder / "randread.bin"
    block = os.urandom(1 << 20)
    with open(path, "wb") as f:
        for _ in range(int(size_gib * 1024)):
            f.write(block)
        f.flush()
        os.fsync(f.fileno())
    try:
        tool = "fio" if shutil.which("fio") else "python"
        fn = fio_randread if tool == "fio" else python_randread
        out: Dict[str, Any] = {"tool": tool, "iops": {d: fn(path, d, seconds) for d in (1, 4, 32)}}
        out["randrw_qd32"] = (fio_randrw if tool == "fio" else python_randrw)(path, 32, seconds)
        return out
    finally:
        path.unlink()


def command(args: Any, label: str) -> List[str]:
    """big_table's command line for ``label``: a mode, ``mode@base`` for the ``--base-tree`` checkout's code, either
    with ``=auto`` (or ``=K``: that prefetch, else ``--prefetch``), with ``:memory`` (the in-memory reference) or
    ``:nocache`` (the file table without its row cache), and with ``/idle`` or ``/normal`` for that background
    priority (else ``--background-priority``): ``oac=auto:nocache/normal``."""
    label, _, priority = label.partition("/")
    label, _, storage = label.partition(":")
    label, _, prefetch = label.partition("=")
    mode = label.partition("@")[0]
    # a MODE:memory label is the in-memory reference: the same table in RAM, with no memory limit
    limit = [] if args.fits or storage == "memory" else ["--memory-limit", args.memory_limit]
    limit += ["--power", str(args.power), "--warmup", str(args.warmup)]
    return [sys.executable, str(SCRIPT), "--rows", str(args.rows), "--dim", str(args.dim), "--steps",
            str(args.steps), "--prefetch", prefetch or str(args.prefetch), *limit, "--mode", mode, "--dir", args.dir,
            "--background-priority", priority or args.background_priority,
            "--storage", "memory" if storage == "memory" else "file",
            "--cache", "0" if storage == "nocache" else "auto"]


def run_mode(args: Any, label: str) -> Dict[str, Any]:
    """One big_table run of ``label`` (:func:`command`)."""
    cmd = command(args, label)
    base = "@" in label
    env = dict(os.environ, PYTHONPATH=str(Path(args.base_tree).resolve())) if base else None
    load = loadavg()
    out = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, check=True, env=env)
    report = json.loads([line for line in out.stdout.splitlines() if line.startswith("{")][-1])
    report["load_before"], report["load_after"] = load, loadavg()
    print(f"  {label:8s} {report['steps_per_s']:.2f} steps/s {report['rows_per_s'] / 1e3:.1f}k rows/s "
          f"load {load[0]:.1f}->{report['load_after'][0]:.1f}", flush=True)
    return report


def main() -> None:
    p = base_parser(__doc__, "bench_disk")
    p.add_argument("--rows", type=int, default=None,
                   help="table rows (default: 8M, out of core in the memory limit; with --fits 500k)")
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--steps", type=int, default=120)
    p.add_argument("--prefetch", type=int, default=4)
    p.add_argument("--memory-limit", default="1.6G")
    p.add_argument("--modes", default="sync,async,oac",
                   help="modes, each optionally MODE/idle or MODE/normal (its background priority)")
    p.add_argument("--beside", default="quiet", choices=("quiet", "burner"),
                   help="run every mode beside one busy process (a Python loop: one core's worth of CPU)")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--background-priority", default="auto", choices=("auto", "idle", "normal"))
    p.add_argument("--fio-seconds", type=float, default=8.0)
    p.add_argument("--dir", default=str(Path(tempfile.gettempdir()) / "dgl-oac-bench-disk"))
    p.add_argument("--base-tree", default=None, help="a checkout whose dgl_oac runs --base-modes (before/after)")
    p.add_argument("--base-modes", default="oac")
    p.add_argument("--power", type=float, default=0.0,
                   help="edge endpoints' popularity exponent (scripts/big_table.py --power): 0 uniform, 1.0 power law")
    p.add_argument("--warmup", type=int, default=0,
                   help="steps each run trains before its timing starts (a row cache's steady state)")
    p.add_argument("--fits", action="store_true",
                   help="a file table that fits in memory, against the same table in memory (module docstring)")
    p.add_argument("--replot", default=None, metavar="JSON", help="only redraw a saved run's PNG")
    args = p.parse_args()
    if args.replot:
        return replot(Path(args.replot))
    if args.fits:
        return fits(args)
    if args.base_tree is not None and not (Path(args.base_tree) / "dgl_oac" / "__init__.py").exists():
        raise SystemExit(f"bench_disk: --base-tree {args.base_tree} is not a dgl-oac checkout (no dgl_oac/)")
    if args.rows is None:
        args.rows = 8_000_000
    if args.quick:
        args.rows, args.steps, args.rounds, args.fio_seconds = 400_000, 20, 1, 1.0
    Path(args.dir).mkdir(parents=True, exist_ok=True)
    modes = args.modes.split(",")
    if args.base_tree is not None:
        modes += [f"{m}@base" for m in args.base_modes.split(",")]
    limit = disk_limit(Path(args.dir), 0.25 if args.quick else 4.0, args.fio_seconds)
    qd32 = limit["iops"][32]
    mixed = limit["randrw_qd32"]["reads_per_s"] + limit["randrw_qd32"]["writes_per_s"]
    print(f"disk limit ({limit['tool']}, 4 KiB random reads, direct I/O): "
          + ", ".join(f"QD{d} {v / 1e3:.1f}k/s" for d, v in limit["iops"].items())
          + f"  -> the limit for cold 512-byte rows: {qd32 / 1e3:.1f}k rows/s", flush=True)
    rw = limit["randrw_qd32"]
    print(f"disk, 50/50 random reads and writes at QD32: {rw['reads_per_s'] / 1e3:.1f}k reads/s + "
          f"{rw['writes_per_s'] / 1e3:.1f}k writes/s  -> the limit for rows read and written back: "
          f"{rw['reads_per_s'] / 1e3:.1f}k rows/s", flush=True)
    runs: Dict[str, List[Dict[str, Any]]] = {m: [] for m in modes}
    burner = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if args.beside == "burner" else None
    try:
        for r in range(args.rounds):
            print(f"round {r}", flush=True)
            for mode in rotated(modes, r):
                runs[mode].append(run_mode(args, mode))
    finally:
        if burner is not None:
            burner.kill()
            burner.wait()
    rows = []
    for mode in modes:  # (the device's reads/writes per second count every process's I/O to that disk)
        sps = median(x["steps_per_s"] for x in runs[mode])
        rps = median(x["rows_per_s"] for x in runs[mode])
        ratio = median(a["steps_per_s"] / b["steps_per_s"] for a, b in zip(runs[mode], runs[modes[0]]))
        st = runs[mode][-1]["stats"]
        dev = runs[mode][-1]
        rows.append([mode, f"{sps:.2f}", f"{ratio:.2f}x", f"{rps / 1e3:.1f}k", f"{rps / qd32:.2f}",
                     f"{st['gather']:.1f}", f"{st['wait']:.1f}", f"{st['commit']:.1f}", f"{st['writeback']:.1f}",
                     f"{dev.get('device_reads_per_s', 0) / 1e3:.1f}k",
                     f"{dev.get('device_writes_per_s', 0) / 1e3:.1f}k",
                     f"{dev.get('device_reads_per_s', 0) / dev['rows_per_s']:.2f}",
                     f"{dev.get('device_writes_per_s', 0) / dev['rows_per_s']:.2f}",
                     f"{(dev.get('device_reads_per_s', 0) + dev.get('device_writes_per_s', 0)) / mixed:.2f}",
                     "off" if dev.get("cache_off") else
                     f"{dev['cache_hit_rate']:.2f}" if "cache_hit_rate" in dev else "-"])
    print_table(f"{args.rows:,} x {args.dim} in a {args.memory_limit} cgroup, {args.steps} steps after "
                f"{args.warmup}, prefetch {args.prefetch}, background {args.background_priority}, beside: "
                f"{args.beside} (median of {args.rounds} rounds; seconds from the last round)",
                ["mode", "steps/s", f"/ {modes[0]}", "rows/s", "/ QD32", "gather s", "wait s", "commit s",
                 "writeback s", "disk r/s", "disk w/s", "reads/row", "writes/row", "I/O / mixed QD32", "cache hits"],
                rows)
    out = out_path(args, "bench_disk")
    finish({"args": vars(args), "env": environment(), "disk": limit, "runs": runs}, out)
    plot(runs, title(vars(args)), png_path(out))


def title(a: Dict[str, Any]) -> str:
    """The plot's title, from a run's arguments (``vars(args)``, or a saved JSON's ``args``)."""
    return (f"{a['rows']:,} x {a['dim']} in a {a['memory_limit']} cgroup, power {a.get('power', 0.0)}, "
            f"{a['steps']} steps after {a.get('warmup', 0)} (median of {a['rounds']} rounds)")


def plot(runs: Dict[str, List[Dict[str, Any]]], title: str, png: Path) -> None:
    """Steps/s of each label (median over rounds) beside the disk's reads and writes per trained row."""
    plt = pyplot()
    labels = list(runs)
    fig, (speed, io) = plt.subplots(1, 2, figsize=(max(8.0, 1.5 * len(labels)), 4.0))
    speed.bar(labels, [median(r["steps_per_s"] for r in runs[m]) for m in labels], color="tab:blue")
    speed.set_ylabel("steps/s")
    speed.set_yscale("log")
    per_row = {m: (median(r.get("device_reads_per_s", 0) / r["rows_per_s"] for r in runs[m]),
                   median(r.get("device_writes_per_s", 0) / r["rows_per_s"] for r in runs[m])) for m in labels}
    x = range(len(labels))
    io.bar([i - 0.2 for i in x], [per_row[m][0] for m in labels], 0.4, label="disk reads per trained row")
    io.bar([i + 0.2 for i in x], [per_row[m][1] for m in labels], 0.4, label="disk writes per trained row")
    io.legend(fontsize=7)
    for ax in (speed, io):
        ax.set_xticks(list(x), labels, rotation=30, ha="right", fontsize=8)
    fig.suptitle(title, fontsize=9)
    save_figure(fig, png)


def replot(path: Path) -> None:
    """The PNG of a saved run (``--replot JSON``)."""
    data = json.loads(path.read_text())
    plot(data["runs"], title(data["args"]), png_path(path))


def fits(args: Any) -> None:
    """``--fits``: every mode on a file table that fits in memory and on the same table in memory, interleaved."""
    if args.rows is None:
        args.rows = 500_000
    if args.quick:
        args.rows, args.steps, args.rounds = 100_000, 20, 1
    Path(args.dir).mkdir(parents=True, exist_ok=True)
    modes = args.modes.split(",")
    labels = [m + s for m in modes for s in ("", ":memory")]
    runs: Dict[str, List[Dict[str, Any]]] = {label: [] for label in labels}
    for r in range(args.rounds):
        print(f"round {r}", flush=True)
        for label in rotated(labels, r):
            runs[label].append(run_mode(args, label))
    rows = []
    for mode in modes:
        on_file, in_memory = runs[mode], runs[mode + ":memory"]
        ratio = median(a["steps_per_s"] / b["steps_per_s"] for a, b in zip(on_file, in_memory))
        to_first = median(a["steps_per_s"] / b["steps_per_s"] for a, b in zip(on_file, runs[modes[0]]))
        rows.append([mode, f"{median(x['steps_per_s'] for x in on_file):.2f}",
                     f"{median(x['steps_per_s'] for x in in_memory):.2f}", f"{ratio:.2f}x", f"{to_first:.2f}x",
                     str(on_file[-1]["major_faults"])])
    print_table(f"{args.rows:,} x {args.dim} ({args.rows * args.dim * 4 / 2**20:.0f} MiB), {args.steps} steps, "
                f"prefetch {args.prefetch}, background {args.background_priority} (median of {args.rounds} rounds)",
                ["mode", "file steps/s", "memory steps/s", "file / memory", f"file / {modes[0]} file",
                 "major faults"], rows)
    finish({"args": vars(args), "env": environment(), "runs": runs}, out_path(args, "bench_disk_fits"))


if __name__ == "__main__":
    main()
