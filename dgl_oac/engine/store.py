"""The CPU table: one row per node, holding its value and its optimizer state side by side.

Layout: ``table: float32[N, D + S]``, CPU. Columns ``[:D]`` are the embedding, ``[D:]`` the row optimizer's
state (S = 0 until an optimizer is attached). One row = one contiguous record, so a batch's values and state
travel through gather, copy, validation, commit and write-back as a single tensor with a single random access
per row (random-row gathers, not bandwidth, are the cost on CPU).
"""
from __future__ import annotations

import ctypes
import errno
import functools
import mmap
import os
import shutil
import sys
from pathlib import Path
from typing import Callable, Optional, Union

import torch

from .. import native

Storage = Union[str, os.PathLike]
_PAGE = mmap.PAGESIZE
_SYNC_FILE_RANGE_WRITE = 2  # <linux/fs.h>: start write-out of dirty pages not already under write-out


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

    def __init__(self, num_rows: int, dim: int, init_func: Optional[Callable[[torch.Tensor], torch.Tensor]] = None,
                 storage: Storage = "memory") -> None:
        if num_rows <= 0 or dim <= 0:
            raise ValueError(f"a table needs num_rows > 0 and dim > 0, got {num_rows} x {dim}")
        self.num_rows, self.dim, self.state_width = int(num_rows), int(dim), 0
        self.path: Optional[Path] = None if storage == "memory" else Path(storage)
        self.table = self._allocate(self.dim)
        if init_func is not None:
            self._init_values(init_func)

    @property
    def width(self) -> int:
        return self.dim + self.state_width

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
        got = native.gather(self.table, ids, out)  # index_select with the next rows prefetched
        if got is not None:
            return got
        if out is None:
            return self.table.index_select(0, ids)
        return torch.index_select(self.table, 0, ids, out=out)

    def read_ahead(self, ids: torch.Tensor) -> int:
        """File-backed: start reading the pages of rows ``ids: int64[n], CPU`` into the page cache, all at once,
        and return how many pages were asked for; in memory a no-op (0). The values are not read here: a later
        :meth:`gather` reads them (and then finds the pages cached or in flight).

        Why ``posix_fadvise(WILLNEED)`` per page: a gather of a table larger than the page cache faults its
        pages in one at a time on one thread, queue depth 1 (the disk here: 13k 4 KiB reads/s at depth 1,
        69k at depth 32, fio). Each WILLNEED call queues that page's read and returns, so a batch's reads reach
        the disk together. Measured on a cold 3.8 GiB file, 8.4k random 512-byte rows: faulting index_select
        19-24k rows/s; WILLNEED per page then index_select 59-75k rows/s, the same as 16-64 threads each
        faulting a share (61-76k rows/s, 32 threads 70-74k), on one thread, with no pool and no GIL traffic.
        (``madvise(WILLNEED)`` on the map measured the same; Python has no io_uring in its standard library.)
        """
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
        if not native.scatter(self.table, ids, rows):  # index_copy_ with the next rows prefetched
            self.table.index_copy_(0, ids, rows)

    def add(self, ids: torch.Tensor, delta: torch.Tensor) -> None:
        """Add a delta to rows (async mode: an update computed from a stale read is not lost)."""
        self.table.index_add_(0, ids, delta)

    def start_writeback(self) -> None:
        """File-backed: start writing the file's dirty pages to disk now, without waiting for it (Linux
        ``sync_file_range(SYNC_FILE_RANGE_WRITE)``); in memory, or without that call, a no-op.

        Why: the kernel starts flushing only past ``dirty_background_ratio`` of RAM (2.4 GB here), and a
        memory cgroup smaller than that (cgroup v1 has no per-group dirty limit) fills with dirty table pages;
        reclaiming them then makes every page fault of the gather wait for a write. Called by the write-back
        thread after each step, so the pages it dirtied are clean (cheap to evict) soon after.
        """
        if self.path is None or _SYNC_FILE_RANGE is None:
            return
        fd = os.open(self.path, os.O_RDONLY)
        try:
            if _SYNC_FILE_RANGE(fd, ctypes.c_int64(0), ctypes.c_int64(0), _SYNC_FILE_RANGE_WRITE) != 0:
                err = ctypes.get_errno()
                raise OSError(err, f"sync_file_range on {self.path}: {os.strerror(err)}")
        finally:
            os.close(fd)

    def sync_to_disk(self) -> None:
        """Make written rows durable (file-backed tables); a no-op in memory."""
        if self.path is not None:
            fd = os.open(self.path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
