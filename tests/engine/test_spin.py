"""libgomp's spin-wait cut short while another process is busy on our cores (dgl_oac.engine.runtime): the load it
sees, the threads it holds and gives back, that it follows the load, and that it changes no result."""
from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest
import torch

from dgl_oac.engine import runtime
from dgl_oac.engine.runtime import CoreLoad, SpinPolicy, SpinThrottle

LIB = runtime._libgomp()
needs_libgomp = pytest.mark.skipif(LIB is None, reason="torch's OpenMP runtime here is not libgomp")
CORES = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else [0]


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="needs Linux /proc")
def test_core_load_counts_another_process_and_not_ours():
    burner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)
        everyone = CoreLoad(CORES)
        ours = CoreLoad(CORES, own_pids=lambda: [burner.pid])  # the burner counted as ours (a sampling process)
        t0, cpu0 = time.monotonic(), _cpu_seconds(burner.pid)
        assert everyone.others() is None  # no window yet
        time.sleep(runtime.WINDOW_S + 0.5)
        a, b = everyone.others(), ours.others()
        rate = (_cpu_seconds(burner.pid) - cpu0) / (time.monotonic() - t0)
    finally:
        burner.kill()
        burner.wait()
    # the burner's share of the cores (a whole core on a quiet machine, less beside other jobs) is among the
    # others' in one and not in the other (clock ticks of 10 ms, windows a few ms apart: 0.1 core of slack)
    assert rate > 0.2, rate
    assert a >= rate - 0.1, (a, rate)
    assert abs((a - b) - rate) < 0.1, (a, b, rate)


@needs_libgomp
def test_throttle_holds_extra_threads_and_gives_them_back():
    before = _threads()
    t = SpinThrottle(LIB)
    t.on(2)
    assert t.active
    assert _threads() == before + 3  # the holding thread and its pool's 2 workers
    t.on(2)  # already on: nothing more
    assert _threads() == before + 3
    t.off()
    t.off()  # idempotent
    deadline = time.monotonic() + 5
    while _threads() > before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _threads() == before and not t.active
    assert not any(th.name == "dgl-oac-spin-throttle" for th in threading.enumerate())


class _Load:
    """CoreLoad.others from a script: None (no window yet) or another process's cores."""

    def __init__(self, seq):
        self.seq = list(seq)

    def others(self):
        return self.seq.pop(0)


@needs_libgomp
def test_policy_follows_the_load_with_hysteresis(monkeypatch):
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)
    policy = SpinPolicy(CORES, team=lambda: 2)
    policy._load = _Load([None, 0.2, 0.9, None, 0.15, 0.05, 0.3])
    seen = []
    for _ in range(7):
        policy.update()
        seen.append(policy.active)
    # on at >= 0.25 cores of another process, off only below 0.1
    assert seen == [False, False, True, True, True, False, True]
    policy.close()
    policy.close()
    assert not policy.active


@needs_libgomp
def test_policy_leaves_a_team_of_one_and_the_users_policy(monkeypatch):
    one = SpinPolicy(CORES, team=lambda: 1)
    one._load = _Load([0.9])
    one.update()
    assert not one.active
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    users = SpinPolicy(CORES, team=lambda: 2)
    users._load = _Load([0.9])
    assert users.update() == 0.9 and not users.active  # the load is followed, the spin left alone


@needs_libgomp
def test_throttled_ops_give_the_same_bits():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(300_000, generator=gen)
    a, b = torch.randn(256, 512, generator=gen), torch.randn(512, 256, generator=gen)
    quiet = (x.sum(), a @ b, torch.softmax(a, 1).sum(0))
    t = SpinThrottle(LIB)
    t.on(2)
    try:
        throttled = (x.sum(), a @ b, torch.softmax(a, 1).sum(0))
    finally:
        t.off()
    assert all(torch.equal(p, q) for p, q in zip(quiet, throttled))


@needs_libgomp
def test_an_epoch_throttles_under_load_trains_syncs_bits_and_ends_the_throttle(monkeypatch):
    """Every batch a window, every window loaded: oac's epoch runs throttled (sync's not), to sync's bits; the
    holding thread ends with the epoch."""
    import dgl_oac
    from conftest import seeded_init

    for name in runtime.USER_POLICY:
        monkeypatch.delenv(name, raising=False)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    big = torch.randn(100_000, generator=torch.Generator().manual_seed(0))
    gen = torch.Generator().manual_seed(3)
    batches = [torch.randint(0, 30, (5,), generator=gen) for _ in range(10)]

    def train(mode, loaded):
        monkeypatch.setattr(runtime, "WINDOW_S", 0.0)
        monkeypatch.setattr(runtime, "ON_AT", -1.0 if loaded else float("inf"))
        emb = dgl_oac.NodeEmbedding(30, 4, f"spin-{mode}", init_func=seeded_init(5))
        opt = dgl_oac.SparseAdam([emb], lr=0.05)
        held = []
        for b in dgl_oac.BatchLoader(batches, ids={emb: lambda b: b}, mode=mode, prefetch=3):
            held.append(any(t.name == "dgl-oac-spin-throttle" for t in threading.enumerate()))
            (emb(b).square().sum() * big.sum()).backward()
            opt.step()
        return emb.weight.clone(), held

    try:
        want, quiet = train("sync", loaded=False)
        got, loaded = train("oac", loaded=True)
    finally:
        torch.set_num_threads(before)
    assert not any(quiet) and any(loaded)
    assert torch.equal(want, got)
    assert not any(t.name == "dgl-oac-spin-throttle" for t in threading.enumerate())


@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="needs Linux SCHED_IDLE")
def test_auto_priority_threads_start_normal_and_settle_idle():
    from dgl_oac.engine.runtime import Worker

    def policy(name):
        th = next(t for t in threading.enumerate() if t.name == name)
        return os.sched_getscheduler(th.native_id)

    workers = {p: Worker(f"spin-prio-{p}", lambda x: x, 1, 1, priority=p) for p in ("auto", "idle", "normal")}
    try:
        time.sleep(0.1)  # each thread sets its own priority as it starts
        assert [policy(f"spin-prio-{p}") for p in workers] == [os.SCHED_OTHER, os.SCHED_IDLE, os.SCHED_OTHER]
        for w in workers.values():
            w.go_idle()
        assert [policy(f"spin-prio-{p}") for p in workers] == [os.SCHED_IDLE, os.SCHED_IDLE, os.SCHED_OTHER]
    finally:
        for w in workers.values():
            w.close()


@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE") or not os.path.exists("/proc/stat"), reason="needs Linux")
@pytest.mark.parametrize("others", [0.0, 1.0])
def test_an_auto_epoch_idles_its_threads_only_while_no_other_process_is_busy(monkeypatch, others):
    import dgl_oac
    from conftest import seeded_init

    monkeypatch.setattr(runtime, "WINDOW_S", 0.0)
    monkeypatch.setattr(CoreLoad, "others", lambda self: others)
    emb = dgl_oac.NodeEmbedding(30, 4, f"spin-auto-{others}", init_func=seeded_init(5))
    opt = dgl_oac.SparseAdagrad([emb], lr=0.05)
    gen = torch.Generator().manual_seed(3)
    batches = [torch.randint(0, 30, (5,), generator=gen) for _ in range(6)]
    seen = set()
    for i, b in enumerate(dgl_oac.BatchLoader(batches, ids={emb: lambda b: b}, mode="oac", prefetch=2)):
        emb(b).sum().backward()
        opt.step()
        if i >= 2:
            seen |= {os.sched_getscheduler(t.native_id) for t in threading.enumerate()
                     if t.name.startswith(("dgl-oac-gather", "dgl-oac-writeback")) and t.is_alive()}
    assert seen == ({os.SCHED_IDLE} if others == 0.0 else {os.SCHED_OTHER})


@needs_libgomp
def test_a_load_monitor_throttles_while_loaded_and_ends_its_threads(monkeypatch):
    from dgl_oac.engine.runtime import LoadMonitor

    for name in runtime.USER_POLICY:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(runtime, "WINDOW_S", 0.01)
    loads = iter([None, 1.0] + [1.0] * 1000)
    monkeypatch.setattr(CoreLoad, "others", lambda self: next(loads, 1.0))
    names = lambda: {t.name for t in threading.enumerate()}  # noqa: E731
    with LoadMonitor(CORES, team=2):
        deadline = time.monotonic() + 5
        while "dgl-oac-spin-throttle" not in names() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert {"dgl-oac-load-monitor", "dgl-oac-spin-throttle"} <= names()
    assert not {"dgl-oac-load-monitor", "dgl-oac-spin-throttle"} & names()
