"""The background runtime: the threads dgl-oac starts, how they share the cores, and how they end.

Four parts, each explained below: :func:`finalizer` (every finalizer of dgl-oac, Ctrl-C safe); :class:`SpinPolicy`
(libgomp's spin-wait cut short while another process is busy on our cores); the core rule (:class:`CallerCores`,
:func:`set_thread_priority`, :func:`background_team`); :class:`Worker` (the contract every background thread
follows: bounded queues, a stop event, timeouts, failures through the queue, an idempotent ``close()``).

Finalizers that do not swallow Ctrl-C.

Python runs a signal's handler in the main thread at the next bytecode, whatever that thread is doing. When that
is a finalizer (a batch's leaf died, an epoch dropped without ``close()``), the ``KeyboardInterrupt`` it raises is
unraisable: Python prints "Exception ignored" and training goes on, the Ctrl-C lost. Every finalizer of dgl-oac
runs through :func:`finalizer`, which gives such an interrupt back to the main thread a moment later
(``_thread.interrupt_main``, from a timer thread): Python would check for it at the finalizer's next bytecode, still
inside the finalizer, if it were given back at once. It is then raised in the code the main thread runs next; one
that lands in another of these finalizers is given back again.

libgomp's spin-wait, cut short while another process is busy on this process's cores.

torch's OpenMP runtime on Linux (libgomp) spins about 300,000 iterations (milliseconds) at every barrier and
between parallel regions before a thread sleeps. On a quiet machine that makes the model's many short parallel
ops start and end fast. Beside one other busy process it collapses: each op's team waits at its barrier for a
thread the scheduler took off its core, and the waiting thread spins through the slice the late one needed
(issue 39: held-out UMLS 438 s instead of 10 s on 2 cores; plain torch falls to 0.25x as well).

libgomp cuts every spin to 100 iterations by itself when it manages more threads than the process has cores
(``GOMP_SPINCOUNT`` in the libgomp manual). :class:`SpinThrottle` uses that rule: while :class:`CoreLoad` sees
another process busy on our cores, it keeps a few extra OpenMP threads asleep (a parallel region's pool, held by a
thread of its own), so libgomp's count exceeds the cores and every team waits by sleeping; once the cores are ours
again the thread ends, its pool with it, and the spin is back. It changes when threads wait, never what they
compute: team sizes, and so every result, stay as they are.

It stays off where the user chose the policy (``OMP_WAIT_POLICY``, ``GOMP_SPINCOUNT``), where the runtime is not
libgomp, and for a team of one.

How dgl-oac's threads share the cores: the caller's torch team during an epoch (the one rule, below), and
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

The contract every background thread of dgl-oac follows, in one helper.

A :class:`Worker` is a named daemon thread that takes items from a bounded inbox, runs ``fn(item)`` and puts
the result, end-of-data or the exception (with its traceback) into a bounded outbox. Every blocking call has
a timeout, so nothing hangs and ``close()`` (idempotent) always returns.

Waits block; they do not poll. A :func:`put` or :func:`get` sleeps on its queue's condition until an item or
a free slot arrives, or until its :class:`StopEvent` is set, which wakes it at once. The timeout
(:data:`WAIT_S`) only bounds how late a producer that died without a word is noticed.

Why block rather than poll (``q.get(timeout=0.05)`` in a loop): on the hot path both wake on the same thing,
the queue's condition notified by the put, so a batch is handed over no sooner and no later; polling would
only add 20 wake-ups a second per blocked thread, and make a ``close()`` or a stop wait for the next poll
(``benchmarks/before_after.py`` measures no difference in step time between the two).
"""
from __future__ import annotations

import _thread
import atexit
import ctypes
import functools
import os
import queue
import sys
import threading
import time
import warnings
import weakref
from typing import Any, Callable, Iterable, List, Optional, Tuple

import torch

from ..config import background_threads_from_env


# ---- Finalizers that do not swallow Ctrl-C

REDELIVER_S = 0.01  # long enough for the finalizer to return, short to a person


def _run(fn: Callable[..., None], *args: Any) -> None:
    try:
        fn(*args)
    except KeyboardInterrupt:
        timer = threading.Timer(REDELIVER_S, _thread.interrupt_main)
        timer.daemon = True
        timer.name = "dgl-oac-interrupt"
        timer.start()


def finalizer(obj: Any, fn: Callable[..., None], *args: Any) -> "weakref.finalize":
    """``weakref.finalize(obj, fn, *args)``, with a Ctrl-C that lands inside ``fn`` raised again in the main
    thread (module docstring)."""
    return weakref.finalize(obj, _run, fn, *args)


# ---- libgomp's spin-wait, cut short while another process is busy on this process's cores

#: environment variables that set libgomp's wait policy: with one of them the user's choice stands
USER_POLICY = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")
#: another process's share of our cores (in cores, averaged over a window) that turns the throttle on / off
ON_AT, OFF_BELOW = 0.25, 0.1
WINDOW_S = 0.5  # the shortest window a load sample averages over


@functools.lru_cache(maxsize=None)
def loaded_library(names: Tuple[str, ...], symbol: str) -> Optional[ctypes.CDLL]:
    """A shared library this process has loaded already (from its memory map: the same handle, no second copy)
    whose file name contains one of ``names`` and which has ``symbol``; None where there is none (or no
    ``/proc``). Looked up once per process for each question (every epoch asks)."""
    try:
        with open("/proc/self/maps") as maps:
            paths = sorted({line.split()[-1] for line in maps if any(n in line.rsplit("/", 1)[-1] for n in names)})
    except OSError:
        return None
    for path in paths:
        try:
            lib = ctypes.CDLL(path)
            getattr(lib, symbol)
            return lib
        except (OSError, AttributeError):
            continue
    return None


def _libgomp() -> Optional[ctypes.CDLL]:
    """torch's libgomp, or None (another OpenMP runtime, or another platform)."""
    lib = loaded_library(("libgomp",), "GOMP_parallel")
    if lib is not None:
        lib.GOMP_parallel.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint, ctypes.c_uint]
    return lib


class CoreLoad:
    """CPU time other processes spend on ``cores``, from ``/proc/stat`` (Linux): :meth:`others` returns it in
    cores, averaged since the previous sample, or None until a window of :data:`WINDOW_S` has passed.

    Ours is this process's CPU time plus that of ``own_pids()`` (its sampling processes: the caller's team is
    already sized to leave them their cores)."""

    def __init__(self, cores: Iterable[int], own_pids: Callable[[], List[int]] = list) -> None:
        self.cores = {f"cpu{c}" for c in cores}
        self.own_pids = own_pids
        self.tick = os.sysconf("SC_CLK_TCK")
        self._last = self._sample()

    def _busy(self) -> Optional[float]:
        """Seconds the cores have been busy since boot (every process)."""
        try:
            with open("/proc/stat") as stat:
                lines = [line.split() for line in stat if line.startswith("cpu")]
        except OSError:
            return None
        # user nice system idle iowait irq softirq steal (guest time is inside user)
        ticks = sum(int(f[1]) + int(f[2]) + int(f[3]) + int(f[6]) + int(f[7]) + int(f[8])
                    for f in lines if f[0] in self.cores)
        return ticks / self.tick

    def _ours(self) -> float:
        seconds = time.process_time()
        for pid in self.own_pids():
            try:
                with open(f"/proc/{pid}/stat") as stat:
                    fields = stat.read().rsplit(")", 1)[1].split()
                seconds += (int(fields[11]) + int(fields[12])) / self.tick  # utime, stime
            except (OSError, IndexError, ValueError):
                continue
        return seconds

    def _sample(self):
        return time.monotonic(), self._busy(), self._ours()

    def others(self) -> Optional[float]:
        now = time.monotonic()
        if now - self._last[0] < WINDOW_S:
            return None
        sample = self._sample()
        (t0, busy0, ours0), (t1, busy1, ours1) = self._last, sample
        self._last = sample
        if busy0 is None or busy1 is None:
            return None
        return max(0.0, (busy1 - busy0) - (ours1 - ours0)) / max(t1 - t0, 1e-6)


class SpinThrottle:
    """Holds ``extra`` sleeping OpenMP threads while on (module docstring). :meth:`off` is idempotent and ends
    the holding thread within its timeout; :meth:`on` again starts a new one."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self._lib = lib
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    @property
    def active(self) -> bool:
        return self._thread is not None

    def on(self, extra: int) -> None:
        if self._thread is not None:
            return
        self._stop = threading.Event()
        started = threading.Event()
        self._thread = threading.Thread(target=self._hold, args=(extra, self._stop, started),
                                        name="dgl-oac-spin-throttle", daemon=True)
        self._thread.start()
        started.wait(5.0)

    def _hold(self, extra: int, stop: threading.Event, started: threading.Event) -> None:
        # A parallel region of extra + 1 threads whose body is free(NULL), a no-op: its pool's threads stay
        # docked (asleep) until this thread exits, and libgomp counts them while they do.
        free = ctypes.cast(ctypes.CDLL(None).free, ctypes.c_void_p)
        try:
            self._lib.GOMP_parallel(free, None, extra + 1, 0)
        finally:
            started.set()
        stop.wait()

    def off(self, timeout: float = 5.0) -> None:
        thread, self._thread = self._thread, None
        if thread is not None:
            self._stop.set()
            thread.join(timeout)


class SpinPolicy:
    """For one epoch, on its caller's thread: :meth:`update` (each batch) samples the load and turns the throttle
    on or off; :meth:`close` (idempotent) turns it off. The throttle stays off where it does not apply (module
    docstring); the load is followed wherever ``/proc/stat`` is."""

    def __init__(self, cores: Iterable[int], team: Callable[[], int],
                 own_pids: Callable[[], List[int]] = list) -> None:
        cores = list(cores)
        lib = None if any(os.environ.get(v) for v in USER_POLICY) else _libgomp()
        self._team = team
        self._ncores = len(cores)
        self._load = CoreLoad(cores, own_pids)  # followed everywhere: "auto" priority settles on it too
        self._throttle = SpinThrottle(lib) if lib is not None else None
        self.throttled_windows = 0  # windows it spent throttled (for stats and tests)

    @property
    def active(self) -> bool:
        return self._throttle is not None and self._throttle.active

    def update(self) -> Optional[float]:
        """Sample the load (once a window has passed) and follow it; returns the other processes' cores, or
        None (no new window, or not applicable)."""
        others = self._load.others()
        if others is None or self._throttle is None:
            return others
        if self.active:
            self.throttled_windows += 1
            if others < OFF_BELOW:
                self._throttle.off()
        elif others >= ON_AT and self._team() > 1:
            # libgomp counts the initial thread and each team's pool; the caller's team of T threads makes T:
            # this many more put the count above the cores it found at start (the affinity, as here)
            self._throttle.on(max(1, self._ncores - self._team() + 1))
        return others

    def close(self) -> None:
        if self._throttle is not None:
            self._throttle.off()


class LoadMonitor:
    """:class:`SpinPolicy` for a whole program, on a thread of its own that samples every :data:`WINDOW_S`
    (``dgl-oac train``: its evaluations run outside any epoch). A context manager: the thread and the throttle
    end on exit."""

    def __init__(self, cores: Iterable[int], team: int) -> None:
        self._policy = SpinPolicy(cores, lambda: team)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="dgl-oac-load-monitor", daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(WINDOW_S):
            self._policy.update()

    def __enter__(self) -> "LoadMonitor":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5.0)
        self._policy.close()


# ---- How dgl-oac's threads share the cores: the caller's team, background priority and OpenMP teams

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
    (:mod:`dgl_oac.engine.runtime`), and the caller's forward and backward slow down while such a thread lives
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
    manager is entered (:mod:`dgl_oac.engine.runtime`)."""
    return LoadMonitor(_affinity(), torch.get_num_threads())


class CallerCores:
    """Applies the rule for one epoch on the thread that made it (its caller): :meth:`share` when it starts,
    :meth:`update` at each batch (libgomp's spin-wait, cut short while another process is busy on our cores:
    :mod:`dgl_oac.engine.runtime`), :meth:`restore` when it ends (idempotent).

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
        """Between batches, on the owner's thread: follow the load on our cores (:mod:`dgl_oac.engine.runtime`).
        Returns whether a window just showed them free of other processes (``"auto"`` threads may go idle)."""
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
    :mod:`dgl_oac.engine.runtime` shows no other process busy on our cores. An idle thread beside a busy process
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


# ---- The contract every background thread of dgl-oac follows, in one helper

WAIT_S = 1.0  # longest sleep of a blocked put/get between checks that its producer is alive (a safety net:
# the stop event and the queue wake them at once)
POLL_S = 0.05  # re-check interval of the write-back's waits on a thread that may die (engine/table.py)

_LIVE: "weakref.WeakSet[Worker]" = weakref.WeakSet()  # every started Worker, for the exit hook below


@atexit.register
def _close_all_at_exit() -> None:
    """Stop every background stage before the interpreter finalizes.

    A daemon thread still inside a torch or DGL call while the interpreter tears down its C++ runtime aborts
    the process (``terminate called without an active exception``, exit 134). Owners close their threads
    when they close or die; this hook covers what is still referenced at exit (a loader left in a module-level
    variable after a ``break``). Sinks (write-backs) apply what they hold first: committed steps are kept.
    """
    workers = list(_LIVE)
    for w in sorted(workers, key=lambda w: w.sink):  # gathers first, then the write-backs they feed
        w.close(drain=w.sink)


class End:
    """End-of-data marker travelling through a queue."""


END = End()


class Failure:
    """An exception raised in a background thread, carried to the caller with its original traceback."""

    def __init__(self, exc: BaseException, where: str) -> None:
        self.exc = exc
        self.where = where
        if hasattr(exc, "add_note"):  # Python >= 3.11: say where (once, however often it is re-raised)
            exc.add_note(f"(raised in dgl-oac background stage '{where}')")

    def reraise(self) -> None:
        raise self.exc  # the original exception object: its type and traceback frames are kept


class Stopped(RuntimeError):
    """A put or get gave up because its stage is closing."""


class StopEvent(threading.Event):
    """A stop event that wakes every :func:`put` and :func:`get` blocked on ``queues`` when it is set."""

    def __init__(self, *queues: "queue.Queue[Any]") -> None:
        super().__init__()
        self._queues = queues

    def set(self) -> None:
        super().set()
        for q in self._queues:
            with q.mutex:
                q.not_empty.notify_all()
                q.not_full.notify_all()


def _check_stop(q: "queue.Queue[Any]", stop: StopEvent) -> None:
    if q not in stop._queues:
        raise ValueError("put/get on a queue its StopEvent does not wake: build it as StopEvent(queue, ...)")


def put(q: "queue.Queue[Any]", item: Any, stop: StopEvent) -> None:
    """Put into a bounded queue; blocks until a slot is free, or gives up with :class:`Stopped` once ``stop`` is
    set (it wakes this call)."""
    _check_stop(q, stop)
    with q.not_full:
        while True:
            if stop.is_set():
                raise Stopped("stage stopped")
            if q.maxsize <= 0 or q._qsize() < q.maxsize:
                break
            q.not_full.wait(WAIT_S)
        q._put(item)
        q.unfinished_tasks += 1
        q.not_empty.notify()


def get(q: "queue.Queue[Any]", stop: StopEvent, alive: Optional[Callable[[], bool]] = None,
        what: str = "queue") -> Any:
    """Get from a queue; blocks until an item arrives, or gives up once ``stop`` is set (it wakes this call) or
    the producer died without saying so (noticed within :data:`WAIT_S`; a producer that fails puts a Failure
    first, which is returned)."""
    _check_stop(q, stop)
    with q.not_empty:
        while not q._qsize():
            if stop.is_set():
                raise Stopped(f"{what}: stage stopped")
            if alive is not None and not alive():
                raise RuntimeError(f"{what}: producer thread ended without a result")
            q.not_empty.wait(WAIT_S)
        item = q._get()
        q.not_full.notify()
        return item


class Worker:
    """One background stage: inbox -> fn -> outbox, on a named daemon thread (``priority``: see
    :func:`set_thread_priority`; ``threads``: the OpenMP team of its torch ops, :func:`thread_team`)."""

    def __init__(self, name: str, fn: Callable[[Any], Any], inbox_size: int, outbox_size: int,
                 sink: bool = False, priority: str = "normal", threads: int = 1) -> None:
        self.name = name
        self.priority = priority
        self.threads = threads
        self.sink = sink  # a sink's results are dropped; only END and failures reach the outbox
        self._fn = fn
        self.inbox: "queue.Queue[Any]" = queue.Queue(maxsize=inbox_size)
        self.outbox: "queue.Queue[Any]" = queue.Queue(maxsize=outbox_size)
        self.stop = StopEvent(self.inbox, self.outbox)
        self._drain = False  # close(drain=True) from the thread itself: stop once the inbox is empty
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()
        _LIVE.add(self)

    def _run(self) -> None:
        set_thread_priority(self.priority)
        thread_team(self.threads)
        try:
            while True:
                item = get(self.inbox, self.stop, what=self.name)
                if self.stop.is_set():
                    return
                if item is END:
                    put(self.outbox, END, self.stop)
                    return
                out = self._fn(item)
                if not self.sink:
                    put(self.outbox, out, self.stop)
                if self._drain and self.inbox.empty():
                    return
        except Stopped:
            return
        except BaseException as exc:  # noqa: BLE001 - everything travels to the caller
            try:
                put(self.outbox, Failure(exc, self.name), self.stop)
            except Stopped:
                pass

    def submit(self, item: Any) -> None:
        put(self.inbox, item, self.stop)

    def result(self, due: Optional[Callable[[Any], bool]] = None) -> Any:
        """Next output; re-raises a stage failure in the caller; END at end of data.

        ``due(item)``: whether ``item`` is the one whose output is next. When it still waits in the inbox (the
        thread has not taken it), it runs on the calling thread instead: at idle priority beside a busy process
        the stage's thread gets a core only while its caller waits, so waiting for it would leave the caller's
        core idle until the scheduler hands it over. The output is the same (the stage's function, in order);
        the items behind it are held back meanwhile, so the function never runs on two threads at once."""
        if due is not None:
            ahead = self._take_due(due)
            if ahead is not None:
                try:
                    out = self._fn(ahead[0])
                except BaseException as exc:
                    Failure(exc, f"{self.name}, run on the caller's thread")  # as from the thread: says where
                    self.close()
                    raise
                with self.inbox.mutex:
                    self.inbox.queue.extendleft(reversed(ahead[1:]))
                    if ahead[1:]:
                        self.inbox.not_empty.notify()
                return out
        out = get(self.outbox, self.stop, alive=self._thread.is_alive, what=self.name)
        if isinstance(out, Failure):
            self.close()
            out.reraise()
        return out

    def _take_due(self, due: Callable[[Any], bool]) -> Optional[List[Any]]:
        """Every queued item, when the first is due and the thread has not taken it (else None, nothing taken)."""
        if self.sink or self.stop.is_set() or not self.outbox.empty():
            return None
        with self.inbox.mutex:
            queued = self.inbox.queue
            if not queued or queued[0] is END or not due(queued[0]):
                return None
            items = list(queued)
            queued.clear()
            self.inbox.not_full.notify_all()
        return items

    def alive(self) -> bool:
        return self._thread.is_alive()

    def go_idle(self) -> None:
        """An ``"auto"`` priority thread: idle from now on (:func:`~dgl_oac.engine.runtime.set_thread_priority`).
        On the owner's thread; once."""
        if self.priority == "auto" and self._thread.is_alive():
            self.priority = "idle"
            set_thread_priority("idle", self._thread.native_id)

    def on_own_thread(self) -> bool:
        return self._thread is threading.current_thread()

    def close(self, timeout: float = 5.0, drain: bool = False) -> None:
        """Stop the thread and drop queued items (with ``drain``, run them first). Idempotent."""
        if drain and self._thread.is_alive() and not self.stop.is_set():
            if self._thread is threading.current_thread():  # a finalizer running on this thread: end later
                self._drain = True
                return
            while self._thread.is_alive():  # END after the queued items: they run first
                try:
                    self.inbox.put(END, timeout=WAIT_S)
                    break
                except queue.Full:
                    continue
            self._thread.join(timeout)
        self.stop.set()  # wakes the thread if it waits on either queue
        for q in (self.inbox, self.outbox):
            while True:
                try:
                    q.get_nowait()
                except queue.Empty:
                    break
        if self._thread is not threading.current_thread():
            self._thread.join(timeout)
            if self._thread.is_alive():
                # A warning, not an error: close() often runs while another exception (Ctrl-C, a failed step)
                # propagates, which must not be replaced. The daemon thread exits once its current item ends.
                warnings.warn(f"background stage {self.name} did not stop within {timeout}s (still inside "
                              f"{getattr(self._fn, '__qualname__', 'its function')}); it exits after that item",
                              RuntimeWarning, stacklevel=2)
