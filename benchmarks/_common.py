"""Helpers shared by the benchmark scripts: environment record, JSON + PNG output, timing one training run,
ratio tables, peak-memory probes.

Every script measures all the configurations it compares inside one invocation, interleaved round by round
(round r runs every configuration once, in a rotated order), so ratios between configurations are taken
between runs that saw the same machine load. Ratios are computed per round and summarised by their median.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import gc
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, ContextManager, Dict, Iterable, List, Optional, Sequence

import _omp  # noqa: F401  (sets OMP_WAIT_POLICY before torch loads)
import torch

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
RESULTS = HERE / "results"
# --quick output is a smoke test's, not a measurement: it goes outside the checkout so that no run dirties it
QUICK_RESULTS = Path(tempfile.gettempdir()) / "dgl-oac-bench-quick"

# --------------------------------------------------------------------------------------------------------------
def base_parser(description: str, default_name: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--quick", action="store_true", help="tiny settings that finish in under a minute (smoke test)")
    p.add_argument("--out", default=None,
                   help=f"JSON output (a PNG is written beside it); default benchmarks/results/{default_name}.json "
                        f"({QUICK_RESULTS}/ with --quick)")
    p.add_argument("--no-progress", dest="progress", action="store_false", help="hide tqdm progress bars")
    p.add_argument("--seed", type=int, default=0, help="seed of the graph, the batch stream and the model")
    _omp.add_argument(p)
    return p


def out_path(args: argparse.Namespace, name: str) -> Path:
    if args.out:
        return Path(args.out)
    return (QUICK_RESULTS if args.quick else RESULTS) / f"{name}.json"


def str_list(text: str) -> List[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def int_list(text: str) -> List[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def float_list(text: str) -> List[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def loadavg() -> List[float]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


def git_revision() -> Dict[str, Any]:
    """Read-only: the commit and whether the package sources differ from it."""
    def git(*a: str) -> str:
        try:
            return subprocess.run(["git", *a], cwd=REPO, capture_output=True, text=True, timeout=10).stdout.strip()
        except Exception:  # noqa: BLE001 - no git is fine
            return ""
    return {"commit": git("rev-parse", "HEAD"), "dgl_oac_dirty": bool(git("status", "--porcelain", "dgl_oac"))}


def environment() -> Dict[str, Any]:
    import dgl
    try:
        import psutil
        mem = psutil.virtual_memory().total
    except ImportError:
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    cpu = platform.processor() or ""
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), cpu)
    except OSError:
        pass
    return {
        "date": _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "host_cpus": os.cpu_count(), "cpu_model": cpu, "memory_gib": round(mem / 2**30, 1),
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "python": platform.python_version(), "torch": torch.__version__, "dgl": dgl.__version__,
        "torch_threads_default": torch.get_num_threads(), "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "unset"),
        "loadavg_start": loadavg(), **git_revision(),
    }


def portable(obj: Any) -> Any:
    """``obj`` with every absolute path (a string, or a word of a command line) made machine-independent:
    relative to the repository when inside it, else its file name under ``<elsewhere>/`` (a JSON is committed;
    the machine's directory layout is not its content)."""
    if isinstance(obj, dict):
        return {k: portable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [portable(v) for v in obj]
    if isinstance(obj, str) and "/" in obj and "\n" not in obj:
        return " ".join(_portable_path(w) if w.startswith("/") else w for w in obj.split(" "))
    return obj


def _portable_path(word: str) -> str:
    try:
        return str(Path(word).resolve().relative_to(REPO))
    except ValueError:
        return f"<elsewhere>/{Path(word).name}"


def finish(result: Dict[str, Any], path: Path) -> None:
    result["env"]["loadavg_end"] = loadavg()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        json.dump(portable(result), f, indent=2, default=float)
    os.replace(tmp, path)


class JsonLines:
    """A file that gets one JSON object a line (made machine-independent by :func:`portable`), appended and
    flushed to disk at once: a run that is killed keeps every line it wrote."""

    def __init__(self, path: str) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def append(self, obj: Dict[str, Any]) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps(portable(obj), default=float) + "\n")
            f.flush()
            os.fsync(f.fileno())


def png_path(path: Path) -> Path:
    return path.with_suffix(".png")


def save_figure(fig: Any, png: Path, dpi: int = 110) -> None:
    """Lay out, write and close a matplotlib figure."""
    fig.tight_layout()
    fig.savefig(png, dpi=dpi)
    pyplot().close(fig)


def publish(args: argparse.Namespace, name: str, result: Dict[str, Any], plot: Callable[[Path], None],
            report: Callable[[], None]) -> Dict[str, Any]:
    """Every script's ending: the JSON (atomically), its PNG beside it, the printed report, where both went."""
    out = out_path(args, name)
    finish(result, out)
    plot(png_path(out))
    report()
    print(f"\nwrote {out} and {png_path(out)}")
    return result


def pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def median(xs: Iterable[float]) -> float:
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else float("nan")


def spread(xs: Sequence[float]) -> Dict[str, float]:
    xs = [x for x in xs if x is not None]
    if not xs:
        return {"median": float("nan"), "min": float("nan"), "max": float("nan"), "n": 0}
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}


def rotated(items: Sequence[Any], r: int) -> List[Any]:
    """Round ``r``'s order: ``items`` rotated by ``r`` (and reversed on odd rounds), so no configuration always
    runs first or right after the same neighbour."""
    items = list(items)
    k = r % len(items) if items else 0
    out = items[k:] + items[:k]
    return out[::-1] if r % 2 else out


def print_table(title: str, header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    def fmt(v: Any) -> str:
        if isinstance(v, float):
            return f"{v:.3g}" if abs(v) < 1e4 else f"{v:,.0f}"
        return str(v)
    cells = [[fmt(v) for v in r] for r in rows]
    widths = [max(len(str(h)), *(len(c[i]) for c in cells)) if cells else len(str(h)) for i, h in enumerate(header)]
    lines = [title, "  ".join(str(h).ljust(w) for h, w in zip(header, widths)),
             "  ".join("-" * w for w in widths)]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in cells]
    text = "\n".join(lines)
    print("\n" + text, flush=True)
    return text


def peak_rss_mib() -> float:
    """Peak resident set size of this process so far (includes touched shared memory), MiB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def rss_mib() -> float:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:
        return float("nan")


def available_gib() -> float:
    try:
        import psutil
        return psutil.virtual_memory().available / 2**30
    except ImportError:
        return float("inf")


# --------------------------------------------------------------------------------------------------------------
class StepTimer:
    """Wrap a task's sparse optimizer ``step`` and embedding lookup to time them (both backends)."""

    def __init__(self, task: Any) -> None:
        self.seconds = {"emb_lookup": 0.0, "sparse_step": 0.0}
        opt = task.sparse
        inner_step = opt.step

        def step(*a: Any, **k: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return inner_step(*a, **k)
            finally:
                self.seconds["sparse_step"] += time.perf_counter() - t0
        opt.step = step
        task.emb = _TimedEmbedding(task.emb, self.seconds)


class _TimedEmbedding:
    def __init__(self, emb: Any, seconds: Dict[str, float]) -> None:
        self._emb, self._seconds = emb, seconds

    def __call__(self, *a: Any, **k: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return self._emb(*a, **k)
        finally:
            self._seconds["emb_lookup"] += time.perf_counter() - t0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._emb, name)


def stats_snapshot(loader: Any) -> Optional[Dict[str, Any]]:
    st = getattr(loader, "stats", None)
    if st is None:
        return None
    return {"seconds": dict(st.seconds), "rows_read": st.rows_read, "rows_patched": st.rows_patched,
            "rows_repatched_at_commit": st.rows_repatched_at_commit, "max_in_flight": st.max_in_flight,
            "background_threads": st.background_threads, "depths": dict(st.depths)}


def write_log(emb: Any) -> Any:
    """A dgl-oac table's write log (oac only; None otherwise, and for a plain DGL embedding)."""
    return getattr(getattr(emb, "pipeline", None), "log", None)


def writeback_busy(emb: Any) -> float:
    """Busy seconds of a dgl-oac table's write-back threads so far (0 for a plain DGL embedding)."""
    return emb.pipeline.writeback_seconds() if hasattr(emb, "pipeline") else 0.0


def device_sync(device: Any) -> None:
    """Wait for every kernel queued on ``device`` (CUDA; nothing to wait for on the CPU): a clock that stops
    before the device has run the steps it timed measures how fast they were queued, not run."""
    if isinstance(device, torch.device) and device.type == "cuda":
        torch.cuda.synchronize(device)


def timed_steps(task: Any, warmup: int, steps: int, window: Optional[ContextManager] = None) -> Dict[str, Any]:
    """Run ``warmup`` then ``steps`` training steps of ``task`` from a fresh epoch; time the second part.

    Returns wall seconds, CPU seconds (calling thread, whole process), batches, embedding rows, the main thread's split (``next`` = waiting for the loader,
    ``step`` = the task's training step, of which ``emb_lookup`` and ``sparse_step``), the loader's stage
    seconds during the timed window (dgl-oac modes), the write-back thread's busy seconds and the conflict rate.
    The write-back queue is flushed inside the timed window, so every timed step is in the table when the clock
    stops; on CUDA the device is synchronized before the clocks start and before they stop, and ``device_step_s``
    is each step's time on the compute stream (CUDA events around ``task.step``: the device's own time when it
    is the bottleneck, else the time it waited for the step's launches). ``window`` (e.g. a profiler) is entered
    around the timed steps only, outside the clocks.
    """
    timer = StepTimer(task)
    emb = task.emb._emb
    device = getattr(task, "device", None)
    it = iter(task.loader)
    for _ in range(warmup):
        task.step(next(it))
    if hasattr(emb, "flush"):
        emb.flush()
    device_sync(device)  # the warm-up's queued work is not the timed window's
    before = stats_snapshot(task.loader)
    wb0 = writeback_busy(emb)
    lookups0 = dict(timer.seconds)
    log0 = None if write_log(emb) is None else write_log(emb).capacity  # oac only
    with window if window is not None else contextlib.nullcontext():
        cpu_main0, cpu_proc0 = time.thread_time(), time.process_time()
        t0 = time.perf_counter()
        rows, t_next, t_step, events = _timed_window(task, it, emb, steps, device)
        wall = time.perf_counter() - t0
        cpu_main, cpu_proc = time.thread_time() - cpu_main0, time.process_time() - cpu_proc0
    after = stats_snapshot(task.loader)
    out: Dict[str, Any] = {
        "wall_s": wall, "batches": steps, "rows": rows, "batches_per_s": steps / wall, "rows_per_s": rows / wall,
        "rows_per_batch": rows / steps, "main": {"next": t_next, "step": t_step,
                                                 **{k: v - lookups0[k] for k, v in timer.seconds.items()}},
        "writeback_busy_s": writeback_busy(emb) - wb0,
        # CPU seconds: of the calling thread (the pipeline's critical path with torch threads = 1) and of the
        # whole process (all threads; on a machine shared with other work wall time alone misleads)
        "cpu_main_s": cpu_main, "cpu_process_s": cpu_proc,
    }
    if events:
        out["device_step_s"] = sum(a.elapsed_time(b) for a, b in events) / 1e3
    if log0 is not None:  # oac: did the write log grow (copying its live ring) inside the timed window?
        out["write_log_rows"] = [log0, write_log(emb).capacity]
    if before is not None and after is not None:
        out["stages"] = {k: after["seconds"][k] - before["seconds"][k] for k in after["seconds"]}
        read = after["rows_read"] - before["rows_read"]
        out["rows_read"] = read
        out["rows_patched"] = after["rows_patched"] - before["rows_patched"]
        out["conflict_rate"] = out["rows_patched"] / read if read else 0.0
        out["rows_repatched_at_commit"] = after["rows_repatched_at_commit"] - before["rows_repatched_at_commit"]
        out["max_in_flight"] = after["max_in_flight"]
        out["background_threads"] = after["background_threads"]  # each background thread's OpenMP team
        # prefetch="auto": batches handed out at each depth inside the timed window
        out["depths"] = {d: n - before["depths"].get(d, 0) for d, n in after["depths"].items()
                         if n - before["depths"].get(d, 0)}
    return out


def align_dgl_loader(task: Any, seed: int, epoch: int = 0) -> None:
    """Give a plain-DGL task the seed order (nodes or edges) dgl-oac's loader uses for ``(seed, epoch)``: the same
    seeds in every batch (DGL then samples their neighbourhoods and negatives with its own RNG, so the batches
    differ in detail but not in size)."""
    import dgl
    from dgl_oac.sampling import epoch_generator

    old = task.loader
    idx = old.indices
    order = idx[torch.randperm(idx.numel(), generator=epoch_generator(seed, epoch))]
    task.loader = dgl.dataloading.DataLoader(old.graph, order, old.graph_sampler, device=old.device,
                                             batch_size=task.cfg.batch_size, shuffle=False, drop_last=False)


def _timed_window(task: Any, it: Any, emb: Any, steps: int, device: Any = None):
    """The timed steps, then the write-back flush and (CUDA) the device's last kernel; returns rows, seconds in
    ``next`` and in ``task.step``, and (CUDA) each step's pair of timing events on the compute stream."""
    rows = 0
    t_next = t_step = 0.0
    cuda = isinstance(device, torch.device) and device.type == "cuda"
    events = []
    for _ in range(steps):
        a = time.perf_counter()
        batch = next(it)
        b = time.perf_counter()
        if cuda:
            pair = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
            pair[0].record()
        task.step(batch)  # returns the loss, never read here: no host sync a step
        if cuda:
            pair[1].record()
            events.append(pair)
        c = time.perf_counter()
        t_next += b - a
        t_step += c - b
        rows += int(batch[0].numel())
    if hasattr(emb, "flush"):
        emb.flush()
    device_sync(device)
    return rows, t_next, t_step, events


def release(task: Any) -> None:
    """Close a task and free its table now (plain-DGL tables are shared memory under a name). Removes the
    StepTimer wrappers (the optimizer's ``step`` closure refers back to the optimizer: a reference cycle that
    would keep the table alive until the next cyclic GC). The caller should drop its last reference to the
    task and call ``gc.collect()``."""
    try:
        if isinstance(task.emb, _TimedEmbedding):
            task.emb = task.emb._emb
        task.sparse.__dict__.pop("step", None)
        task.close()
    finally:
        gc.collect()
