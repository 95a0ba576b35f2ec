"""dgl_oac.engine.runtime: during an epoch the caller's torch team leaves a core to each sampling process and each
background thread at normal priority (idle-priority threads take only what the team leaves), the same team in
every mode (so oac's bits stay sync's), restored when the epoch ends however it ends; a count the user chose
(environment or torch.set_num_threads) is kept."""
from __future__ import annotations

import gc
import os
import subprocess
import sys
import threading

import pytest
import torch

import dgl_oac
from dgl_oac.engine import runtime
from dgl_oac.engine.table import RowStore

from conftest import seeded_init

N, D = 30, 4


@pytest.fixture
def many_cores(monkeypatch):
    """A machine of 8 usable cores whose torch default is 8 threads, whatever this one has."""
    monkeypatch.setattr(runtime, "usable_cores", lambda: 8)
    monkeypatch.setattr(runtime, "default_threads", lambda: 8)
    for name in runtime.USER_SETTINGS:
        monkeypatch.delenv(name, raising=False)
    before = torch.get_num_threads()
    torch.set_num_threads(8)
    yield
    torch.set_num_threads(before)


def batches(n=8):
    gen = torch.Generator().manual_seed(3)
    return [torch.randint(0, N, (5,), generator=gen) for _ in range(n)]


def teams_seen(mode, tables=1, stop_after=None, **options):
    """The caller's torch.get_num_threads() at each batch of an epoch over ``tables`` tables, and after it."""
    embs = [dgl_oac.NodeEmbedding(N, D, f"cores{t}", init_func=seeded_init(t)) for t in range(tables)]
    opt = dgl_oac.SparseAdagrad(embs, lr=0.1)
    loader = dgl_oac.BatchLoader(batches(), ids={e: (lambda b: b) for e in embs}, mode=mode, prefetch=2,
                                 **options)
    seen = []
    for i, b in enumerate(loader):
        seen.append(torch.get_num_threads())
        sum(e(b).square().sum() for e in embs).backward()
        opt.step()
        if i + 1 == stop_after:
            break
    if stop_after is not None:
        del loader  # a break and the loader dropped: the epoch's finalizer gives the team back
        gc.collect()
    else:
        loader.close()
    return seen, torch.get_num_threads()


def test_normal_priority_threads_each_take_a_core_in_every_mode(many_cores):
    # one table: a gather thread and one write-back thread; sync reserves them too (same bits as oac)
    for mode in ("sync", "async", "oac"):
        assert teams_seen(mode, background_priority="normal") == ([6] * 8, 8), mode
    assert teams_seen("oac", tables=3, background_priority="normal") == ([4] * 8, 8)  # a write-back per table
    assert teams_seen("oac", pull_thread=True, background_priority="normal") == ([5] * 8, 8)  # the source's


@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="idle priority is Linux's SCHED_IDLE")
def test_idle_priority_threads_take_no_core_from_the_team(many_cores):
    for mode in ("sync", "oac"):
        assert teams_seen(mode) == ([8] * 8, 8), mode
    assert teams_seen("oac", tables=3, pull_thread=True) == ([8] * 8, 8)


def test_a_dropped_epoch_gives_the_team_back(many_cores):
    assert teams_seen("oac", stop_after=3, background_priority="normal") == ([6] * 3, 8)


def test_a_count_the_user_chose_is_kept(many_cores, monkeypatch):
    torch.set_num_threads(3)  # not torch's default: the user's own
    assert teams_seen("oac", background_priority="normal") == ([3] * 8, 3)
    torch.set_num_threads(8)
    monkeypatch.setenv("OMP_NUM_THREADS", "8")
    assert teams_seen("oac", background_priority="normal") == ([8] * 8, 8)


def test_at_least_one_thread():
    assert runtime.caller_team(2, 2, cores=2) == 1
    assert runtime.caller_team(2, 5, cores=2) == 1
    assert runtime.caller_team(16, 4, cores=16) == 12
    assert runtime.caller_team(4, 1, cores=16) == 4  # never more than the caller had


def test_default_threads_is_torchs_default_here():
    """The topology read from /proc/cpuinfo gives the count torch picks in a fresh process."""
    env = {k: v for k, v in os.environ.items() if k not in runtime.USER_SETTINGS}
    out = subprocess.run([sys.executable, "-c", "import torch; print(torch.get_num_threads())"], env=env,
                         capture_output=True, text=True, timeout=120, check=True)
    assert runtime.default_threads() == int(out.stdout.split()[-1])


def test_oac_trains_syncs_bits_when_the_loss_has_a_team_dependent_reduction(many_cores):
    """A full sum of 100k floats differs between teams of 1 and 2 threads; a loss scaled by one still trains
    oac to sync's bits, because both modes run the same team."""
    big = torch.randn(100_000, generator=torch.Generator().manual_seed(0))
    torch.set_num_threads(1)
    one = big.sum()
    torch.set_num_threads(2)
    assert not torch.equal(one, big.sum())  # else this test shows nothing
    torch.set_num_threads(8)

    def train(mode):
        emb = dgl_oac.NodeEmbedding(N, D, f"bits-{mode}", init_func=seeded_init(5))
        opt = dgl_oac.SparseAdam([emb], lr=0.05)
        for b in dgl_oac.BatchLoader(batches(12), ids={emb: lambda b: b}, mode=mode, prefetch=3,
                                     background_priority="normal"):
            (emb(b).square().sum() * big.sum()).backward()
            opt.step()
        return emb.weight.clone()

    assert torch.equal(train("sync"), train("oac"))


def test_each_sampling_process_takes_a_core(many_cores):
    dgl = pytest.importorskip("dgl")
    graph = dgl.rand_graph(60, 300)
    emb = dgl_oac.NodeEmbedding(60, D, "cores-sampling", init_func=seeded_init(2))
    loader = dgl_oac.DataLoader(graph, torch.arange(60), dgl.dataloading.NeighborSampler([3]), batch_size=20,
                                num_workers=2, mode="oac")
    seen = [torch.get_num_threads() for _ in loader]
    assert seen == [6] * 3 and torch.get_num_threads() == 8


def background_teams(mode="oac", tables=1, **options):
    """The OpenMP team each background thread ran its ops with, by thread name prefix, and the loader's stats."""
    seen = {}

    def ids(b):  # the gather thread calls it (the caller too, for a batch it gathers itself)
        seen.setdefault(threading.current_thread().name.rsplit("-", 1)[0], set()).add(torch.get_num_threads())
        return b

    embs = [dgl_oac.NodeEmbedding(N, D, f"bg{t}", init_func=seeded_init(t)) for t in range(tables)]
    opt = dgl_oac.SparseAdagrad(embs, lr=0.1)
    loader = dgl_oac.BatchLoader(batches(), ids={e: ids for e in embs}, mode=mode, prefetch=2, **options)
    write, add = RowStore.write, RowStore.add

    def recording(op):
        def run(store, *args):
            seen.setdefault(threading.current_thread().name.rsplit("-", 1)[0], set()).add(torch.get_num_threads())
            return op(store, *args)
        return run

    RowStore.write, RowStore.add = recording(write), recording(add)  # the write-back thread's ops
    try:
        for b in loader:
            sum(e(b).square().sum() for e in embs).backward()
            opt.step()
        loader.close()
    finally:
        RowStore.write, RowStore.add = write, add
    return seen, loader.stats.background_threads


@pytest.fixture
def hyperthreads(many_cores, monkeypatch):
    """A GPU host's shape: 16 usable logical cores, torch's default team 8 (one per physical core)."""
    monkeypatch.setattr(runtime, "usable_cores", lambda: 16)
    monkeypatch.delenv("DGL_OAC_BACKGROUND_THREADS", raising=False)


def test_background_team_shares_what_the_callers_team_leaves():
    assert runtime.background_team(2, caller=8, cores=16) == 4  # a gather and a write-back thread
    assert runtime.background_team(4, caller=8, cores=16) == 2  # three tables
    assert runtime.background_team(2, caller=8, busy=2, cores=16) == 3  # two sampling processes
    assert runtime.background_team(2, caller=2, cores=2) == 1  # nothing left: one thread each
    assert runtime.background_team(2, caller=6, cores=8) == 1
    # the model on a device: the teams together get at least half the cores, beside any caller's team
    assert runtime.background_team(2, caller=16, cores=16, device=True) == 4
    assert runtime.background_team(2, caller=8, cores=16, device=True) == 4
    assert runtime.background_team(4, caller=16, cores=16, device=True) == 2
    assert runtime.background_team(2, caller=2, cores=2, device=True) == 1


@pytest.mark.skipif(runtime._openmp_library() is None, reason="needs torch's OpenMP runtime")
def test_background_threads_run_with_the_team_left_over(hyperthreads):
    seen, team = background_teams("oac")
    assert team == 4
    assert seen["dgl-oac-gather"] == {4} and seen["dgl-oac-writeback"] == {4}
    seen, team = background_teams("oac", tables=3)  # four threads share the 8 left
    assert team == 2 and seen["dgl-oac-gather"] == {2} and seen["dgl-oac-writeback"] == {2}
    # at normal priority the two threads fit beside the team of 8 too; on 9 cores they take one from it (7)
    # and share the 2 left
    assert background_teams("oac", background_priority="normal")[1] == 4
    runtime.usable_cores = lambda: 9  # (the fixture's monkeypatch restores it)
    assert background_teams("oac", background_priority="normal")[1] == 1


@pytest.mark.skipif(runtime._openmp_library() is None, reason="needs torch's OpenMP runtime")
def test_no_spare_cores_one_thread_each(many_cores, monkeypatch):
    monkeypatch.delenv("DGL_OAC_BACKGROUND_THREADS", raising=False)
    seen, team = background_teams("async")
    assert team == 1 and seen["dgl-oac-gather"] == {1} and seen["dgl-oac-writeback"] == {1}


@pytest.mark.skipif(runtime._openmp_library() is None, reason="needs torch's OpenMP runtime")
def test_background_threads_setting(many_cores, monkeypatch):
    monkeypatch.setenv("DGL_OAC_BACKGROUND_THREADS", "3")
    seen, team = background_teams("oac")
    assert team == 3 and seen["dgl-oac-gather"] == {3} and seen["dgl-oac-writeback"] == {3}
    for bad in ("0", "two"):
        monkeypatch.setenv("DGL_OAC_BACKGROUND_THREADS", bad)
        with pytest.raises(ValueError, match=f"DGL_OAC_BACKGROUND_THREADS={bad!r}"):
            background_teams("oac")


def test_larger_background_teams_train_the_same_bits(hyperthreads, monkeypatch):
    """The background threads copy rows: no team changes a bit of oac's (sync's) training."""
    def train(threads, mode="oac"):
        monkeypatch.setenv("DGL_OAC_BACKGROUND_THREADS", str(threads))
        emb = dgl_oac.NodeEmbedding(4000, 64, f"bits-bg{threads}", init_func=seeded_init(7))
        opt = dgl_oac.SparseAdam([emb], lr=0.05)
        gen = torch.Generator().manual_seed(11)
        data = [torch.randint(0, 4000, (1500,), generator=gen) for _ in range(10)]
        for b in dgl_oac.BatchLoader(data, ids={emb: lambda b: b}, mode=mode, prefetch=3):
            emb(b).square().sum().backward()
            opt.step()
        return emb.weight.clone()

    one = train(1)
    assert torch.equal(one, train(4))
    assert torch.equal(one, train(1, "sync"))


@pytest.mark.skipif(runtime._openmp_library() is None, reason="needs torch's OpenMP runtime")
def test_a_device_epochs_background_threads_get_half_the_cores(many_cores, monkeypatch):
    """8 cores, all in the caller's team: on the CPU one thread each, on a device (the seam every device path
    takes) half the cores between the gather and the write-back thread."""
    monkeypatch.delenv("DGL_OAC_BACKGROUND_THREADS", raising=False)
    assert background_teams("oac")[1] == 1
    monkeypatch.setattr(dgl_oac.loading.epoch.device_rows, "on_device", lambda device: True)
    seen, team = background_teams("oac")
    assert team == 2 and seen["dgl-oac-gather"] == {2} and seen["dgl-oac-writeback"] == {2}
