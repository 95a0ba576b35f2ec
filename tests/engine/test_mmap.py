"""File-backed tables (``NodeEmbedding(..., storage=path)``, a shared memory map): training on one equals
training in memory, widening for an optimizer's state works on the file, write-backs reach the file (another
process reads them, also after the trainer is SIGKILLed), a checkpoint streams the file without loading it
into RAM, a full disk is a clear error, and scripts/big_table.py runs (small)."""
import errno
import hashlib
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import dgl
import pytest
import torch

import dgl_oac
from dgl_oac.checkpoint import CheckpointReader, load_checkpoint, save_checkpoint

from conftest import power_law_graph, seeded_init

pytestmark = pytest.mark.hang_timeout(120)
ROOT = Path(__file__).resolve().parents[2]
GRAPH = power_law_graph(200, seed=5)


def train(mode, storage, steps=40):
    emb = dgl_oac.NodeEmbedding(GRAPH.num_nodes(), 5, "e", seeded_init(0), storage=storage)
    opt = dgl_oac.SparseAdagrad([emb], lr=0.1)  # widens the table: 5 value + 5 state columns
    loader = dgl_oac.DataLoader(GRAPH, torch.arange(GRAPH.num_nodes()), dgl.dataloading.NeighborSampler([3, 3]),
                                embeddings=[emb], mode=mode, batch_size=10, shuffle=True, seed=1, prefetch=3)
    step = 0
    while step < steps:
        for batch in loader:
            x = batch[-1][0].srcdata["e"]
            (x.square().sum() + x[:, 0].sum()).backward()
            opt.step()
            step += 1
            if step == steps:
                break
    loader.close()
    emb.flush()
    return emb


def file_sha(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def table_sha(emb):
    return hashlib.sha256(memoryview(emb.store.table.contiguous().numpy()).cast("B")).hexdigest()


@pytest.mark.parametrize("mode", ["sync", "oac"])
def test_file_backed_training_equals_memory_and_reaches_the_file(tmp_path, mode):
    path = tmp_path / "table.bin"
    ref = train("sync", "memory")
    emb = train(mode, path)
    assert torch.equal(emb.weight, ref.weight) and torch.equal(emb.optm_state, ref.optm_state)
    assert emb.store.path == path and path.stat().st_size == GRAPH.num_nodes() * 10 * 4  # widened in place
    assert sorted(p.name for p in tmp_path.iterdir()) == ["table.bin"]  # no .widen left behind
    emb.store.sync_to_disk()
    # another process reads exactly the trained rows (values and optimizer state) from the file
    out = subprocess.run([sys.executable, "-c", "import hashlib, sys; "
                          "print(hashlib.sha256(open(sys.argv[1], 'rb').read()).hexdigest())", str(path)],
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip() == table_sha(emb)
    ref.close()
    emb.close()


def test_flushed_steps_survive_sigkill(tmp_path):
    """The trainer flushes and sync_to_disk()s, then dies by SIGKILL without closing anything: the file holds
    every step it flushed (nothing stayed in a user-space buffer)."""
    path = tmp_path / "table.bin"
    child = textwrap.dedent(f"""
        import hashlib, os, signal, sys
        sys.path[:0] = [{str(ROOT / 'tests' / 'engine')!r}, {str(ROOT / 'tests')!r}]
        import test_mmap
        emb = test_mmap.train("oac", {str(path)!r})
        emb.store.sync_to_disk()
        print(test_mmap.table_sha(emb), flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    out = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == -9, out.stderr[-2000:]
    assert file_sha(path) == out.stdout.strip().splitlines()[-1]
    ref = train("sync", "memory")
    assert file_sha(path) == table_sha(ref)  # and it is what training should have produced
    ref.close()


def _vm_hwm():
    return int(re.search(r"VmHWM:\s+(\d+) kB", Path("/proc/self/status").read_text()).group(1)) * 1024


def test_checkpoint_streams_a_file_backed_table_without_loading_it(tmp_path):
    """Saving a 256 MB file-backed table reads its file a chunk at a time (not through the map), and loading it
    into another file-backed table writes that file a chunk at a time: neither raises peak RSS by the table."""
    rows, dim = 2_000_000, 32  # 256 MB of rows in the file
    emb = dgl_oac.NodeEmbedding(rows, dim, "big", storage=tmp_path / "table.bin")
    pattern = torch.arange(1 << 20, dtype=torch.float32).numpy().tobytes()  # 4 MB
    fd = os.open(tmp_path / "table.bin", os.O_WRONLY)  # fill the file without touching the map
    for off in range(0, rows * dim * 4, len(pattern)):
        os.pwrite(fd, pattern[: rows * dim * 4 - off], off)
    os.close(fd)
    try:
        Path("/proc/self/clear_refs").write_text("5")  # reset the peak-RSS counter
    except OSError:
        pytest.skip("cannot reset VmHWM on this kernel")
    base = _vm_hwm()
    save_checkpoint(tmp_path / "c.ckpt", [emb])
    peak = _vm_hwm() - base
    assert peak < 100 * 2**20, f"saving a 256 MB file-backed table raised peak RSS by {peak / 2**20:.0f} MB"
    emb.close()
    CheckpointReader(tmp_path / "c.ckpt").verify()
    again = dgl_oac.NodeEmbedding(rows, dim, "big", storage=tmp_path / "again.bin")
    Path("/proc/self/clear_refs").write_text("5")
    base = _vm_hwm()
    load_checkpoint(tmp_path / "c.ckpt", [again])
    peak = _vm_hwm() - base
    assert peak < 100 * 2**20, f"loading a 256 MB file-backed table raised peak RSS by {peak / 2**20:.0f} MB"
    assert file_sha(tmp_path / "again.bin") == file_sha(tmp_path / "table.bin")
    again.close()


def test_table_map_is_advised_for_random_reads(tmp_path):
    """Without MADV_RANDOM every page fault of a row gather reads ahead read_ahead_kb around it (8 MiB here):
    a table larger than RAM then reads gigabytes per batch. The mapping carries the kernel's "rr" flag."""
    path = tmp_path / "table.bin"
    emb = dgl_oac.NodeEmbedding(1000, 8, "e", storage=path)
    dgl_oac.SparseAdagrad([emb], lr=0.1)  # the widened table is a new mapping: advised too
    smaps = Path("/proc/self/smaps").read_text().split("\n")
    flags = [smaps[i + j] for i, line in enumerate(smaps) if line.endswith(str(path))
             for j in range(1, 30) if i + j < len(smaps) and smaps[i + j].startswith("VmFlags:")][:1]
    assert flags and " rr" in flags[0], flags
    emb.close()


def test_full_disk_is_a_clear_error_not_a_sigbus(tmp_path, monkeypatch):
    def no_space(fd, offset, length):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", no_space)
    path = tmp_path / "table.bin"
    with pytest.raises(OSError, match=f"no space for the table file {re.escape(str(path))}: it needs 4,000 bytes"):
        dgl_oac.NodeEmbedding(100, 10, "e", storage=path)
    assert not path.exists()
    monkeypatch.undo()
    emb = dgl_oac.NodeEmbedding(100, 10, "e", storage=path)  # blocks reserved up front
    assert os.stat(path).st_blocks * 512 >= 4000
    emb.close()


def test_big_table_script_small(tmp_path):
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import big_table
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    report = big_table.main(["--small", "--dir", str(tmp_path)])
    assert report["steps"] == 20 and report["steps_per_s"] > 0 and report["rows_per_s"] > 0
    assert report["rows_on_disk_match"] and report["file_deleted"]
    assert report["loss_last"] < report["loss_first"]
    assert list(tmp_path.iterdir()) == []
