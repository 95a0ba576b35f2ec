"""libgomp's spin-wait, cut short while another process is busy on this process's cores.

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
"""
from __future__ import annotations

import ctypes
import functools
import os
import threading
import time
from typing import Callable, Iterable, List, Optional, Tuple

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
