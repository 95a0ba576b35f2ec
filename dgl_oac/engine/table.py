"""One table's state, and its one writer: the rows, the step versions, the write log, the reads in flight, and the
write path every step takes into the rows.

Its parts, each explained below: :func:`stable_sort`; :class:`RowStore` (the rows, in memory or in a file);
:class:`VersionClock` and :class:`WriteLog` (OAC's versions, validate and patch); :class:`Reads` (reads open at a
version, closed once); :class:`WriteBack` (committed steps applied in step order, on the write-back thread);
:func:`write_step` (the one write path). Who counts the steps and leases the write-back thread and the write log
to the epochs that read ahead is the table's door, :class:`~dgl_oac.engine.pipeline.TablePipeline`.

A stable sort of integer keys at radix-sort speed on CPU.

On CPU, ``torch.sort(stable=True)`` of integers uses a parallel radix sort (linear) only from ATen's grain size,
32,768 elements; below it, a comparison sort. For the 10k-32k ids of a typical batch the comparison sort is the
slower one (23k ids: 1.05-1.18 ms against 0.50-0.55 ms for the padded radix sort on this 2-core machine,
``python benchmarks/studies/row_ops.py``, piece ``sort``), so such inputs are padded to the grain size with copies of
their largest key, which a stable sort places after every real key: the first ``n`` results are exactly the
unpadded sort's. Where the padding would cost more than it saves (under 10,240 keys) or does not apply (CUDA),
it is ``torch.sort`` as is.

The CPU table: one row per node, holding its value and its optimizer state side by side.

Layout: ``table: float32[N, D + S]``, CPU. Columns ``[:D]`` are the embedding, ``[D:]`` the row optimizer's
state (S = 0 until an optimizer is attached). One row = one contiguous record, so a batch's values and state
travel through gather, copy, validation, commit and write-back as a single tensor with a single random access
per row (random-row gathers, not bandwidth, are the cost on CPU).

Optimistic Asynchrony Control: versions, the device write log, validate and patch.

Steps are numbered 0, 1, 2, ... in commit order, per embedding. Two structures:

* :class:`VersionClock` (host, shared by threads): ``applied`` = every row of steps <= applied is in the CPU
  table. A gather opens a *read* at ``rv = applied``; it is closed when its batch is handed out (validated and
  patched then, the rows are current; a batch held across later steps is refreshed at commit by
  :meth:`~dgl_oac.engine.pipeline.TablePipeline.refresh`),
  or when a batch never handed out is released (``TablePipeline.register`` / ``release_gathered``). Like an MVCC
  database's oldest active snapshot, the smallest open ``rv`` is the *horizon*: log entries of steps <= horizon
  can no longer be needed by anyone and are dropped.
* :class:`WriteLog` (on the compute device, main thread only): a ring of the rows each recent step wrote, each
  row at a *slot* (a global, monotonically increasing counter; ring position = slot % capacity). Each step's rows
  start at a slot whose address is a multiple of :data:`~dgl_oac.engine.table.ROW_ALIGN` bytes, as a fresh
  allocation's is: the commit's kernel writes there, and its ops see the alignments they see in sync.

Validate (before a batch is handed out): a row is stale iff a step after ``rv`` wrote it; its newest slot holds
what sync would have read, and replaces the row whole (value and optimizer state). Which slot that is, two ways:

* host tables on the CPU: ``last_slot: int64[N]``, the newest slot of every row; one int64 gather per row. 8 bytes
  a row beside the table's own ``4 (D + S)`` in host memory.
* a device log (CUDA): no O(N) state on the device, whose memory is what a table bigger than the GPU lacks.
  Each entry keeps its step's ids; a validation sorts the ids written after ``rv`` (a few steps' rows, stable, so
  the newest write of an id is the last of its run) and looks the batch's ids up with ``searchsorted``. Device
  memory is O(rows in flight): the ring plus 8 bytes per logged row.

Both make no host round trip and no Python loop over rows.

Reads of a table: each one opens at the current version and closes exactly once.

A read holds back the write log's horizon while it is open (:class:`~dgl_oac.engine.table.VersionClock`): the
log keeps every step it can miss. It is opened by the gather (on the gather thread, or on the caller's thread
in sync mode and for ``emb(ids)``), carried by its batch as a :class:`ReadTicket`, and closed at hand-out, when
its batch is released, or when the gather fails, whichever comes first (any thread: the close is idempotent,
under this owner's lock). A distributed table (``dist``) also registers each read with the rows' owners
(``dist.registry``: :mod:`dgl_oac.distributed.inflight`) and deregisters it with the close.

The write-back: apply committed rows to the CPU table in step order, on one background thread per embedding.

Each item is ``(step, ids: int64[n] CPU, rows: float32[n, D+S] host, event, op)``; ``op`` is ``"write"``
(sync, oac: overwrite) or ``"add"`` (async: add the delta new - old). After a step's rows are in the table the
thread publishes ``clock.publish(step)``, which is what lets later gathers read them as fresh.

An out-of-core table's rows are read ahead again before they are written (:meth:`WriteBack._apply` says why),
and its dirty pages' write-out started after each step (:meth:`~dgl_oac.engine.table.RowStore.start_writeback`).

The one write path of a table: every step, whoever makes it, in step order.

A commit of any mode (a loader's batches, ``emb(ids)`` outside a loader) and a row write
(``NodeEmbedding.write_rows``) is written here (:func:`write_step`), in step order, on the caller's thread. While
an epoch reads ahead, the new rows are copied to the host and handed to the write-back thread,
which applies them in step order and publishes each step on the clock; without one they are written through
and published at once, copied to the host the same way (pinned, on the transfer's side stream). When a write
log exists, the step is logged (before the hand-off: what a batch read ahead can miss is in the log by the time
the batch is handed out).
"""
from __future__ import annotations

import ctypes
import errno
import functools
import math
import mmap
import os
import queue
import shutil
import sys
import threading
import time
from collections import Counter, deque
from pathlib import Path
from typing import Any, Callable, Deque, Optional, Tuple, Union

import torch

from .. import native
from .runtime import Failure, POLL_S, Worker
from .transfer import Transfer, wait_host


# ---- A stable sort of integer keys at radix-sort speed on CPU

#: ATen's ``at::internal::GRAIN_SIZE``: from this many elements torch sorts integers by radix on CPU
RADIX_MIN = 32768
#: below this many keys the comparison sort is as cheap as padding to :data:`RADIX_MIN` (the crossover measured
#: here with the caches cold, as a step leaves them: 8k keys 0.40 vs 0.42 ms, 10k 0.50 vs 0.43)
PAD_FROM = 10_240


def stable_sort(keys: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(sorted, order)`` of ``keys: int64[n]`` (non-negative, any device): ``torch.sort(keys, stable=True)``,
    bitwise, with radix speed on CPU for ``PAD_FROM <= n < RADIX_MIN``."""
    n = keys.numel()
    if keys.device.type != "cpu" or not PAD_FROM <= n < RADIX_MIN or keys.dim() != 1:
        return torch.sort(keys, stable=True)
    padded = torch.cat([keys, keys.max().expand(RADIX_MIN - n)])
    ordered, order = torch.sort(padded, stable=True)
    return ordered[:n], order[:n]


# ---- The CPU table: one row per node, holding its value and its optimizer state side by side

Storage = Union[str, os.PathLike]
_PAGE = mmap.PAGESIZE
_SYNC_FILE_RANGE_WRITE = 2  # <linux/fs.h>: start write-out of dirty pages not already under write-out
_SYNC_FILE_RANGE_WAIT = 1 | 4  # WAIT_BEFORE | WAIT_AFTER: and wait for the write-out of the range


def _sync_file_range() -> Optional[Callable[..., int]]:
    """libc's ``sync_file_range`` (Linux), or None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


_SYNC_FILE_RANGE = _sync_file_range()


def _trim_heap() -> None:
    """Give the allocator's free pages back to the system (glibc's ``malloc_trim``; elsewhere a no-op). Freed
    arrays below the heap's top stay in the process otherwise: a row cache turned off kept 50 MB of a 0.8 GB
    cgroup from the page cache (oac 0.89x the run without a cache, uniform rows, bench_disk)."""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass
#: a file-backed table larger than this share of the memory the process may use is out of core: its batches'
#: pages are read ahead and its dirty pages written out after each step (:attr:`RowStore.out_of_core`)
OUT_OF_CORE_SHARE = 0.5


@functools.lru_cache(maxsize=1)
def memory_limit() -> int:
    """Bytes this process may use: the smaller of the machine's memory (``MemTotal``) and its memory cgroup's
    limit (v1 ``memory.limit_in_bytes``, v2 ``memory.max``) where it has one; a large number where neither can
    be read (not Linux). Read once per process."""
    limits = []
    try:
        with open("/proc/meminfo") as info:
            for line in info:
                if line.startswith("MemTotal:"):
                    limits.append(int(line.split()[1]) * 1024)
                    break
        with open("/proc/self/cgroup") as groups:
            for line in groups:
                _, controllers, path = line.rstrip("\n").split(":", 2)
                files = ([f"/sys/fs/cgroup/memory{path}/memory.limit_in_bytes"] if "memory" in controllers.split(",")
                         else [f"/sys/fs/cgroup{path}/memory.max"] if controllers == "" else [])
                for name in files:
                    try:
                        raw = Path(name).read_text().strip()
                    except OSError:
                        continue
                    if raw.isdigit():
                        limits.append(int(raw))
    except OSError:
        pass
    return min(limits) if limits else 1 << 62


def check_ids(ids: torch.Tensor, num_rows: int, what: str = "ids") -> None:
    """Raise a clear error unless ``ids`` is an int64[n] tensor with values in [0, num_rows)."""
    if not isinstance(ids, torch.Tensor):
        raise TypeError(f"{what} must be a torch.Tensor of int64 node ids, got {type(ids).__name__}")
    if ids.dtype != torch.int64:
        raise TypeError(f"{what} must have dtype torch.int64, got {ids.dtype}")
    if ids.dim() != 1:
        raise ValueError(f"{what} must be 1-D, got shape {tuple(ids.shape)}")
    if ids.numel():
        lo, hi = int(ids.min()), int(ids.max())
        if lo < 0 or hi >= num_rows:
            bad = lo if lo < 0 else hi
            raise IndexError(f"{what} out of range: found id {bad}, valid ids are 0..{num_rows - 1}")


def _reserve(fd: int, nbytes: int, path: Path) -> None:
    """Allocate the file's blocks now (unwritten extents: fast, nothing is zero-filled on ext4/xfs/btrfs), so a
    full disk is a clear ``OSError`` here rather than a SIGBUS that kills the process at some later write to
    the memory map."""
    free = shutil.disk_usage(path.parent).free
    try:
        os.posix_fallocate(fd, 0, nbytes)
    except OSError as exc:
        if exc.errno == errno.ENOSPC:
            path.unlink(missing_ok=True)
            raise OSError(errno.ENOSPC, f"no space for the table file {path}: it needs {nbytes:,} bytes and "
                                        f"{free:,} are free") from None
        if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):  # a filesystem without fallocate: stay sparse
            raise


def map_table(path: Path, num_rows: int, width: int, create: bool) -> torch.Tensor:
    """``float32[num_rows, width]`` mapped from the file ``path`` (MAP_SHARED: every process that maps the file
    sees every write). ``create``: make (or truncate) the file, zero-filled and with its blocks reserved;
    otherwise map a file another process created, which must have exactly that size."""
    nbytes = num_rows * width * 4
    with open(path, "w+b" if create else "r+b") as f:
        if create:  # sparse file: no pages are written until used
            f.truncate(nbytes)
            _reserve(f.fileno(), nbytes, path)
        elif os.fstat(f.fileno()).st_size != nbytes:
            raise ValueError(f"table file {path} has {os.fstat(f.fileno()).st_size:,} bytes, expected {nbytes:,} "
                             f"({num_rows} x {width} float32)")
        mapped = mmap.mmap(f.fileno(), nbytes)  # MAP_SHARED: writes go to the file's page cache
    if hasattr(mapped, "madvise") and hasattr(mmap, "MADV_RANDOM"):
        # Rows are read at random: without this each page fault reads ahead read_ahead_kb (8 MiB on the
        # test machine) around a 512-byte row, and a table larger than RAM thrashes the disk.
        mapped.madvise(mmap.MADV_RANDOM)
    return torch.frombuffer(mapped, dtype=torch.float32).view(num_rows, width)  # keeps `mapped` alive


def shared_zeros(num_rows: int, width: int) -> torch.Tensor:
    """``float32[num_rows, width]`` of zeros in anonymous shared memory (``mmap(-1, n)``: MAP_SHARED |
    MAP_ANONYMOUS; pages are zero-filled when first touched).

    Why not private memory (``torch.zeros``): sampling workers (``num_workers > 0``) are forked while the table
    lives, and every private page the write-back then writes is copied for the worker (copy on write), which
    doubled the host memory. A shared mapping is never copied, and a worker that never reads the table maps
    none of its pages. DGL keeps its embedding tables in shared memory too."""
    mapped = mmap.mmap(-1, num_rows * width * 4)
    return torch.frombuffer(mapped, dtype=torch.float32).view(num_rows, width)  # keeps `mapped` alive


class RowStore:
    """``float32[N, D + S]`` table in CPU memory (shared with forked processes: :func:`shared_zeros`) or in a
    file (``storage=path``). Never pinned: rows reach a device through the transfer's pinned staging buffers, so
    pinning the whole table would only cost memory."""

    _cache: Optional["RowCache"] = None
    cache_setting: "CacheSize" = "auto"

    def __init__(self, num_rows: int, dim: int, init_func: Optional[Callable[[torch.Tensor], torch.Tensor]] = None,
                 storage: Storage = "memory", cache: "CacheSize" = "auto") -> None:
        if num_rows <= 0 or dim <= 0:
            raise ValueError(f"a table needs num_rows > 0 and dim > 0, got {num_rows} x {dim}")
        self.num_rows, self.dim, self.state_width = int(num_rows), int(dim), 0
        self.path: Optional[Path] = None if storage == "memory" else Path(storage)
        cache_rows(cache, 1, 1, False)  # checked now, sized at first use (the width grows with the optimizer)
        self.cache_setting = cache
        self._cache: Optional[RowCache] = None  # a file-backed table's row cache, made by the first read or write
        self.table = self._allocate(self.dim)
        if init_func is not None:
            self._init_values(init_func)

    @property
    def width(self) -> int:
        return self.dim + self.state_width

    @property
    def table(self) -> torch.Tensor:
        """The whole table, ``float32[N, D + S]`` (the memory map of a file-backed one). A row cache's dirty rows
        are written into it and the cache emptied first, so that what is read or written there is the table
        (``emb.weight``, checkpoints, ``load_state_dict``)."""
        if self._cache is not None:
            self._cache.clear()
        return self._rows

    @table.setter
    def table(self, rows: torch.Tensor) -> None:
        if self._cache is not None:  # another table (widened, replaced): the cached rows are of the old one
            self._cache.clear()
            self._cache = None
        self._rows = rows

    def row_cache(self, batch_rows: int = 0) -> Optional[RowCache]:
        """The row cache of a file-backed table (:class:`RowCache`, sized by :func:`cache_rows` at first use: the
        first gather passes its ``batch_rows``, whose pages the sizing leaves to the page cache), or None (in
        memory, or no cache)."""
        if self._cache is None and self.path is not None:
            with _MAKING_CACHES:  # the gather and write-back threads may both be first
                rows = cache_rows(self.cache_setting, self.num_rows, self.width, self.out_of_core, batch_rows)
                if self._cache is None and rows:
                    self._cache = RowCache(self._rows, rows, functools.partial(self.start_writeback, wait=True),
                                           self._read_pages, judge=self.cache_setting == "auto")
        return self._cache

    def _live_cache(self, batch_rows: int = 0) -> Optional[RowCache]:
        """:meth:`row_cache`, or None once it turned itself off (``"auto"`` whose rows did not pay for their
        memory: :attr:`RowCache.off_reason`); a call that raced the turn finds the cache passing through."""
        cache = self.row_cache(batch_rows)
        return None if cache is None or cache.off else cache

    @property
    def out_of_core(self) -> bool:
        """File-backed and larger than :data:`OUT_OF_CORE_SHARE` of :func:`memory_limit`: the pipeline then reads
        each batch's pages ahead (:meth:`read_ahead`) and starts the write-out of each step's dirty pages
        (:meth:`start_writeback`). A file table that fits in memory takes neither: its pages stay in the page
        cache, where a read-ahead syscall per page and a write-out per step only cost (the held-out run of issue
        46: oac at 0.18-0.48x sync on a 256 MB file table). Neither changes a value: they are hints to the
        kernel."""
        return self.path is not None and self.num_rows * self.width * 4 > OUT_OF_CORE_SHARE * memory_limit()

    def _allocate(self, width: int, suffix: str = "") -> torch.Tensor:
        if self.path is None:
            return shared_zeros(self.num_rows, width)
        path = Path(str(self.path) + suffix)
        path.parent.mkdir(parents=True, exist_ok=True)
        if not suffix and path.exists() and path.stat().st_size:  # (".widen" is our own temporary: replaced)
            raise FileExistsError(
                f"table file {path} already exists ({path.stat().st_size:,} bytes); NodeEmbedding(storage=path) "
                f"creates a new table and would overwrite it: delete the file or choose another path (a run "
                f"continues from its checkpoint: load_checkpoint writes the table into a new file)")
        return map_table(path, self.num_rows, width, create=True)

    def _init_values(self, init_func: Callable[[torch.Tensor], torch.Tensor], chunk: int = 1 << 20) -> None:
        """Fill the values with ``init_func`` (before any state columns exist: the table is its values).

        In memory, one call on the whole ``float32[N, D]`` table, as ``dgl.nn.NodeEmbedding`` makes it, so a
        seeded init_func draws one stream over all rows. A file-backed table may be larger than RAM: it gets
        one call per ``chunk`` rows (views of the memory map, so no full-size temporary), in row order; an
        init_func drawing random values must then keep one generator running across its calls (torch's global
        RNG does; one that reseeds on every call would repeat its rows every ``chunk`` rows).
        """
        step = self.num_rows if self.path is None else chunk
        for lo in range(0, self.num_rows, step):
            block = self.table[lo:lo + step]
            out = init_func(block)
            if out is None or out is block:
                continue
            if tuple(out.shape) != tuple(block.shape):
                raise ValueError(f"init_func returned shape {tuple(out.shape)}, expected {tuple(block.shape)}")
            block.copy_(out)

    def needs_widening(self, state_width: int) -> bool:
        """Whether :meth:`widen` has work to do (a table widens once: a second, different width is an error)."""
        if state_width == self.state_width:
            return False
        if self.state_width:
            raise RuntimeError(f"table already holds {self.state_width} optimizer-state columns; "
                               f"one sparse optimizer per NodeEmbedding")
        return True

    def widen(self, state_width: int) -> None:
        """Give every row ``state_width`` zeroed optimizer-state columns (once, before training)."""
        if not self.needs_widening(state_width):
            return
        old = self.table
        new = self._allocate(self.dim + state_width, suffix=".widen" if self.path is not None else "")
        new[:, : self.dim] = old[:, : self.dim]
        self.table, self.state_width = new, state_width  # only once the new table is complete
        if self.path is not None:
            del old
            os.replace(str(self.path) + ".widen", self.path)

    def value(self) -> torch.Tensor:
        """The embedding columns, ``float32[N, D]`` (a view: no copy)."""
        return self.table[:, : self.dim]

    def state(self) -> torch.Tensor:
        """The optimizer-state columns, ``float32[N, S]`` (a view)."""
        return self.table[:, self.dim:]

    def gather(self, ids: torch.Tensor, out: Optional[torch.Tensor] = None, at: Optional[int] = None) -> torch.Tensor:
        """Rows ``float32[n, D+S]`` for ``ids: int64[n], CPU`` (into ``out``, e.g. a pinned buffer). ``at``: the
        read's version; a table whose rows live elsewhere (sharded) returns them once that step is in them; here
        the rows read are the table's, already at it."""
        out = None if out is None else out[: ids.numel()]
        cache = self._live_cache(ids.numel())
        if cache is not None:
            return cache.gather(ids, torch.empty(ids.numel(), self.width) if out is None else out)
        got = native.gather(self._rows, ids, out)  # index_select with the next rows prefetched
        if got is not None:
            return got
        if out is None:
            return self._rows.index_select(0, ids)
        return torch.index_select(self._rows, 0, ids, out=out)

    def read_ahead(self, ids: torch.Tensor, for_write: bool = False) -> int:
        """File-backed: start reading the pages of rows ``ids: int64[n], CPU`` into the page cache, all at once,
        and return how many pages were asked for; in memory a no-op (0). The values are not read here: a later
        :meth:`gather` reads them (and then finds the pages cached or in flight). With a row cache, only rows it
        does not hold, and none ``for_write`` (a write goes to the cache).

        Why ``posix_fadvise(WILLNEED)`` per page: a gather of a table larger than the page cache faults its
        pages in one at a time on one thread, queue depth 1 (the disk here: 13k 4 KiB reads/s at depth 1,
        69k at depth 32, fio). Each WILLNEED call queues that page's read and returns, so a batch's reads reach
        the disk together. Measured on a cold 3.8 GiB file, 8.4k random 512-byte rows: faulting index_select
        19-24k rows/s; WILLNEED per page then index_select 59-75k rows/s, the same as 16-64 threads each
        faulting a share (61-76k rows/s, 32 threads 70-74k), on one thread, with no pool and no GIL traffic.
        (``madvise(WILLNEED)`` on the map measured the same; Python has no io_uring in its standard library.)
        """
        cache = self._cache
        if cache is not None and not cache.off:  # cached rows need no page, and a write goes to the cache
            ids = ids[:0] if for_write else cache.uncached(ids)
        return self._read_pages(ids)

    def _read_pages(self, ids: torch.Tensor) -> int:
        """:meth:`read_ahead` of every row of ``ids``: ``posix_fadvise(WILLNEED)`` on their pages."""
        if self.path is None or not ids.numel() or not hasattr(os, "posix_fadvise"):  # (not on macOS/Windows)
            return 0
        row_bytes = self.width * 4
        first = ids * row_bytes // _PAGE
        last = (ids * row_bytes + row_bytes - 1) // _PAGE  # a row that straddles a page boundary needs both
        pages = torch.unique(torch.cat([first, last]))  # sorted
        # one call per run of consecutive pages
        breaks = torch.nonzero(pages[1:] - pages[:-1] != 1).flatten() + 1
        starts = torch.cat([pages[:1], pages[breaks]]).tolist()
        ends = torch.cat([pages[breaks - 1], pages[-1:]]).tolist()
        fd = os.open(self.path, os.O_RDONLY)
        try:
            for lo, hi in zip(starts, ends):
                os.posix_fadvise(fd, lo * _PAGE, (hi - lo + 1) * _PAGE, os.POSIX_FADV_WILLNEED)
        finally:
            os.close(fd)
        return int(pages.numel())

    def write(self, ids: torch.Tensor, rows: torch.Tensor) -> None:
        """Overwrite rows (values and state). ``ids`` unique."""
        cache = self._live_cache()
        if cache is not None:
            cache.write(ids, rows)
        elif not native.scatter(self._rows, ids, rows):  # index_copy_ with the next rows prefetched
            self._rows.index_copy_(0, ids, rows)

    def add(self, ids: torch.Tensor, delta: torch.Tensor) -> None:
        """Add a delta to rows (async mode: an update computed from a stale read is not lost)."""
        cache = self._live_cache()
        if cache is not None:
            cache.add(ids, delta)
        else:
            self._rows.index_add_(0, ids, delta)

    def clean_ahead(self) -> int:
        """With a row cache: write the dirty rows it will soon replace to the file (:meth:`RowCache.clean_ahead`),
        off the gather thread; returns how many. Else 0."""
        return 0 if self._cache is None else self._cache.clean_ahead()

    def serve_versions(self, ready: Callable[[int, float], bool]) -> None:
        """``ready(step, timeout)``: whether step ``step`` is in the rows (the table's clock, waiting up to
        ``timeout`` s). A store whose rows other processes read waits on it before serving a read at a step; one
        process's store has nothing to serve."""

    def start_writeback(self, wait: bool = False) -> None:
        """File-backed: start writing the file's dirty pages to disk now, without waiting for it (Linux
        ``sync_file_range(SYNC_FILE_RANGE_WRITE)``; ``wait``: and wait until they are written); in memory, or
        without that call, a no-op.

        Why: the kernel starts flushing only past ``dirty_background_ratio`` of RAM (2.4 GB here), and a
        memory cgroup smaller than that (cgroup v1 has no per-group dirty limit) fills with dirty table pages;
        reclaiming them then makes every page fault of the gather wait for a write. Called by the write-back
        thread after each step, so the pages it dirtied are clean (cheap to evict) soon after.
        """
        if self.path is None or _SYNC_FILE_RANGE is None:
            return
        fd = os.open(self.path, os.O_RDONLY)
        try:
            flags = _SYNC_FILE_RANGE_WRITE | (_SYNC_FILE_RANGE_WAIT if wait else 0)
            if _SYNC_FILE_RANGE(fd, ctypes.c_int64(0), ctypes.c_int64(0), flags) != 0:
                err = ctypes.get_errno()
                raise OSError(err, f"sync_file_range on {self.path}: {os.strerror(err)}")
        finally:
            os.close(fd)

    def sync_to_disk(self) -> None:
        """Make written rows durable (file-backed tables: the row cache's dirty rows are written to the file
        first); a no-op in memory."""
        if self._cache is not None:
            self._cache.flush()
        if self.path is not None:
            fd = os.open(self.path, os.O_RDONLY)
            try:
                os.fsync(fd)
            except OSError as err:  # (an I/O error while the disk took the rows: the file is named)
                raise OSError(err.errno, f"writing the rows of table file {self.path} to disk: "
                                         f"{os.strerror(err.errno)}", str(self.path)) from err
            finally:
                os.close(fd)


# ---- The row cache: a file-backed table's hot rows in this process's memory, in front of the file

#: ``cache="auto"``: the share of the memory left to the process when the cache is made (:func:`memory_limit` less
#: the process's anonymous memory then: its graph, its buffers) that a file-backed table larger than memory caches
#: rows in; the rest is for what the process allocates later and for the page cache, which holds the pages of the
#: rows read and written back (a 0.4 share of the whole limit was killed by a 0.8 GB cgroup, anonymous memory
#: 830 MB, with a 1.6M-edge graph beside it)
CACHE_SHARE = 0.5
#: batches whose pages the page cache must hold beside a full row cache: read ahead (up to the prefetch depth), in
#: training, and waiting for the write-back, which stores a row not cached into the page its gather read. A cache
#: sized without them filled the cgroup after 1500 power-law steps (anonymous memory 0.78 of 0.8 GiB): the pages
#: read ahead were evicted before their gather (972k major faults in 200 steps) and oac ran 0.56x the run
#: without a cache
IN_FLIGHT_BATCHES = 6
#: bytes a cached row costs beside its ``4 W``: its id, generation, dirty, reference and pin bits
_SLOT_BYTES = 8 + 8 + 1 + 1 + 1
#: a flush writes its dirty rows to the file this many at a time, each part's pages written to disk before the next:
#: hundreds of MB of dirty rows stored into the map at once dirtied more pages than a memory cgroup could reclaim
#: (cgroup v1 has no per-group dirty limit) and the process was killed, 0.8 GB cgroup, 4M x 128 table
WRITE_OUT_ROWS = 8192
_MAKING_CACHES = threading.Lock()
#: a row gathered from the file is kept in the cache from its ADMIT_AT-th gather among the recent ones: a row read
#: once (most rows of a power-law table) would only push a hot row out, and be written back through a page read
#: again; written at once instead, its page is still in the page cache from its gather (TinyLFU's doorkeeper)
ADMIT_AT = 2
ADMIT_MAX = 15
AGE_EVERY = 8
#: the most rows one clean_ahead copies and writes (8 MB of 512-byte rows): its copy is memory beside the cache
CLEAN_ROWS = 16384
#: ``cache="auto"`` keeps its cache only if it pays for its memory: once it has looked up as many rows as it holds
#: and rows cached at random would have hit JUDGE_HITS of them, a cache whose hits are under PAYS_AT times that
#: turns itself off (its dirty rows written, its memory freed). On uniformly random rows it hits what random rows
#: do, while the same memory as page cache would hold as many rows and keep the pages the write-back stores into
#: (bench_disk, uniform rows: oac ran 0.74x as fast with the cache, the page cache squeezed from 0.42 to 0.09 GiB
#: of a 0.8 GB cgroup); on power-law rows it hits 87x what random rows would (bench_disk_cache_4x).
JUDGE_HITS = 2000
PAYS_AT = 2.0
CacheSize = Union[str, int]


def anonymous_memory() -> int:
    """Bytes of this process's anonymous memory now (``RssAnon``; 0 where it cannot be read)."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def cache_rows(setting: CacheSize, num_rows: int, width: int, out_of_core: bool, batch_rows: int = 0) -> int:
    """How many rows a file-backed table's :class:`RowCache` holds: ``setting`` bytes (0: none), or ``"auto"``:
    :data:`CACHE_SHARE` of the memory left (:func:`memory_limit` less :func:`anonymous_memory`, less the pages of
    :data:`IN_FLIGHT_BATCHES` batches of ``batch_rows`` rows) for a table larger than memory, none for one the
    page cache holds whole (a second copy would only cost memory). The row-to-slot index and the gather counts
    (9 bytes a row of the table) are counted in."""
    if setting == "auto":
        left = memory_limit() - anonymous_memory() - IN_FLIGHT_BATCHES * batch_rows * _PAGE
        nbytes = int(CACHE_SHARE * max(0, left)) if out_of_core else 0
    elif isinstance(setting, int) and not isinstance(setting, bool) and setting >= 0:
        nbytes = setting
    else:
        raise ValueError(f"cache must be 'auto' or a number of bytes >= 0, got {setting!r}")
    return max(0, min(num_rows, (nbytes - 9 * num_rows) // (4 * width + _SLOT_BYTES)))


class RowCache:
    """Up to ``capacity`` whole rows (value ‖ state) of a file-backed table ``file: float32[N, W]`` (the memory
    map), in anonymous memory, so that a hot row costs no page read nor page write per step.

    * A gather copies the cached rows and reads the others from the file (outside the lock).
    * A write goes to the cache (write-allocate: a row written whole needs no read of its page) if the row was
      gathered at least :data:`ADMIT_AT` times lately, else to the file; a cached row is dirty until it is written
      to the file.
    * Room is made by CLOCK (second chance): a slot whose row was used since the hand last passed is spared once,
      and a row the hand offers stays unless the row coming in was gathered more often lately (TinyLFU's
      admission; the row coming in goes to the file instead). Dirty rows leaving are written to the file
      together, in file-offset order (neighbours share a page).
    * :meth:`clean_ahead` (the flush thread, after each step) writes the dirty rows the hand will reach next to
      the file without holding the lock, so the gather's misses mostly find clean rows to replace and the
      gather thread seldom writes; :meth:`flush` writes every dirty row; :meth:`clear` also forgets them.
    * ``judge`` (``cache="auto"``): the first :attr:`capacity` rows looked up decide whether the cache pays
      (:data:`PAYS_AT`); one that does not turns itself :attr:`off` at the next write (:attr:`off_reason` says
      why): its dirty rows go to the file, its memory is freed, and every call passes through to the file.

    Every lookup and change holds ``lock``, so a gather (the gather thread) and a write (the write-back thread)
    see each other whole: a row leaving the cache is in the file before it can be missed, and a gather reads
    either the cached row or the file's copy of it, never an older one. A row being cleaned stays cached and
    pinned (no sweep takes it) while its copy is written, and is marked clean only if no write changed it
    meanwhile (its slot's generation); ``cleaning`` keeps a flush from writing the rows under it. The versions
    protocol is unchanged: whatever a gather reads of rows written after its read version, validation replaces.
    """

    def __init__(self, file: torch.Tensor, capacity: int, settle: Optional[Callable[[], None]] = None,
                 read_pages: Optional[Callable[[torch.Tensor], int]] = None, judge: bool = False) -> None:
        if capacity < 1:
            raise ValueError(f"a row cache holds at least one row, got capacity {capacity}")
        n, w = file.shape
        self.file = file
        self.settle = settle  # writes the file's dirty pages to disk and waits (between a flush's parts)
        # asks the disk for the pages of rows about to be stored, together: a store into a page not in memory
        # reads it first, one page at a time (WriteBack._apply says the same of the write-back's stores)
        self.read_pages = read_pages
        self.capacity = int(capacity)
        self.rows = torch.empty(self.capacity, w)
        self.slot_of = torch.full((n,), -1, dtype=torch.int64)  # row id -> its slot, or -1
        self.id_of = torch.full((self.capacity,), -1, dtype=torch.int64)
        self.dirty = torch.zeros(self.capacity, dtype=torch.bool)
        self.ref = torch.zeros(self.capacity, dtype=torch.bool)  # used since the hand last passed
        self.pinned = torch.zeros(self.capacity, dtype=torch.bool)  # being cleaned: no sweep takes it
        self.gen = torch.zeros(self.capacity, dtype=torch.int64)  # bumped by every write into the slot
        # how often each row was gathered lately (saturating at ADMIT_MAX, halved every AGE_EVERY x capacity
        # gathered rows): a row is kept only from its ADMIT_AT-th recent gather on
        self.seen = torch.zeros(n, dtype=torch.uint8)
        self._gathered = 0
        self.used = 0  # slots [0, used) hold rows
        self.hand = 0
        self.swept = 0  # slots the hand passed since the last clean_ahead: how far ahead of the hand it looks
        self.lock = threading.Lock()
        self.cleaning = threading.Lock()  # held by clean_ahead while it writes outside `lock`; then by flushes
        # rows: gathered from the cache, from the file; written to the file (by evictions and flushes, cleaned)
        self.hits = self.misses = self.rows_written = self.rows_cleaned = 0
        self.judge = judge
        self._looked = 0  # rows looked up while judging
        self._random_hits = 0.0  # what they would have hit, were the cached rows random ones
        self._turn_off = False  # judged not to pay: the next write turns the cache off
        self.hits_over_random: Optional[float] = None  # the verdict's measure: hits / what random rows would hit
        self.off = False
        self.off_reason: Optional[str] = None

    def uncached(self, ids: torch.Tensor) -> torch.Tensor:
        """The ``ids`` not cached now (unlocked: a hint for reading their pages ahead)."""
        slot_of = self.slot_of
        return ids if self.off else ids[slot_of[ids] < 0]

    def gather(self, ids: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """Rows ``ids: int64[n]`` into ``out: float32[n, W]``: the cached ones under ``lock``, the others from the
        file after it (so the write-back thread's writes overlap this thread's reads, as without a cache). The
        file holds every row not cached at the lookup as of every published step (a row leaves the cache
        through the file, under the lock; a write through is done before its step is published), and whatever
        a later step writes meanwhile is a row validation replaces. A row read from the file is not kept here:
        its write keeps it (write-allocate), with the newest value."""
        with self.lock:
            if self.off:
                return torch.index_select(self.file, 0, ids, out=out)
            slots = self.slot_of[ids]
            hit = slots >= 0
            n_hit = int(hit.sum())
            self.hits += n_hit
            self._count(torch.unique(ids))
            if self.judge:
                self._judge(ids.numel())
            if n_hit == ids.numel():
                torch.index_select(self.rows, 0, slots, out=out)
                self.ref[slots] = True
                return out
            if n_hit:
                at = hit.nonzero().flatten()
                out.index_copy_(0, at, self.rows.index_select(0, slots[at]))
                self.ref[slots[at]] = True
            at = (~hit).nonzero().flatten()
            self.misses += at.numel()
        out.index_copy_(0, at, self.file.index_select(0, ids[at]))
        return out

    def write(self, ids: torch.Tensor, rows: torch.Tensor) -> None:
        """Overwrite rows ``ids: int64[n]`` (unique) with ``rows: float32[n, W]``: in the cache, or, for a row it
        does not keep, in the file after ``lock`` (a gather reading it meanwhile reads a row of a step after its
        read version, which validation replaces)."""
        with self.lock:
            through = (ids, rows) if self.off else self._write(ids, rows)
        self._file_write(*through)
        if self._turn_off:
            self._shut()

    def add(self, ids: torch.Tensor, delta: torch.Tensor) -> None:
        """Add ``delta: float32[n, W]`` to rows ``ids`` (repeats add up, as ``index_add_``)."""
        with self.lock:
            if self.off:
                self.file.index_add_(0, ids, delta)
                return
            uniq, inverse = torch.unique(ids, return_inverse=True)
            current = torch.empty(uniq.numel(), self.rows.shape[1])
            slots = self.slot_of[uniq]
            hit = slots >= 0
            current[hit] = self.rows[slots[hit]]
            current[~hit] = self.file.index_select(0, uniq[~hit])
            current.index_add_(0, inverse, delta)
            self._file_write(*self._write(uniq, current))
        if self._turn_off:
            self._shut()

    def clean_ahead(self) -> int:
        """Write the dirty rows among the next slots the hand will take (unused since it passed; twice as far
        ahead of the hand as it moved since the last call, at least 4096 slots; at most :data:`CLEAN_ROWS` rows)
        to the file, outside ``lock``; they stay cached, clean unless written meanwhile. Returns how many."""
        with self.cleaning:
            with self.lock:
                if self.used < self.capacity or self.off:
                    return 0
                window = min(self.capacity, max(2 * self.swept, 4096))
                self.swept = 0
                order = (torch.arange(window) + self.hand) % self.capacity
                slots = order[self.dirty[order] & ~self.ref[order]][:CLEAN_ROWS]  # the hand's next first
                if not slots.numel():
                    return 0
                ids = self.id_of[slots]
                order = torch.argsort(ids)
                slots, ids = slots[order], ids[order]
                rows, gen = self.rows.index_select(0, slots), self.gen[slots]
                self.pinned[slots] = True
            try:
                if self.read_pages is not None:
                    self.read_pages(ids)
                _store_rows(self.file, ids, rows)  # no lock: gathers and writes go on (the rows stay cached)
            finally:
                with self.lock:
                    self.pinned[slots] = False
            with self.lock:
                unchanged = self.gen[slots] == gen
                self.dirty[slots[unchanged]] = False
                self.rows_cleaned += slots.numel()
            return int(slots.numel())

    def flush(self) -> int:
        """Write every dirty row to the file (offset order); they stay cached, clean. Returns how many."""
        with self.cleaning, self.lock:
            dirty = self.dirty[: self.used].nonzero().flatten()
            self._write_out(dirty)
            return int(dirty.numel())

    def clear(self) -> None:
        """:meth:`flush`, then forget every row (the file is the table again, for whoever reads or writes it
        directly)."""
        with self.cleaning, self.lock:
            self._write_out(self.dirty[: self.used].nonzero().flatten())
            self.slot_of[self.id_of[: self.used]] = -1
            self.id_of[: self.used] = -1
            self.ref.zero_()
            self.used = self.hand = 0

    def _shut(self) -> None:
        """Turn the cache off (the writer, judged not to pay): :meth:`clear`, then free its memory; from here on
        every call passes through to the file."""
        with self.cleaning, self.lock:
            if self.off:
                return
            self._write_out(self.dirty[: self.used].nonzero().flatten())
            self.off, self._turn_off = True, False
            self.used = self.hand = 0
            w = self.rows.shape[1]
            self.rows = torch.empty(0, w)
            self.slot_of = self.id_of = self.gen = torch.empty(0, dtype=torch.int64)
            self.dirty = self.ref = self.pinned = torch.empty(0, dtype=torch.bool)
            self.seen = torch.empty(0, dtype=torch.uint8)
        _trim_heap()

    # --- under the lock ---------------------------------------------------------------------------------------
    def _judge(self, looked_up: int) -> None:
        """``looked_up`` more rows looked up: once they reach :attr:`capacity` and random cached rows would have
        hit :data:`JUDGE_HITS` of them, decide whether the cache pays (hits >= :data:`PAYS_AT` times that)."""
        self._looked += looked_up
        self._random_hits += looked_up * self.used / self.file.shape[0]
        if self._looked < self.capacity or self._random_hits < JUDGE_HITS:
            return
        self.judge = False
        self.hits_over_random = self.hits / self._random_hits
        if self.hits < PAYS_AT * self._random_hits:
            self._turn_off = True
            self.off_reason = (f"cache='auto' turned off: it hit {self.hits:,} of {self._looked:,} rows looked up, "
                               f"where as many rows cached at random would hit {self._random_hits:,.0f} (it pays "
                               f"from {PAYS_AT:g}x that); the memory is the page cache's again")

    def _write(self, ids: torch.Tensor, rows: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """The cached and kept rows of a write; returns the others ``(ids, rows)``, for the file."""
        slots = self.slot_of[ids]
        hit = slots >= 0
        if bool(hit.all()):
            self.rows.index_copy_(0, slots, rows)
            self._touched(slots)
            return ids[:0], rows[:0]
        at = hit.nonzero().flatten()
        if at.numel():
            self.rows.index_copy_(0, slots[at], rows.index_select(0, at))
            self._touched(slots[at])
        at = (~hit).nonzero().flatten()
        keep = self.seen[ids[at]] >= ADMIT_AT  # a row gathered once lately goes to the file, its page still in memory
        back_ids, back_rows = self._admit(ids[at[keep]], rows.index_select(0, at[keep]))
        return torch.cat([ids[at[~keep]], back_ids]), torch.cat([rows.index_select(0, at[~keep]), back_rows])

    def _count(self, ids: torch.Tensor) -> None:
        """One more gather of each of ``ids`` (unique), aged."""
        self.seen[ids] = (self.seen[ids].to(torch.int16) + 1).clamp_(max=ADMIT_MAX).to(torch.uint8)
        self._gathered += ids.numel()
        if self._gathered >= AGE_EVERY * self.capacity:
            self.seen.bitwise_right_shift_(1)
            self._gathered = 0

    def _touched(self, slots: torch.Tensor) -> None:
        """``slots`` were just written: dirty, and a newer generation (a clean-ahead in flight keeps them dirty).
        Not a use: a trained row is written right after its gather, so a write marking the row used would give
        every row its second chance and make the sweep first-in first-out (hit rate 0.59 against 0.61 with
        only gathers counting, power-law rows, big_table after 800 steps)."""
        self.dirty[slots] = True
        self.gen[slots] += 1

    def _admit(self, ids: torch.Tensor, rows: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """Keep rows ``ids`` (unique, none cached) with their new values ``rows``, dirty, in empty slots, or in the
        slots of rows the sweep offers that were gathered less often lately (TinyLFU's rule: a full cache swaps a
        row only for a hotter one). Returns the rows not kept ``(ids, rows)``, for the file: those that lost, and
        more than the cache can take (its unpinned slots)."""
        k = ids.numel()
        room = self.capacity - int(self.pinned.sum())
        back_ids, back_rows = ids[:0], rows[:0]
        if k > room:
            back_ids, back_rows = ids[: k - room], rows[: k - room]
            ids, rows, k = ids[k - room:], rows[k - room:], room
        if not k:
            return back_ids, back_rows
        fresh = min(k, self.capacity - self.used)
        if fresh:  # empty slots first
            slots = torch.arange(self.used, self.used + fresh)
            self._place(ids[:fresh], rows[:fresh], slots)
            self.used += fresh
            self.ref[slots] = True  # the sweep below takes them back only once every slot has been passed
        if k > fresh:
            victims = self._sweep(k - fresh)
            ids, rows = ids[fresh:], rows[fresh:]
            win = self.seen[ids] > self.seen[self.id_of[victims]]
            if not bool(win.all()):
                back_ids, back_rows = torch.cat([back_ids, ids[~win]]), torch.cat([back_rows, rows[~win]])
                ids, rows, victims = ids[win], rows[win], victims[win]
            self._write_out(victims[self.dirty[victims]])
            self.slot_of[self.id_of[victims]] = -1
            self._place(ids, rows, victims)
        return back_ids, back_rows

    def _place(self, ids: torch.Tensor, rows: torch.Tensor, slots: torch.Tensor) -> None:
        """Written rows ``ids`` into ``slots`` (empty, or their rows gone), dirty; a new row is not yet used since
        the hand passed (no second chance before it is read again)."""
        self.rows.index_copy_(0, slots, rows)
        self.id_of[slots] = ids
        self.slot_of[ids] = slots
        self.dirty[slots] = True
        self.ref[slots] = False
        self.gen[slots] += 1

    def _sweep(self, k: int) -> torch.Tensor:
        """CLOCK: the next ``k`` unpinned slots the hand finds unused since it last passed (clearing the bits it
        passes); when every slot was used, the next ``k`` unpinned slots. ``k`` is at most the unpinned slots."""
        c = self.capacity
        window = min(c, max(4 * k, 1 << 14))
        while True:
            order = (torch.arange(window) + self.hand) % c
            free = ~self.ref[order] & ~self.pinned[order]
            cum = torch.cumsum(free, 0)
            if int(cum[-1]) >= k:
                cut = int(torch.searchsorted(cum, k)) + 1  # the scan ends at the k-th free slot
                passed = order[:cut]
                victims = passed[free[:cut]]
                self.ref[passed] = False
                self.hand = (self.hand + cut) % c
                self.swept += cut
                return victims
            if window == c:  # every slot used since the last pass: second chances spent
                self.ref.zero_()
            else:
                self.ref[order] = False
                self.hand = (self.hand + window) % c
                self.swept += window
                window = min(c, 2 * window)

    def _write_out(self, slots: torch.Tensor) -> None:
        """Dirty ``slots``' rows to the file, in offset order, a part at a time (:data:`WRITE_OUT_ROWS`); they are
        clean after."""
        if not slots.numel():
            return
        ids = self.id_of[slots]
        order = torch.argsort(ids)
        ids, slots = ids[order], slots[order]
        for lo in range(0, ids.numel(), WRITE_OUT_ROWS):
            if lo and self.settle is not None:
                self.settle()
            part = slice(lo, lo + WRITE_OUT_ROWS)
            self._file_write(ids[part], self.rows.index_select(0, slots[part]))
        self.dirty[slots] = False

    def _file_write(self, ids: torch.Tensor, rows: torch.Tensor) -> None:
        if not ids.numel():
            return
        if self.read_pages is not None:
            self.read_pages(ids)
        _store_rows(self.file, ids, rows)
        self.rows_written += ids.numel()


def _store_rows(file: torch.Tensor, ids: torch.Tensor, rows: torch.Tensor) -> None:
    """``file[ids] = rows`` (``ids`` unique)."""
    if not native.scatter(file, ids, rows):
        file.index_copy_(0, ids, rows)


# ---- Optimistic Asynchrony Control: versions, the device write log, validate and patch

#: bytes every row a kernel reduces over, and every ``out`` a write log hands it, start at a multiple of: CUDA's
#: float32 loads are vectorised 16 bytes wide, and a row reduction starts a misaligned row's sum with its elements
#: up to the next boundary, so a row at another alignment sums in another order. With the write log's slices
#: (:meth:`~dgl_oac.engine.table.WriteLog.reserve`) aligned as a fresh allocation is, and a kernel's row reductions
#: reading a temporary of aligned rows, each op of a step sees the same alignments in sync, oac and async
ROW_ALIGN = 16


class VersionClock:
    """Which steps are durable in the table (``applied``) and which snapshots are still being read."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self.applied = -1
        self._open: Counter = Counter()

    def begin_read(self, at: Optional[int] = None) -> int:
        """Open a read at the current version (or at step ``at`` > ``applied``: a read that will see a step not
        published yet); atomic with ``publish`` so the horizon never passes it."""
        with self._cond:
            rv = self.applied if at is None else at
            self._open[rv] += 1
            return rv

    def end_read(self, rv: int) -> None:
        with self._cond:
            if self._open[rv] <= 0:
                raise RuntimeError(f"read at version {rv} closed twice or never opened")
            self._open[rv] -= 1
            if not self._open[rv]:
                del self._open[rv]

    def publish(self, step: int) -> None:
        """Called after step ``step``'s rows are in the table. Steps publish in order."""
        with self._cond:
            if step != self.applied + 1:
                raise RuntimeError(f"steps published out of order: step {step} after {self.applied}")
            self.applied = step
            self._cond.notify_all()

    def horizon(self) -> int:
        """Newest step that no open read can miss (min of open reads and ``applied``)."""
        with self._cond:
            return min(min(self._open), self.applied) if self._open else self.applied

    def open_reads(self) -> int:
        with self._cond:
            return sum(self._open.values())

    def wait_applied(self, step: int, timeout: float) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: self.applied >= step, timeout)


class WriteLog:
    """Device-side ring of recently written rows, indexed by ``last_slot: int64[N]`` (-1 = never written) or, for
    a sync-free (CUDA) log, by the ids of the entries themselves (module docstring)."""

    def __init__(self, num_rows: int, width: int, device: torch.device, after: int = -1, steps_hint: int = 0,
                 capacity: int = 1 << 14, sync_free: Optional[bool] = None) -> None:
        """A log of the steps after step ``after`` (a read at an older version cannot be validated)."""
        self.device = device
        self.width = width
        # slots a step's first row is a multiple of: its address is then one of ROW_ALIGN bytes (float32 rows)
        self.slot_align = ROW_ALIGN // math.gcd(4 * width, ROW_ALIGN)
        self.ring = self._new_ring(capacity)
        self.entries: Deque[Tuple[int, int, int]] = deque()  # (step, first slot, rows)
        self.next_slot = 0
        self.dropped_upto = after  # newest step whose entry was dropped (or that came before the log)
        self._reserved: Optional[Tuple[int, torch.Tensor]] = None  # (first slot, ring slice) of the next step
        # steps whose rows can be live at once (set by the loader: prefetch + write-back depth + 2); sizes the
        # ring from the first step instead of doubling it (a new ring, and a copy of its live rows) 4-5 times
        self.steps_hint = steps_hint
        # CUDA: avoid nonzero() (a host sync) by patching with a masked gather over the whole batch. A seam:
        # tests run that path on CPU with sync_free=True.
        self.sync_free = device.type == "cuda" if sync_free is None else bool(sync_free)
        # which slot holds a row's newest write: O(N) on the host, O(rows logged) on a device (module docstring)
        self.last_slot: Optional[torch.Tensor] = None
        self._entry_ids: Deque[torch.Tensor] = deque()  # sync-free: each entry's ids: int64[rows], device
        if not self.sync_free:
            self.last_slot = torch.full((num_rows,), -1, dtype=torch.int64, device=device)

    def restart(self, after: int) -> "WriteLog":
        """Reuse this log (its ring's memory, already paged in) for the steps after ``after``: no entry is kept.
        ``last_slot`` may keep old slots: they are all below ``next_slot``, so never read as stale."""
        self.entries.clear()
        self._entry_ids.clear()
        self._reserved = None
        self.dropped_upto = after
        return self

    @property
    def capacity(self) -> int:
        return self.ring.shape[0]

    def _live_from(self) -> int:
        return self.entries[0][1] if self.entries else self.next_slot

    def covers(self, rv: int) -> bool:
        """Whether every step after ``rv`` is still in the log (a read at ``rv`` can be validated)."""
        return rv >= self.dropped_upto

    def first_slot_after(self, rv: int) -> int:
        """Smallest slot written by a step > rv. Fails loudly if such a step was already dropped."""
        if not self.covers(rv):
            raise RuntimeError(
                f"OAC invariant broken: a batch read at version {rv}, but the write log already dropped steps up "
                f"to {self.dropped_upto}; its stale rows could not be patched (pipeline deeper than the log)")
        if self.entries and self.entries[0][0] != self.dropped_upto + 1:
            raise RuntimeError(f"OAC invariant broken: the write log misses step {self.dropped_upto + 1} (its oldest "
                               f"entry is step {self.entries[0][0]}); rows that step wrote could not be patched")
        for step, start, _ in self.entries:
            if step > rv:
                return start
        return self.next_slot

    def stale(self, ids: torch.Tensor, rv: int) -> Tuple[torch.Tensor, torch.Tensor]:
        """``(mask: bool[n], slots: int64[n])`` for ``ids: int64[n]`` on the device: which rows a step after ``rv``
        wrote, and the slot of their newest write (where ``mask`` is False: below the first slot after ``rv``)."""
        first = self.first_slot_after(rv)
        if self.last_slot is not None:
            slots = self.last_slot.index_select(0, ids)
            return slots >= first, slots
        return self._stale_window(ids, first)

    def _stale_window(self, ids: torch.Tensor, first: int) -> Tuple[torch.Tensor, torch.Tensor]:
        """:meth:`stale` from the entries written at slots >= ``first``: sort their ids (stable: slots ascend in
        entry order, so an id's newest write ends its run), then one ``searchsorted`` per id. No host sync."""
        parts = [(e, i) for e, i in zip(self.entries, self._entry_ids) if e[1] >= first]
        if not parts:
            return torch.zeros(ids.shape, dtype=torch.bool, device=ids.device), torch.full_like(ids, -1)
        wids = torch.cat([i for _, i in parts])
        wslots = torch.cat([torch.arange(e[1], e[1] + e[2], device=ids.device) for e, _ in parts])
        sorted_ids, order = stable_sort(wids)
        at = torch.searchsorted(sorted_ids, ids, right=True).sub_(1).clamp_(min=0)
        mask = sorted_ids.index_select(0, at) == ids
        slots = torch.where(mask, wslots.index_select(0, order.index_select(0, at)), torch.full_like(ids, -1))
        return mask, slots

    def patch(self, ids: torch.Tensor, rows: torch.Tensor, rv: int) -> torch.Tensor:
        """Replace stale rows in place with their newest logged copy; returns the count (0-d tensor)."""
        mask, slots = self.stale(ids, rv)
        if self.sync_free:
            fresh = self.ring.index_select(0, slots.clamp_min(0) % self.capacity)
            torch.where(mask.unsqueeze(1), fresh, rows, out=rows)
            return mask.sum()
        idx = mask.nonzero().squeeze(1)
        if idx.numel():
            rows[idx] = self.ring.index_select(0, slots.index_select(0, idx) % self.capacity)
        return torch.tensor(idx.numel())

    def reserve(self, n: int) -> torch.Tensor:
        """A contiguous ``float32[n, W]`` slice of the ring for the next step's rows, so the commit's kernel can
        write into the log directly (no copy). It stays untouched until that step is dropped, i.e. until its
        write-back has applied it: the write-back may read it in place."""
        if not self.entries and self.capacity < n * self.steps_hint:  # nothing live: a new ring copies nothing
            self.ring = self._new_ring(n * self.steps_hint * 5 // 4)
        while True:
            start = -(-self.next_slot // self.slot_align) * self.slot_align
            if start % self.capacity + n > self.capacity:  # skip the tail: the slice must not wrap
                start += self.capacity - start % self.capacity
            if start + n - self._live_from() <= self.capacity:
                break
            self._grow(start + n - self._live_from())
        pos = start % self.capacity
        self._reserved = (start, self.ring[pos:pos + n])
        if n and self._reserved[1].data_ptr() % ROW_ALIGN:
            raise RuntimeError(f"write log invariant broken: step rows at slot {start} (ring position {pos}, width "
                               f"{self.width}) start {self._reserved[1].data_ptr() % ROW_ALIGN} bytes past a "
                               f"{ROW_ALIGN}-byte boundary; the kernel would see other alignments than in sync")
        return self._reserved[1]

    def append(self, step: int, ids: torch.Tensor, rows: torch.Tensor) -> None:
        """Log step ``step``'s new rows (``ids`` unique, on the device); ``rows`` ideally from :meth:`reserve`."""
        last = self.entries[-1][0] if self.entries else self.dropped_upto
        if step != last + 1:
            raise RuntimeError(f"steps must be logged one after another: step {step} after step {last} (the write "
                               f"log would miss the steps between)")
        n = ids.numel()
        reserved = self._reserved
        if reserved is None or reserved[1].data_ptr() != rows.data_ptr() or reserved[1].shape != rows.shape:
            self.reserve(n).copy_(rows)
        start = self._reserved[0]
        self._reserved = None
        if self.last_slot is not None:
            self.last_slot.index_copy_(0, ids, torch.arange(start, start + n, device=self.device))
        else:
            # unique (the caller's contract): no two slots of one step share an id. A copy: the caller may reuse
            # its buffer, and the entry lives until its step is dropped
            self._entry_ids.append(ids.clone())
        self.entries.append((step, start, n))
        self.next_slot = start + n

    def drop_through(self, horizon: int) -> None:
        """Forget entries of steps <= horizon (no open read can miss them)."""
        while self.entries and self.entries[0][0] <= horizon:
            self.dropped_upto = self.entries.popleft()[0]
            if self._entry_ids:
                self._entry_ids.popleft()

    def _grow(self, need: int) -> None:
        # Slices handed out earlier keep the old ring alive (the write-back may still read them).
        ring = self._new_ring(max(2 * self.capacity, need))
        new_cap = ring.shape[0]
        live = torch.arange(self._live_from(), self.next_slot, device=self.device)
        if live.numel():
            ring.index_copy_(0, live % new_cap, self.ring.index_select(0, live % self.capacity))
        self.ring = ring

    def _new_ring(self, rows: int) -> torch.Tensor:
        """``float32[c, W]`` on the log's device, ``c >= rows`` a multiple of ``slot_align`` (so an aligned slot's
        ring position is aligned too); its base is: every allocator aligns to at least 16 bytes."""
        rows = -(-max(rows, 1) // self.slot_align) * self.slot_align
        return torch.empty(rows, self.width, dtype=torch.float32, device=self.device)

    def nbytes(self) -> int:
        """Bytes the log holds on its device: the ring, and ``last_slot`` or the logged ids."""
        ids = self.last_slot if self.last_slot is not None else self._entry_ids
        return self.ring.numel() * 4 + 8 * (ids.numel() if isinstance(ids, torch.Tensor) else sum(i.numel() for i in ids))


# ---- Reads of a table: each one opens at the current version and closes exactly once

class ReadTicket:
    """One open read: its version ``rv`` and its registration (distributed; else None). Immutable; only its
    :class:`Reads` closes it."""

    __slots__ = ("rv", "registration", "_open")

    def __init__(self, rv: int, registration: Any) -> None:
        self.rv = rv
        self.registration = registration
        self._open = True

    @property
    def open(self) -> bool:
        return self._open


class Reads:
    """The reads of one table (see the module docstring)."""

    def __init__(self, clock: VersionClock, dist: Any = None) -> None:
        self.clock = clock
        self.dist = dist
        self._lock = threading.Lock()

    def open(self, ids: torch.Tensor, register: bool = True) -> ReadTicket:
        """Open a read of ``ids: int64[n], CPU`` at the current version (distributed: registered with the rows'
        owners; this waits while a step runs)."""
        if self.dist is None:
            return ReadTicket(self.clock.begin_read(), None)
        return ReadTicket(*self.dist.registry.open_read(self.clock, ids, register))

    def close(self, ticket: ReadTicket) -> bool:
        """Close ``ticket``'s read once; later calls do nothing. Any thread. Returns whether this call closed it
        (what a gathered batch never handed out owns goes back with that call alone)."""
        with self._lock:
            if not ticket._open:
                return False
            ticket._open = False
        self.clock.end_read(ticket.rv)
        if ticket.registration is not None:
            self.dist.registry.release(ticket.registration)
        return True

    def open_count(self) -> int:
        """Reads open now."""
        return self.clock.open_reads()


# ---- The write-back: apply committed rows to the CPU table in step order, on one background thread per embedding

_FLUSH_CLOSE_S = 60.0


def _start_writeback(store: RowStore) -> Callable[[int], None]:
    def start(step: int) -> None:
        with torch.profiler.record_function("dgl_oac.flush_dirty"):
            store.clean_ahead()
            store.start_writeback()
    return start


class WriteBack:
    """Bounded queue of committed steps -> table. Errors surface at the next ``submit``/``flush``/``check``."""

    def __init__(self, store: RowStore, clock: VersionClock, maxsize: int, name: str,
                 priority: str = "normal", recycle: Optional[Callable[[torch.Tensor], None]] = None,
                 threads: int = 1) -> None:
        self.store, self.clock = store, clock
        self.recycle = recycle  # gets each item's rows once they are in the table (a CPU buffer pool)
        self.busy_s = 0.0
        self.last_submitted = clock.applied
        self._error: Optional[Failure] = None
        # Out-of-core tables: a second thread starts the write-out of the pages each step dirtied
        # (RowStore.start_writeback says why), so this thread never waits for the disk to take the writes.
        self._flusher: Optional[Worker] = None
        if store.out_of_core:
            self._flusher = Worker(f"dgl-oac-flush-{name}", _start_writeback(store), inbox_size=1, outbox_size=2,
                                   sink=True, priority=priority)
        self._worker = Worker(f"dgl-oac-writeback-{name}", self._apply, inbox_size=maxsize, outbox_size=2,
                              sink=True, priority=priority, threads=threads)

    def _apply(self, item) -> None:
        step, ids, rows, event, op = item
        t0 = time.perf_counter()
        with torch.profiler.record_function("dgl_oac.writeback"):
            wait_host(event)
            if self.store.out_of_core:
                # A 512-byte store into a page the page cache dropped since the gather faults the whole page in
                # first, synchronously, one page at a time (read-before-write), behind the disk's queue of
                # write-outs. Asking for the step's pages together first turns those into one round of reads
                # at depth: 4.6x the rows/s of a plain store, 2.2x a pool of 8 storing threads
                # (benchmarks/studies/writeback_choice.py: oac, 3.8 GiB table, 1.6 GB cgroup). A page just
                # gathered can be evicted already: on Linux >= 6.3 accesses through a MADV_RANDOM mapping do
                # not count as recent use (vma_has_recency), so the gather does not move it back in the LRU.
                with torch.profiler.record_function("dgl_oac.writeback_read_ahead"):
                    self.store.read_ahead(ids, for_write=True)
            if op == "add":
                self.store.add(ids, rows)
            else:
                self.store.write(ids, rows)
        self.clock.publish(step)
        if self._flusher is not None:
            try:  # a request already queued covers this step's pages too
                self._flusher.inbox.put_nowait(step)
            except queue.Full:
                pass
        if self.recycle is not None:
            self.recycle(rows)
        self.busy_s += time.perf_counter() - t0

    def go_idle(self) -> None:
        """``"auto"`` priority: its threads idle from now on (:meth:`Worker.go_idle`)."""
        for worker in (self._worker, self._flusher):
            if worker is not None:
                worker.go_idle()

    def check(self) -> None:
        """Raise a failure of the write-back (or flush) thread in the caller."""
        for worker in (self._worker, self._flusher):
            if self._error is None and worker is not None:
                try:
                    out = worker.outbox.get_nowait()
                except Exception:  # queue.Empty
                    out = None
                if isinstance(out, Failure):
                    self._error = out
        if self._error is not None:
            self._error.reraise()

    def failed(self) -> bool:
        try:
            self.check()
        except BaseException:  # noqa: BLE001 - only whether it failed matters here
            return True
        return False

    def submit(self, step: int, ids: torch.Tensor, rows: torch.Tensor, event, op: str) -> None:
        self.check()
        if step != self.last_submitted + 1:
            raise RuntimeError(f"commit out of order: step {step} submitted after step {self.last_submitted}")
        item = (step, ids, rows, event, op)
        while True:  # not Worker.submit: a full queue whose thread died must raise, not wait forever
            try:
                self._worker.inbox.put(item, timeout=POLL_S)
                break
            except queue.Full:
                self.check()
                if not self._worker.alive():
                    self.check()
                    raise RuntimeError(f"write-back thread ended with steps still pending (step {step})") from None
        self.last_submitted = step

    def flush(self, timeout: float = 600.0) -> None:
        """Block until every submitted step is in the table (raising a write-back failure, never hanging)."""
        deadline = time.monotonic() + timeout
        while not self.clock.wait_applied(self.last_submitted, 0.05):
            self.check()
            if not self._worker.alive():
                self.check()
                raise RuntimeError("write-back thread ended with steps still pending")
            if time.monotonic() > deadline:
                raise TimeoutError(f"write-back did not reach step {self.last_submitted} within {timeout}s")
        self.check()

    def close(self) -> None:
        """Apply what is queued (unless the thread failed), then stop the thread. Idempotent. Called on the
        write-back thread itself (a finalizer the garbage collector ran there), it lets the thread apply its
        queue and end on its own."""
        if self._worker.on_own_thread():
            self._worker.close(drain=True)
            if self._flusher is not None:
                self._flusher.close()
            return
        try:
            if self._error is None and self._worker.alive():
                try:
                    self.flush()
                finally:
                    self._worker.close()
            self._worker.close()
        finally:
            if self._flusher is not None:  # (sync_to_disk() makes the rows durable; this only starts write-outs)
                # A write-out request waits in the block layer's write throttling while the disk takes the
                # dirty pages, which under a tight memory limit (bench_disk's 1.6 GB cgroup) takes longer than
                # Worker.close's default 5 s; the request ends on its own, so waiting for it is bounded.
                self._flusher.close(timeout=_FLUSH_CLOSE_S)


# ---- The one write path of a table: every step, whoever makes it, in step order

def write_step(name: str, store: RowStore, clock: VersionClock, step: int, ids: torch.Tensor,
               ids_dev: torch.Tensor, new: torch.Tensor, transfer: Optional[Transfer], log: Optional[WriteLog],
               writer: Optional[WriteBack], delta_from: Optional[torch.Tensor] = None,
               forwarded: Optional[Tuple[torch.Tensor, torch.Tensor]] = None,
               new_host: Optional[torch.Tensor] = None) -> None:
    """Write step ``step`` of table ``name`` (the next one: its owner counts them): ``new: float32[u, W]``
    (device) for unique ``ids: int64[u], CPU``; with ``delta_from`` (naive async) the table gets
    ``new - delta_from`` added instead. With a write-back thread (``writer``) the rows are copied to the host and
    queued, else written through and published; a ``log`` gets them first. ``forwarded`` (distributed):
    ``(ids_dev, rows)`` other owners wrote in this step, logged with it. ``new_host``: the same rows already on
    the CPU (a distributed owner's kernel ran there), written as they are instead of copied back."""
    logged = (ids_dev, new) if not forwarded or not forwarded[0].numel() else \
        (torch.cat([ids_dev, forwarded[0]]), torch.cat([new, forwarded[1]]))
    if delta_from is not None and log is not None:
        raise RuntimeError(f"NodeEmbedding {name!r}: an async (delta) commit while an oac write log "
                           f"exists would leave the log wrong")
    payload = new if delta_from is None else torch.sub(new, delta_from, out=new)
    op = "write" if delta_from is None else "add"
    direct = new_host is not None and delta_from is None  # rows the host computed: no device -> host copy
    if writer is not None:
        # the copy starts before the log: a failure here leaves no trace
        (host,), event = ((new_host,), None) if direct else transfer.to_host(payload)
        if log is not None:
            log.append(step, *logged)
        writer.submit(step, ids, host, event, op)
    else:
        host = new_host if direct else _host_copy(payload, transfer)
        (store.add if op == "add" else store.write)(ids, host)
        if log is not None:
            log.append(step, *logged)
        clock.publish(step)
        if transfer is not None:
            transfer.recycle(host)


def _host_copy(payload: torch.Tensor, transfer: Optional[Transfer]) -> torch.Tensor:
    """``payload`` on the CPU for a write-through, by the path the write-back thread takes: the transfer's copy
    into pinned memory on its side stream (a fresh pageable tensor a step is tens of MB mapped and page-faulted
    in, and a slower copy), waited for on this thread before the CPU reads it. On the CPU the transfer's copy is
    the identity: the kernel's pooled buffer itself. Rows on another device than the transfer's (``emb(ids,
    device)`` of a table a loader uses elsewhere) are copied plainly."""
    if transfer is None or payload.device != transfer.device:
        return payload.cpu()
    (host,), event = transfer.to_host(payload)
    wait_host(event)  # a host wait: the CPU write below reads the copy
    return host
