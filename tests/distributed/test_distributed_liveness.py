"""A machine that dies, freezes or is cut off mid-epoch makes the others fail promptly, naming it, not after the
process group's timeout (:mod:`dgl_oac.distributed.liveness`).

The monitor alone (several monitors on one in-process store): a silent heartbeat is named after the bound, a
pause of the monitor's own thread names nobody, a store that stops answering is named, the bound's setting.
Three gloo ranks, each its own machine (``GROUP_RANK``), train NodeEmbedding + SparseAdagrad +
``DataLoader(use_ddp=True)`` with a collective timeout of 120 s and ``DGL_OAC_PEER_TIMEOUT=2``; rank 2's machine
"dies" mid-epoch:

- frozen (SIGSTOP: its sockets stay open, as behind a network partition or a power loss the kernel never saw);
- killed (SIGKILL: its sockets close; on this host the /proc check names it at once);
- killed on "another host" (the others' record of its host is changed, so only the heartbeat can name it).

The others raise PeerFailure naming rank 2 with its host and machine within seconds, the group's next
collective fails at once, and destroy_process_group() does not wait for the frozen machine. A peer that is slow but
alive (sleeping 3x the bound between steps) is never declared
dead, and the heartbeat thread ends with its Group, at close(), collection or destroy_process_group().
"""
from __future__ import annotations

import datetime
import gc
import os
import signal
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, List

import dgl
import pytest
import torch
import torch.distributed as dist

import dgl_oac
from dgl_oac.distributed.group import Group, PeerFailure
from dgl_oac.distributed.liveness import ENV, Liveness, Verdict, peer_timeout

from conftest import power_law_graph
from dist_helpers import RankPool, run_ranks, two_rank_pool  # noqa: F401 - the fixture "pool"
from helpers import loss_of

BOUND = 2.0  # DGL_OAC_PEER_TIMEOUT of the spawned ranks
COLLECTIVE_TIMEOUT = 120.0  # what a monitor-less collective would wait for a frozen peer


def _threads() -> List[str]:
    return sorted(t.name for t in threading.enumerate() if t.name.startswith("dgl-oac-liveness"))


# --- the monitor alone ---------------------------------------------------------------------------------------------

def test_peer_timeout_setting() -> None:
    assert peer_timeout({}) == 10.0 and peer_timeout({ENV: " "}) == 10.0
    assert peer_timeout({ENV: "2.5"}) == 2.5 and peer_timeout({ENV: "0"}) is None
    for bad in ("abc", "-1", "inf", "nan"):
        with pytest.raises(ValueError, match=f"{ENV}='{bad}': expected seconds > 0"):
            peer_timeout({ENV: bad})
    with pytest.raises(ValueError, match="interval must be in"):
        Liveness(dist.HashStore(), "p", 0, 2, bound=1.0, interval=1.0)


def test_a_silent_heartbeat_is_named_after_the_bound_and_only_it() -> None:
    store = dist.HashStore()
    monitors = [Liveness(store, "t", r, 3, bound=0.6, interval=0.05) for r in range(3)]
    for m in monitors:
        m.start()
    assert _threads() == ["dgl-oac-liveness-t-r0", "dgl-oac-liveness-t-r1", "dgl-oac-liveness-t-r2"]
    time.sleep(1.2)  # twice the bound, every heartbeat running
    assert not any(m.verdict() for m in monitors)
    monitors[2].close()
    stopped = time.monotonic()
    while not monitors[0].verdict():
        time.sleep(0.01)
        assert time.monotonic() - stopped < 5.0, "rank 2's silence was never declared"
    waited = time.monotonic() - stopped
    assert 0.6 - 0.05 <= waited < 0.6 + 1.0, waited  # the bound, plus at most about one beat
    silent = monitors[0].verdict().silent
    assert list(silent) == [2] and silent[2] > 0.6 and monitors[0].verdict().store is None
    assert list(monitors[1].verdict_within(2.0).silent) == [2]
    for m in monitors:
        m.close()
        m.close()  # idempotent
    assert _threads() == []


def test_a_pause_of_the_monitors_own_thread_names_nobody() -> None:
    """Staleness is measured between two of this rank's own reads: a rank that could not read for a while (its
    process stopped, its thread starved) does not declare the peers that kept beating."""
    store = dist.HashStore()
    me, peer, mute = (Liveness(store, "t", r, 3, bound=0.3, interval=0.05) for r in range(3))
    peer.start()
    mute.beat()
    me.beat()
    time.sleep(1.0)  # more than 3x the bound without a read by "me"
    assert not me.verdict()
    me.beat()  # rank 1 moved meanwhile; rank 2 ("mute") did not, over 1 s of this rank's reads
    assert me.verdict().silent.keys() == {2}
    peer.close()
    assert _threads() == []


class _DeadStore:
    """A store whose host is gone: every call fails (as a TCPStore client's calls do after its timeout)."""

    def clone(self) -> "_DeadStore":
        return self

    def set_timeout(self, timeout: datetime.timedelta) -> None:
        pass

    def set(self, key: str, value: str) -> None:
        if key.endswith("/1"):  # this rank's first write, in the constructor, still got through
            raise RuntimeError("Connection reset by peer")

    def multi_get(self, keys: List[str]) -> List[bytes]:
        raise RuntimeError("Connection reset by peer")


def test_a_store_that_stops_answering_is_named() -> None:
    m = Liveness(_DeadStore(), "t", 0, 2, bound=0.3, interval=0.05)
    m.beat()
    assert not m.verdict(), "a failed beat is not yet a verdict"
    time.sleep(0.4)
    m.beat()
    v = m.verdict()
    assert v and not v.silent and "the rendezvous store has not answered for" in v.store
    assert "Connection reset by peer" in v.store
    assert not Verdict() and Verdict({3: 1.0}) and Verdict(store="x")


class _Work:
    """A collective's work that completes after ``after`` timed waits (never for None), failing with ``error``;
    ``late``: it completes just after a slice of the wait ran out (the slice raises, then it is complete)."""

    def __init__(self, after: Any = None, error: Any = None, late: bool = False) -> None:
        self.after, self.error, self.waits, self.late = after, error, 0, late

    def is_completed(self) -> bool:
        return self.after is not None and self.waits >= self.after

    def wait(self, timeout: Any = None) -> bool:
        self.waits += 1
        if not self.is_completed() or (self.late and self.waits == self.after):
            time.sleep(timeout.total_seconds())
            raise RuntimeError("Operation timed out!")
        if self.error is not None:
            raise self.error
        return True


def test_wait_returns_at_completion_raises_the_works_error_and_stops_at_a_verdict() -> None:
    store = dist.HashStore()
    me, mute = Liveness(store, "w", 0, 2, bound=0.3, interval=0.05), Liveness(store, "w", 1, 2, bound=0.3)
    t0 = time.monotonic()
    me.start()
    work = _Work(after=3)
    assert not me.wait(work) and work.waits == 3, "slices that run out while no one is silent: wait on"
    late = _Work(after=2, late=True)
    assert not me.wait(late) and late.waits == 3, "a slice's timeout is no error when the work then completed"
    with pytest.raises(RuntimeError, match="Connection closed by peer"):
        me.wait(_Work(after=1, error=RuntimeError("Connection closed by peer")))
    verdict = me.wait(_Work())  # rank 1 ("mute") never beats
    assert list(verdict.silent) == [1] and 0.3 < verdict.silent[1] < time.monotonic() - t0 < 2.0
    assert "rank(s) [1] fell silent (R1): no heartbeat for" in verdict.explain(lambda ranks: f"R{ranks[0]}")
    me.close()
    mute.close()


class _BrokenStore(_DeadStore):
    def multi_get(self, keys: List[str]) -> List[bytes]:
        raise TypeError("a bug in the monitor")


def test_a_crashed_monitor_thread_fails_the_wait_instead_of_hiding() -> None:
    m = Liveness(_BrokenStore(), "b", 0, 2, bound=0.3, interval=0.05)
    m.start()
    time.sleep(0.2)
    assert _threads() == []
    with pytest.raises(RuntimeError, match="the liveness monitor's thread failed") as info:
        m.wait(_Work())
    assert isinstance(info.value.__cause__, TypeError)
    m.close()


# --- spawned ranks: a slow peer, the thread's lifetime ------------------------------------------------------------

def _slow_peer(rank: int, world: int) -> Any:
    sub = dist.new_group(backend="gloo")
    sub_name = sub.group_name
    group = Group(sub, peer_timeout=1.0)
    started = _threads()
    x = torch.full((3,), float(rank + 1))
    if rank == 1:
        time.sleep(3.0)  # a long step: 3x the bound, its heartbeat thread running
    t0 = time.monotonic()
    group.all_reduce(x, what="after a slow step")
    waited = time.monotonic() - t0
    objs = group.all_gather_object({"rank": rank, "big": "x" * (1000 * rank)})
    first = group.broadcast_object(("from rank", rank))
    group.close()
    group.close()
    closed = _threads()
    again = Group(sub, peer_timeout=1.0)
    del again
    gc.collect()
    collected = _threads()
    kept = Group(sub, peer_timeout=1.0)
    running = _threads()
    del sub
    dist.destroy_process_group()
    t0 = time.monotonic()
    while _threads() and time.monotonic() - t0 < 5.0:
        time.sleep(0.05)
    ended = time.monotonic() - t0
    assert kept.rank == rank
    return sub_name, started, x, waited, objs, first, closed, collected, running, _threads(), ended


@pytest.mark.slow
def test_a_slow_peer_is_not_dead_and_the_heartbeat_ends_with_its_group(pool: RankPool) -> None:
    for rank, out in enumerate(pool.run(_slow_peer, collective_timeout=60.0, timeout=90.0)):
        name, started, x, waited, objs, first, closed, collected, running, after_destroy, ended = out
        assert started == [f"dgl-oac-liveness-{name}-r{rank}"]
        assert torch.equal(x, torch.full((3,), 3.0))
        if rank == 0:
            assert waited > 2.5, "rank 0 was blocked for more than twice the bound, and not failed"
        assert objs == [{"rank": 0, "big": ""}, {"rank": 1, "big": "x" * 1000}] and first == ("from rank", 0)
        assert closed == [] and collected == [] and running == [f"dgl-oac-liveness-{name}-r{rank}"]
        assert after_destroy == [] and ended < 2.0, "the thread ends within a beat of destroy_process_group()"


def _bounds_differ(rank: int, world: int) -> str:
    try:
        Group(dist.new_group(backend="gloo"), peer_timeout=[3.0, 4.0][rank])
    except ValueError as exc:
        return str(exc)
    return "no error"


def test_a_bound_that_differs_across_ranks_is_a_clear_error(pool: RankPool) -> None:
    for msg in pool.run(_bounds_differ):
        assert f"{ENV} differs across the ranks" in msg and "[3.0, 4.0]" in msg


# --- spawned ranks: one machine dies mid-epoch --------------------------------------------------------------------

def _dies_mid_epoch(rank: int, world: int, how: str, tmp: str) -> Any:
    os.environ["GROUP_RANK"] = str(rank)  # every rank its own machine, as torchrun --nnodes=world sets it
    os.environ[ENV] = str(BOUND)
    try:
        return _train_until_a_machine_dies(rank, world, how, Path(tmp))
    finally:
        del os.environ["GROUP_RANK"], os.environ[ENV]


def _train_until_a_machine_dies(rank: int, world: int, how: str, tmp: Path) -> Any:
    victim = world - 1
    g = power_law_graph(90)
    emb = dgl_oac.NodeEmbedding(90, 4, "live")
    opt = dgl_oac.optim.SparseAdagrad([emb], lr=0.1)
    group = emb.group
    assert group is not None and group.machines == [[r] for r in range(world)]
    if how == "kill-remote" and rank != victim:
        group.peers[victim] = ("another-host", *group.peers[victim][1:])  # no /proc check: only the heartbeat
    loader = dgl_oac.DataLoader(g, torch.arange(90), dgl.dataloading.NeighborSampler([2]), embeddings=[emb],
                                batch_size=5, shuffle=True, seed=0, use_ddp=True, mode="oac", prefetch=2)
    with loader:
        try:
            for i, (_, _, blocks) in enumerate(loader):
                if rank == victim and i == 2:
                    (tmp / "died").write_text(repr(time.time()))
                    os.kill(os.getpid(), signal.SIGSTOP if how == "stop" else signal.SIGKILL)
                loss_of(blocks[0].srcdata["live"]).backward()
                opt.step()
        except PeerFailure as exc:
            detected = time.time() - float((tmp / "died").read_text())
            msg = str(exc)
        else:
            return "finished"
    t0 = time.monotonic()
    try:
        group.barrier("after the failure")
        again = "no error"
    except PeerFailure as exc:
        again = str(exc)
    again_s = time.monotonic() - t0
    t0 = time.monotonic()
    dist.destroy_process_group()  # the group's blocked collective must not block its teardown (nor the exit)
    gc.collect()
    teardown_s = time.monotonic() - t0
    (tmp / f"detected-{rank}").write_text("")
    if how == "stop" and rank == 0:  # the frozen machine is reaped once every survivor has named it
        deadline = time.monotonic() + 60.0
        while not all((tmp / f"detected-{r}").exists() for r in range(victim)) and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(group.peers[victim][1], signal.SIGKILL)  # its peers were torn down already: it blocks nobody
    return msg, detected, again, again_s, teardown_s, group.where([victim])


@pytest.mark.parametrize("how", [pytest.param("stop", marks=pytest.mark.slow), "kill",
                                 pytest.param("kill-remote", marks=pytest.mark.slow)])
def test_a_machine_that_dies_mid_epoch_is_named_within_seconds(how: str) -> None:
    with tempfile.TemporaryDirectory(prefix="dgl-oac-liveness-") as tmp:
        out = run_ranks(_dies_mid_epoch, 3, how, tmp, collective_timeout=COLLECTIVE_TIMEOUT, timeout=110.0,
                        outcomes=True)
    (ok0, r0), (ok1, r1), (ok2, why2) = out
    assert ok0 and ok1, (r0, r1)
    assert not ok2 and "rank 2 exited with code -9" in why2
    for rank, (msg, detected, again, again_s, teardown_s, where) in enumerate([r0, r1]):
        print(f"{how}: rank {rank} raised PeerFailure {detected:.2f} s after rank 2's machine died")
        assert f"rank {rank} of 3" in msg and "step 2" in msg and where in msg, msg
        assert "machine 2 ('" in where and "pid " in where
        if how == "kill":  # same host: its process is seen gone
            assert "rank(s) [2] exited" in msg and detected < BOUND + 1.0, (detected, msg)
        else:  # only its silence tells
            assert "rank(s) [2] fell silent" in msg and f"past the bound of {BOUND} s" in msg, msg
            assert BOUND - 1.0 < detected < BOUND + 8.0, (detected, msg)
        assert detected < COLLECTIVE_TIMEOUT / 4, "named by the monitor, not the process group's timeout"
        assert "cannot run: this group failed earlier" in again and "after the failure" in again
        assert again_s < 1.0, "a failed group's next collective fails at once"
        assert teardown_s < 10.0, "destroy_process_group() did not wait for the frozen machine's collective"
