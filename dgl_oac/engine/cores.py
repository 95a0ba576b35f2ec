"""How dgl-oac's threads share the cores: the caller's torch team during an epoch (the one rule, below), and
its background threads' priority and OpenMP teams (:func:`set_thread_priority`, :func:`background_team`).

torch gives the calling thread an OpenMP team of one thread per core. Threads and processes at normal priority
beside it (sampling processes; the gather and write-back threads at ``background_priority="normal"``) take cores
from the team: every parallel op of the model then waits at its barrier for a team thread one of them
descheduled, and libgomp spin-waits meanwhile. Threads at idle priority (the default, Linux ``SCHED_IDLE``) run
only on what the team leaves, so they are not counted.

The rule: for the whole of an epoch, in every mode, the caller's team is

    min(torch's default, usable cores - busy), at least 1
    busy = sampling processes + (1 gather + 1 write-back per table, at normal priority; 0 at idle priority)

where usable cores are ``os.sched_getaffinity(0)`` (a container's or ``taskset``'s share, not the machine's).
sync counts the threads async and oac read ahead with, although it starts none: a reduction's bits depend on
its team (torch's sum of 100k floats differs between 1 and 2 threads), and oac's results must be sync's bit for
bit. The epoch restores the caller's count when it ends. The rule applies only to torch's default count (one
thread per physical core): with ``OMP_NUM_THREADS`` or ``MKL_NUM_THREADS`` in the environment, or another
count set by ``torch.set_num_threads``, your count is kept.

Why idle threads are not counted, on 2 cores (``benchmarks/results/bench_modes_workloads.json``): a team of 1
runs sync at 0.58-0.83x of a team of 2 on a quiet machine, while the idle-priority pipeline beside a team of 2
keeps oac at sync's speed.
"""
from __future__ import annotations

import os
import sys
import threading
from typing import Any, Callable, List, Optional

import torch

from ..config import background_threads_from_env
from .spin import OFF_BELOW, LoadMonitor, SpinPolicy, loaded_library

#: environment variables that mean the user sized the team: the rule then leaves it alone
USER_SETTINGS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")


def _affinity() -> List[int]:
    """The cores this process may run on, or every core of the machine where that is unknown."""
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return list(range(os.cpu_count() or 1))


def usable_cores() -> int:
    """Cores this process may run on (its CPU affinity), or the machine's count where that is unknown."""
    return len(_affinity())


def user_sized() -> bool:
    """Whether the environment sets the team size (:data:`USER_SETTINGS`)."""
    return any(os.environ.get(name) for name in USER_SETTINGS)


def default_threads() -> int:
    """torch's default team: one thread per physical core (ATen counts cores, not hyperthreads, and ignores
    the affinity); the logical count where the topology is unknown."""
    cores = set()
    try:
        with open("/proc/cpuinfo") as info:
            package = core = None
            for line in info:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "physical id":
                    package = value.strip()
                elif key == "core id":
                    core = value.strip()
                elif not key and core is not None:  # the blank line that ends a processor's block
                    cores.add((package, core))
                    package = core = None
            if core is not None:
                cores.add((package, core))
    except OSError:
        pass
    return len(cores) or os.cpu_count() or 1


def busy_at(priority: str) -> int:
    """Cores a background thread at ``priority`` keeps from the team: 0 at idle or auto priority where the
    platform has idle (``SCHED_IDLE`` runs only on what others leave; auto is idle whenever the cores are ours),
    else 1."""
    return 0 if priority in ("idle", "auto") and hasattr(os, "SCHED_IDLE") else 1


def caller_team(current: int, busy: int, cores: Optional[int] = None) -> int:
    """The caller's team beside ``busy`` background threads and processes: ``current`` lowered to the cores
    they leave, at least 1."""
    left = (usable_cores() if cores is None else cores) - busy
    return max(1, min(current, left))


def background_team(stages: int, caller: int, busy: int = 0, cores: Optional[int] = None,
                    device: bool = False) -> int:
    """The OpenMP team of each of ``stages`` background threads (an epoch's gather thread and its tables'
    write-back threads) beside the caller's team of ``caller`` and ``busy`` sampling processes: the usable
    cores those leave, shared equally, at least 1; ``device`` (the model runs on an accelerator): at least half
    the usable cores, shared. ``DGL_OAC_BACKGROUND_THREADS`` sets it instead.

    Why not always 1: a stage's ops are row copies (gather, write-back), memory-bound and exact whatever the
    team, and on a machine with more logical cores than torch's default team (one per physical core: a GPU
    host's hyperthreads) one thread leaves the bandwidth idle. On an H200 host (16 cores, a caller's team of 8)
    the gather thread alone took 11-16 ms a batch where the caller's team gathered the same rows in 2 ms
    (``benchmarks/results/gpu/2026-11-28-h200``), and bounded oac's step. Where nothing is left over (2 cores,
    a team of 2) it stays 1: the threads together then exceed the cores, libgomp cuts every team's spin-wait
    (:mod:`dgl_oac.engine.spin`), and the caller's forward and backward slow down while such a thread lives
    (``benchmarks/RESULTS.md``); a larger background team would make that worse. With the rule the teams
    together never exceed the cores where there are spare ones.

    Why half the cores on a device whatever the caller's team: there the model runs on the accelerator and the
    caller's team idles through most of a step, so the copies lose little to the libgomp spin throttle that
    more threads than cores turns on. On the H200 host at torch's default team (16 of 16 cores) teams of 1 ran
    oac@4 at 46.3 batches/s against sync's 58.7; teams of 4 (24 threads on 16 cores) at 60.5 against 59.6
    (``benchmarks/results/gpu/2026-11-28-h200-b``)."""
    user = background_threads_from_env(os.environ)
    if user is not None:
        return user
    usable = usable_cores() if cores is None else cores
    stages = max(1, stages)
    share = (usable - caller - busy) // stages
    if device:
        share = max(share, usable // 2 // stages)
    return max(1, share)


def follow_load() -> LoadMonitor:
    """For a program that runs work outside the loaders' epochs (``dgl-oac train``'s evaluations): libgomp's
    spin-wait cut short while another process is busy on our cores, for as long as the returned context
    manager is entered (:mod:`dgl_oac.engine.spin`)."""
    return LoadMonitor(_affinity(), torch.get_num_threads())


class CallerCores:
    """Applies the rule for one epoch on the thread that made it (its caller): :meth:`share` when it starts,
    :meth:`update` at each batch (libgomp's spin-wait, cut short while another process is busy on our cores:
    :mod:`dgl_oac.engine.spin`), :meth:`restore` when it ends (idempotent).

    ``torch.set_num_threads`` acts on the calling thread's team (and the default of threads not yet started),
    so both run on the owner's thread; a restore from another thread (an epoch the garbage collector ends
    elsewhere) is left undone, and the owner's count stays the smaller one until its next epoch ends."""

    def __init__(self, own_pids: Callable[[], List[int]] = list) -> None:
        self._owner = threading.get_ident()
        self._before: Optional[int] = None  # the caller's count, while this object has changed it
        self._team: Optional[int] = None  # the count it set
        self.spin = SpinPolicy(_affinity(), torch.get_num_threads, own_pids)

    def share(self, busy: int) -> None:
        """Lower the owner's team to the cores ``busy`` background threads and processes leave."""
        if threading.get_ident() != self._owner or user_sized() or self._before is not None:
            return
        current = torch.get_num_threads()
        if current != default_threads():
            return  # the user's own count
        team = caller_team(current, busy)
        if team != current:
            self._before, self._team = current, team
            torch.set_num_threads(team)

    def update(self) -> bool:
        """Between batches, on the owner's thread: follow the load on our cores (:mod:`dgl_oac.engine.spin`).
        Returns whether a window just showed them free of other processes (``"auto"`` threads may settle)."""
        if threading.get_ident() != self._owner:
            return False
        others = self.spin.update()
        return others is not None and others < OFF_BELOW

    def restore(self) -> None:
        self.spin.close()
        before, self._before = self._before, None
        if before is None or threading.get_ident() != self._owner:
            return
        if torch.get_num_threads() == self._team:  # else the user set another count meanwhile: theirs stays
            torch.set_num_threads(before)


def set_thread_priority(priority: str, native_id: Optional[int] = None) -> bool:
    """Give the calling thread (or the thread ``native_id`` of this process) ``priority``; returns whether it has
    it.

    ``"idle"`` (Linux ``SCHED_IDLE``) makes the thread run only on a core no other thread of its scheduling
    group wants: a background stage then fills the gaps of the training thread's compute (its single-threaded
    Python, sampling, waits) instead of taking a core from the OpenMP team of its next parallel op, where a
    2-thread op would wait at the barrier for the descheduled thread. The OpenMP threads this thread starts
    inherit it. Elsewhere than on Linux the thread stays as it is (returns False). ``"normal"``: unchanged.

    ``"auto"`` (the default): normal until its owner settles it to idle, once a window of
    :mod:`dgl_oac.engine.spin` shows no other process busy on our cores. An idle thread beside a busy process
    gets a core only when no one else wants one, so it would starve the pipeline; at normal priority it takes
    its share. Only that way round: an unprivileged thread may lower its priority but not raise it again.
    """
    if priority in ("normal", "auto"):
        return True
    if not sys.platform.startswith("linux") or not hasattr(os, "SCHED_IDLE"):
        return False
    try:
        os.sched_setscheduler(native_id or threading.get_native_id(), os.SCHED_IDLE, os.sched_param(0))
    except OSError:
        return False
    return True


def _openmp_library() -> Optional[Any]:
    """The OpenMP runtime torch loaded, or None (another platform/backend)."""
    import ctypes

    lib = loaded_library(("libgomp", "libiomp"), "omp_set_num_threads")
    if lib is not None:
        lib.omp_set_num_threads.argtypes = [ctypes.c_int]
    return lib


_OPENMP: Optional[Any] = None


def thread_team(threads: int) -> bool:
    """Size the calling thread's OpenMP team for its torch ops (and ``rowops.c``'s loops) to ``threads``;
    returns whether it could. OpenMP's own ``omp_set_num_threads`` is per thread, where ``torch.set_num_threads``
    would change the process-wide default as well. A background stage's team is :func:`background_team`."""
    global _OPENMP
    import torch

    torch.get_num_threads()  # ATen initialises this thread's count on first use: it would undo ours
    if _OPENMP is None:
        _OPENMP = _openmp_library() or False
    if not _OPENMP:
        return False
    _OPENMP.omp_set_num_threads(max(1, int(threads)))
    return True
