"""Why the gather reads a file-backed table's pages ahead with posix_fadvise(WILLNEED): the mechanisms side by
side on cold rows (the measurement behind :meth:`dgl_oac.engine.table.RowStore.read_ahead`).

    python benchmarks/studies/read_ahead_choice.py          # writes an 8M x 128 (3.8 GiB) file in the temp dir,
    deletes it 
Per repeat and mechanism: the file's pages are evicted (unmapped, fsynced, POSIX_FADV_DONTNEED), then 8.4k
random rows (one 4096-edge batch's worth) are gathered into a tensor by: a faulting ``index_select`` (what a
gather did before: queue depth 1); ``posix_fadvise(WILLNEED)`` or ``madvise(WILLNEED)`` per page, then
``index_select``; ``index_select`` split over a pool of k threads (k page faults in flight).
"""
from __future__ import annotations

import mmap
import os
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

N, D, ROWS = 8_000_000, 128, 8400


def main() -> None:
    path = Path(tempfile.gettempdir()) / "dgl-oac-read-ahead-choice.bin"
    block = torch.randn(1 << 20, D).numpy().tobytes()
    with open(path, "wb") as f:
        for lo in range(0, N, 1 << 20):
            f.write(block[: min(1 << 20, N - lo) * D * 4])
    fd = os.open(path, os.O_RDWR)
    m = mmap.mmap(fd, N * D * 4)
    m.madvise(mmap.MADV_RANDOM)
    table = torch.frombuffer(m, dtype=torch.float32).view(N, D)
    pool = ThreadPoolExecutor(64)

    def evict() -> None:
        m.madvise(mmap.MADV_DONTNEED)  # our page-table entries (a mapped page cannot be dropped)
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)

    def hint(ids: torch.Tensor, how: str) -> None:
        for p in torch.unique(ids * (D * 4) // mmap.PAGESIZE).tolist():
            if how == "fadvise":
                os.posix_fadvise(fd, p * mmap.PAGESIZE, mmap.PAGESIZE, os.POSIX_FADV_WILLNEED)
            else:
                m.madvise(mmap.MADV_WILLNEED, p * mmap.PAGESIZE, mmap.PAGESIZE)

    try:
        print(f"load {os.getloadavg()}")
        for rep in range(2):
            for k, name in enumerate(["fault", "fadvise", "madvise", "pool4", "pool8", "pool16", "pool32", "pool64"]):
                evict()
                ids = torch.randint(0, N, (ROWS,), generator=torch.Generator().manual_seed(100 * rep + k))
                t0 = time.perf_counter()
                if name in ("fadvise", "madvise"):
                    hint(ids, name)
                if name.startswith("pool"):
                    torch.cat(list(pool.map(lambda c: table.index_select(0, c), ids.chunk(int(name[4:])))))
                else:
                    table.index_select(0, ids)
                dt = time.perf_counter() - t0
                print(f"{name:8s} {ROWS / dt / 1e3:6.1f}k rows/s ({dt * 1e3:.0f} ms)", flush=True)
        print(f"load {os.getloadavg()}")
    finally:
        del table
        m.close()
        os.close(fd)
        path.unlink()


if __name__ == "__main__":
    main()
