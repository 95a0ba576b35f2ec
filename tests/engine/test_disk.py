"""Tables larger than the page cache: the gather thread reads a batch's pages ahead, sync does not, the
write-back reads the pages of the rows it is about to store ahead too, its dirty pages are flushed by their own
thread, and oac stays bitwise equal to sync when every read comes from the disk (the file's page cache dropped
after every step). A file table that fits in memory makes none of those calls. Also the memory-cgroup helper of
scripts/big_table.py."""
import ctypes
import os
import resource
import subprocess
import sys
import threading
from pathlib import Path

import dgl
import pytest
import torch

import dgl_oac
from dgl_oac.engine.table import RowStore, VersionClock, WriteBack
from dgl_oac.engine import table as table_module

from conftest import power_law_graph, seeded_init

pytestmark = pytest.mark.hang_timeout(120)
ROOT = Path(__file__).resolve().parents[2]
GRAPH = power_law_graph(3000, seed=7)
PAGE = os.sysconf("SC_PAGE_SIZE")
_LIBC = ctypes.CDLL(None, use_errno=True)
_MADV_DONTNEED = 4


@pytest.fixture
def out_of_core(monkeypatch):
    """Every file-backed table counts as larger than memory (RowStore.out_of_core): the pipeline reads its pages
    ahead and starts each step's write-out, as for a table the page cache cannot hold."""
    monkeypatch.setattr(table_module, "memory_limit", lambda: 1024)


def drop_page_cache(emb):
    """Evict the table file from the page cache: unmap our pages (MADV_DONTNEED keeps a shared file map's
    data: it is in the file's page cache), write the dirty ones, then drop the clean ones."""
    table = emb.store.table
    nbytes = table.numel() * 4
    assert _LIBC.madvise(ctypes.c_void_p(table.data_ptr()), ctypes.c_size_t(nbytes), _MADV_DONTNEED) == 0
    fd = os.open(emb.store.path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def train_cold(mode, path, steps=30):
    """Adagrad rows (values + state, 512-byte rows), the file's cache dropped after every step."""
    emb = dgl_oac.NodeEmbedding(GRAPH.num_nodes(), 64, "e", seeded_init(3), storage=path)
    opt = dgl_oac.SparseAdagrad([emb], lr=0.1)
    loader = dgl_oac.DataLoader(GRAPH, torch.arange(GRAPH.num_nodes()), dgl.dataloading.NeighborSampler([4, 4]),
                                embeddings=[emb], mode=mode, batch_size=40, shuffle=True, seed=2, prefetch=3)
    drop_page_cache(emb)
    step = 0
    for batch in loader:
        x = batch[-1][0].srcdata["e"]
        (x.square().sum() + x[:, 0].sum()).backward()
        opt.step()
        drop_page_cache(emb)
        step += 1
        if step == steps:
            break
    loader.close()
    emb.flush()
    return emb


def test_a_file_table_that_fits_in_memory_makes_no_read_ahead_or_write_out_call_per_batch(tmp_path, monkeypatch):
    """The page cache holds such a table: oac's path asks the kernel nothing per batch (no page read ahead, no
    write-out started, no fadvise), and trains the bits of the same table in memory."""
    calls = []
    for name in ("read_ahead", "start_writeback"):
        real = getattr(RowStore, name)
        monkeypatch.setattr(RowStore, name, lambda self, *a, _real=real, _name=name, **kw: calls.append(_name) or
                            _real(self, *a, **kw))
    fadvise = os.posix_fadvise
    monkeypatch.setattr(table_module.os, "posix_fadvise", lambda *a: calls.append("fadvise") or fadvise(*a))

    def train(storage):
        emb = dgl_oac.NodeEmbedding(GRAPH.num_nodes(), 64, "in-core", seeded_init(3), storage=storage)
        opt = dgl_oac.SparseAdagrad([emb], lr=0.1)
        loader = dgl_oac.DataLoader(GRAPH, torch.arange(GRAPH.num_nodes()),
                                    dgl.dataloading.NeighborSampler([4, 4]), embeddings=[emb], mode="oac",
                                    batch_size=40, shuffle=True, seed=2, prefetch=3)
        for step, batch in enumerate(loader):
            batch[-1][0].srcdata["in-core"].square().sum().backward()
            opt.step()
            if step == 29:
                break
        loader.close()
        emb.flush()
        return emb

    on_file = train(tmp_path / "t.bin")
    assert not on_file.store.out_of_core and calls == []
    in_memory = train("memory")
    assert torch.equal(on_file.weight, in_memory.weight) and torch.equal(on_file.optm_state, in_memory.optm_state)
    monkeypatch.setattr(table_module, "memory_limit", lambda: 1024)  # the same table, out of core: the calls made
    out_of_core = train(tmp_path / "big.bin")
    assert {"read_ahead", "start_writeback", "fadvise"} <= set(calls)
    for emb in (on_file, in_memory, out_of_core):
        emb.close()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="page-cache control is Linux's")
def test_oac_equals_sync_bitwise_reading_from_disk_and_rows_reach_the_file(tmp_path, monkeypatch, out_of_core):
    calls = {"sync": [], "oac": []}
    real = RowStore.read_ahead
    mode = {"now": ""}

    def spy(self, ids, for_write=False):
        pages = real(self, ids, for_write)
        calls[mode["now"]].append(pages)
        return pages

    monkeypatch.setattr(RowStore, "read_ahead", spy)
    out = {}
    for m in ("sync", "oac"):
        mode["now"] = m
        out[m] = train_cold(m, tmp_path / f"{m}.bin")
    assert calls["sync"] == []  # sync stays sync: it reads its batch after the previous write, as before
    assert len(calls["oac"]) >= 30 and all(p > 0 for p in calls["oac"])  # every pipelined batch read ahead
    sync, oac = out["sync"], out["oac"]
    assert torch.equal(oac.weight, sync.weight) and torch.equal(oac.optm_state, sync.optm_state)
    init = dgl_oac.NodeEmbedding(GRAPH.num_nodes(), 64, "i", seeded_init(3))
    assert not torch.equal(oac.weight, init.weight)  # training moved rows
    for m, emb in out.items():  # the trained rows (values and state) are in the file, read without the map
        emb.store.sync_to_disk()
        drop_page_cache(emb)
        raw = (tmp_path / f"{m}.bin").read_bytes()
        assert torch.equal(torch.frombuffer(bytearray(raw), dtype=torch.float32).view_as(emb.store.table),
                           sync.store.table)
    for emb in out.values():
        emb.close()


def test_read_ahead_asks_for_each_page_of_the_rows_once(tmp_path):
    store = RowStore(5000, 32, storage=tmp_path / "t.bin")  # 128-byte rows: 32 a page
    per_page = PAGE // 128
    ids = torch.tensor([0, 1, per_page - 1, per_page, 4999, 4999, 3 * per_page + 2])
    assert store.read_ahead(ids) == 4  # pages 0, 1, 3 and the last
    assert store.read_ahead(torch.empty(0, dtype=torch.int64)) == 0
    odd = RowStore(5000, 5, storage=tmp_path / "odd.bin")  # 20-byte rows: some straddle two pages
    straddler = PAGE // 20  # starts 4 bytes before the end of page 0 (4096 = 204 * 20 + 16)
    assert odd.read_ahead(torch.tensor([straddler])) == (2 if PAGE % 20 else 1)
    assert RowStore(100, 4).read_ahead(torch.tensor([1, 2])) == 0  # in memory: nothing to read
    store.start_writeback()  # a no-op in memory, a started write-out on the file: neither raises
    RowStore(100, 4).start_writeback()


def evict_file(store):
    """:func:`drop_page_cache` for a bare RowStore."""
    assert _LIBC.madvise(ctypes.c_void_p(store.table.data_ptr()), ctypes.c_size_t(store.table.numel() * 4),
                         _MADV_DONTNEED) == 0
    fd = os.open(store.path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="page-cache control is Linux's")
def test_write_back_reads_evicted_pages_ahead_instead_of_faulting_them_in_one_by_one(tmp_path, monkeypatch, out_of_core):
    """Regression (issue 28): storing a 512-byte row into a page the page cache dropped since the gather read
    the page first, synchronously, one page at a time; that was the write-back's time on a table larger than
    the cache. Now the write-back thread asks for the step's pages together first, so its stores take no major
    fault. Step 0 runs with the read-ahead disabled, to show the pages really were evicted (else: skipped)."""
    per_page = PAGE // 512
    store = RowStore(per_page * 300, 128, init_func=lambda t: t.normal_(generator=torch.Generator().manual_seed(0)),
                     storage=tmp_path / "t.bin")
    clock, seen = VersionClock(), []
    real_ahead, real_write = RowStore.read_ahead, RowStore.write

    def read_ahead(self, ids, for_write=False):
        seen.append(("read_ahead", threading.current_thread().name, ids.clone()))
        return real_ahead(self, ids, for_write) if seen_on["read_ahead"] else 0

    def write(self, ids, rows):
        before = resource.getrusage(resource.RUSAGE_THREAD).ru_majflt
        real_write(self, ids, rows)
        seen.append(("write", resource.getrusage(resource.RUSAGE_THREAD).ru_majflt - before, ids.clone()))

    seen_on = {"read_ahead": False}
    monkeypatch.setattr(RowStore, "read_ahead", read_ahead)
    monkeypatch.setattr(RowStore, "write", write)
    writer = WriteBack(store, clock, 2, "t")
    try:
        steps = [torch.arange(k, store.num_rows, per_page) for k in range(2)]  # one row in each of 300 pages
        news = [torch.full((300, 128), float(k + 1)) for k in range(2)]
        for step, (ids, new) in enumerate(zip(steps, news)):
            evict_file(store)
            seen_on["read_ahead"] = step == 1
            writer.submit(step, ids, new, None, "write")
            writer.flush()
    finally:
        writer.close()
    (a0, t0, i0), (w0, faults0, _), (a1, t1, i1), (w1, faults1, _) = seen
    assert (a0, w0, a1, w1) == ("read_ahead", "write", "read_ahead", "write")  # the read-ahead comes first
    assert t0 == t1 == "dgl-oac-writeback-t" and torch.equal(i0, steps[0]) and torch.equal(i1, steps[1])
    if faults0 == 0:
        pytest.skip(f"{tmp_path}'s filesystem kept the pages cached (tmpfs?): nothing to read ahead")
    assert faults0 >= 250 and faults1 == 0, (faults0, faults1)
    store.sync_to_disk()
    raw = torch.frombuffer(bytearray((tmp_path / "t.bin").read_bytes()), dtype=torch.float32).view(-1, 128)
    for ids, new in zip(steps, news):  # the rows reached the file
        assert torch.equal(raw[ids], new)
    assert torch.equal(raw, store.table)


def test_write_back_of_a_table_in_memory_reads_nothing_ahead(monkeypatch):
    calls = []
    monkeypatch.setattr(RowStore, "read_ahead", lambda self, ids, for_write=False: calls.append(ids))
    store = RowStore(100, 4)
    writer = WriteBack(store, VersionClock(), 2, "m")
    try:
        writer.submit(0, torch.tensor([3, 7]), torch.ones(2, 4), None, "write")
        writer.flush()
    finally:
        writer.close()
    assert calls == [] and store.table[[3, 7]].eq(1).all() and store.table.sum() == 8


@pytest.mark.parametrize("larger_than_memory", [True, False])
def test_flush_thread_lives_with_the_write_back_of_an_out_of_core_table_only(tmp_path, monkeypatch,
                                                                              larger_than_memory):
    """A file table larger than memory gets a flush thread; one that fits (in the page cache) and a table in
    memory get none, and neither reads ahead."""
    if larger_than_memory:
        monkeypatch.setattr(table_module, "memory_limit", lambda: 1024)
    ahead = []
    real = RowStore.read_ahead
    monkeypatch.setattr(RowStore, "read_ahead",
                        lambda self, ids, for_write=False: ahead.append(ids) or real(self, ids, for_write))

    def flushers():
        return [t.name for t in threading.enumerate() if t.name.startswith("dgl-oac-flush-")]

    before = flushers()
    for storage, expect in ((tmp_path / "t.bin", int(larger_than_memory)), ("memory", 0)):
        emb = dgl_oac.NodeEmbedding(GRAPH.num_nodes(), 8, "e", seeded_init(0), storage=storage)
        opt = dgl_oac.SparseSGD([emb], lr=0.1)
        loader = dgl_oac.DataLoader(GRAPH, torch.arange(GRAPH.num_nodes()), dgl.dataloading.NeighborSampler([2]),
                                    embeddings=[emb], mode="oac", batch_size=100, prefetch=2)
        for i, batch in enumerate(loader):
            batch[-1][0].srcdata["e"].sum().backward()
            opt.step()
            if i == 0:
                assert len(flushers()) - len(before) == expect
        loader.close()
        emb.close()
        assert flushers() == before
    assert bool(ahead) == larger_than_memory


def test_memory_cgroup_size_and_missing_controller(tmp_path):
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        from memory_cgroup import MemoryCgroup, parse_size
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    assert parse_size("1.6G") == int(1.6 * 2**30) and parse_size("512M") == 512 * 2**20
    assert parse_size("4096") == 4096
    for bad in ("", "-1G", "1.6X", "G"):
        with pytest.raises(ValueError, match="memory limit"):
            parse_size(bad)
    with pytest.raises(SystemExit, match="no cgroup v1 memory controller is mounted"):
        with MemoryCgroup("x", 2**30, root=tmp_path):
            pass
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(not os.access("/sys/fs/cgroup/memory", os.W_OK),
                    reason="needs root and a cgroup v1 memory hierarchy")
def test_big_table_runs_in_a_memory_cgroup_and_removes_it(tmp_path):
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import big_table
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    ours = f"dgl-oac-big-{os.getpid()}"  # this process's group (a parallel run has groups of its own)
    # the limit: 300 MB, or the footprint of the imports alone plus 150 MB where that is more (torch's CUDA
    # build maps more at import than its CPU build: 300 MB OOM-killed the run beside torch 2.14.1+cu)
    probe = subprocess.run([sys.executable, "-c", "import resource, torch, dgl_oac; "
                            "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)"],
                           capture_output=True, text=True, timeout=120, check=True)
    limit_mb = max(300, int(probe.stdout.split()[-1]) // 1024 + 150)
    report = big_table.main(["--small", "--dir", str(tmp_path), "--memory-limit", f"{limit_mb}M"])
    assert report["rows_on_disk_match"] and report["file_deleted"] and report["steps"] == 20
    assert 0 < report["cgroup_peak_gib"] <= limit_mb / 1024 + 1e-9
    assert ours not in os.listdir("/sys/fs/cgroup/memory")  # removed


def test_big_table_power_law_endpoints_are_skewed_and_spread_over_the_file():
    """``--power 1``: reads concentrate on few rows (the share the report states matches the draws), and the hot
    rows are not the file's first ones; ``--power 0`` stays uniform."""
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import big_table
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    rows, n = 10_000, 200_000
    gen = torch.Generator().manual_seed(0)
    skewed = big_table.endpoints(rows, n, 1.0, gen)
    counts = torch.bincount(skewed, minlength=rows).sort(descending=True)
    drawn = float(counts.values[: rows // 10].sum()) / n
    assert abs(drawn - big_table.top_share(rows, 1.0)) < 0.02 and drawn > 0.6
    assert counts.indices[:100].float().mean() > rows / 10  # the hottest rows lie all over the file
    uniform = torch.bincount(big_table.endpoints(rows, n, 0.0, gen), minlength=rows).sort(descending=True).values
    assert float(uniform[: rows // 10].sum()) / n < 0.15 and big_table.top_share(rows, 0.0) == pytest.approx(0.1)


def test_bench_disk_fits_runs_each_mode_on_the_file_and_in_memory(tmp_path):
    out = tmp_path / "fits.json"
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_disk.py"), "--fits", "--quick",
                          "--modes", "sync,oac", "--dir", str(tmp_path / "tables"), "--out", str(out)],
                         capture_output=True, text=True, timeout=240, cwd=ROOT)
    assert run.returncode == 0, run.stderr[-3000:]
    runs = __import__("json").loads(out.read_text())["runs"]
    assert set(runs) == {"sync", "sync:memory", "oac", "oac:memory"}
    assert {r["storage"] for label, rs in runs.items() for r in rs} == {"file", "memory"}
    assert all(r["storage"] == ("memory" if label.endswith(":memory") else "file") and r["steps"] == 20
               for label, rs in runs.items() for r in rs)
    assert all(r["rows_on_disk_match"] is (None if label.endswith(":memory") else True)
               for label, rs in runs.items() for r in rs)
    assert "file / memory" in run.stdout


def test_bench_disk_help_and_python_randread_randrw(tmp_path):
    """The benchmark's limit without fio: depth-many O_DIRECT readers (a filesystem without O_DIRECT, such as
    tmpfs, refuses it: then there is nothing to measure here)."""
    import subprocess

    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_disk.py"), "--help"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "--memory-limit" in out.stdout and "--quick" in out.stdout, out.stderr
    assert "--base-tree" in out.stdout
    bad = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_disk.py"), "--base-tree", str(tmp_path)],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0 and "is not a dgl-oac checkout" in bad.stderr, bad.stderr
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import bench_disk
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    path = tmp_path / "r.bin"
    path.write_bytes(os.urandom(1 << 20))
    try:
        rate = bench_disk.python_randread(path, 4, 0.2)
    except OSError as exc:
        pytest.skip(f"no O_DIRECT on {tmp_path}: {exc}")
    assert rate > 0
    mixed = bench_disk.python_randrw(path, 4, 0.2)  # the read+write ceiling fio's randrw gives where installed
    assert mixed["reads_per_s"] > 0 and mixed["writes_per_s"] > 0
    assert path.stat().st_size == 1 << 20  # writes in place, aligned pages: the file keeps its size


def test_bench_disk_runs_a_mode_at_the_priority_its_label_names():
    import argparse

    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import bench_disk
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    args = argparse.Namespace(rows=10, dim=4, steps=2, prefetch=4, memory_limit="1G", dir="/tmp/x",
                              background_priority="idle", fits=False, power=0.0, warmup=0)

    def flag(cmd, name):
        return cmd[cmd.index(name) + 1]

    assert flag(bench_disk.command(args, "oac/normal"), "--background-priority") == "normal"
    assert flag(bench_disk.command(args, "oac"), "--background-priority") == "idle"
    assert flag(bench_disk.command(args, "oac:memory/normal"), "--storage") == "memory"
    assert flag(bench_disk.command(args, "oac"), "--memory-limit") == "1G"
    assert flag(bench_disk.command(args, "oac"), "--cache") == "auto"
    nocache = bench_disk.command(args, "oac:nocache/normal")
    assert flag(nocache, "--cache") == "0" and flag(nocache, "--storage") == "file" and "--memory-limit" in nocache
    auto = bench_disk.command(args, "oac=auto:nocache")
    assert (flag(auto, "--prefetch"), flag(auto, "--mode"), flag(auto, "--cache")) == ("auto", "oac", "0")
    assert flag(bench_disk.command(args, "oac"), "--prefetch") == "4"
    args.fits = True  # a table that fits: no cgroup
    assert "--memory-limit" not in bench_disk.command(args, "oac") and flag(bench_disk.command(args, "oac"),
                                                                             "--storage") == "file"
    assert flag(bench_disk.command(args, "sync@base/normal"), "--mode") == "sync"
