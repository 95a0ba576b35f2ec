"""Whether the other ranks are alive: a heartbeat through the rendezvous store, and collective waits that watch it.

A rank whose machine loses power, is cut off by the network or freezes keeps its peers' sockets open: their gloo
collectives would block until the process group's timeout (30 min by default) and name nobody. So every rank of a
:class:`~dgl_oac.distributed.group.Group` runs a :class:`Liveness` monitor:

- its heartbeat thread (``dgl-oac-liveness-r<rank>``) writes, every ``interval`` s, a counter of its own to the
  store ``init_process_group`` made (a FileStore for ``file://``, the TCPStore of ``torchrun``'s agent or of
  ``tcp://``), through a client of its own, and reads every other rank's counter: one ``set`` and one
  ``multi_get`` of ``world - 1`` short keys a beat, nothing on the training thread;
- a peer whose counter has not moved across reads that span more than ``bound`` s of this rank's own clock is
  declared dead (no clock is compared across machines, and a pause of this rank's own thread declares nobody:
  staleness is measured between two of its own reads);
- a store that has failed every read for more than ``bound`` s is declared unreachable (its host is down, or this
  rank is cut off from it);
- :meth:`Liveness.wait` waits on a collective's work in slices of ``interval`` s (the work's own timed wait: a
  collective that completes returns as fast as a blocking one) and returns the verdict as soon as there is one.

The verdict only ends waits that are blocked anyway: a slow peer (a long step, a long evaluation) whose heartbeat
thread runs is never declared dead. ``bound``: :func:`peer_timeout`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional

import datetime
import math
import os
import socket
import threading
import time
import weakref

import torch.distributed as dist

ENV = "DGL_OAC_PEER_TIMEOUT"
DEFAULT_BOUND = 10.0  # seconds: well above a GC pause or a busy 2-core machine, far below a collective timeout


def peer_timeout(env: Optional[Mapping[str, str]] = None) -> Optional[float]:
    """Seconds a peer's heartbeat may stay silent before it is declared dead: ``$DGL_OAC_PEER_TIMEOUT``, else
    :data:`DEFAULT_BOUND`; None (no monitor) for ``0``."""
    env = os.environ if env is None else env
    raw = env.get(ENV, "").strip()
    if not raw:
        return DEFAULT_BOUND
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (value >= 0 and math.isfinite(value)):
        raise ValueError(f"{ENV}={raw!r}: expected seconds > 0 (how long a silent peer is tolerated before it is "
                         "declared dead), or 0 to turn the liveness monitor off")
    return value or None


def _gone(pid: int) -> bool:
    """The process ``pid`` has exited (a zombie its parent has not reaped yet counts as exited)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True
    except OSError:  # no /proc: ask the kernel
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            pass
        return False


def exited(peers: List[Any], rank: int, wait: float = 1.0) -> List[int]:
    """Ranks other than ``rank`` on this host whose process has exited, from every rank's ``(host, pid, ...)``
    (polled for up to ``wait`` s: a peer's connection closes a moment before its process is gone)."""
    host = socket.gethostname()
    local = [r for r, peer in enumerate(peers) if peer is not None and peer[0] == host and r != rank]
    deadline = time.monotonic() + wait
    while True:
        out = [r for r in local if _gone(peers[r][1])]
        if out or time.monotonic() > deadline:
            return out
        time.sleep(0.05)


# How gloo's and NCCL's transports word a peer's failure (gloo raises plain RuntimeErrors, so the type can't tell)
_PEER_WORDS = ("timed out", "timeout", "connection", "peer", "socket", "broken pipe", "nccl error", "aborted")


def from_peer(exc: BaseException) -> bool:
    """Whether a collective's error comes from the transport (a peer died, hung or failed), not this rank's call."""
    return isinstance(exc, dist.DistError) or any(w in str(exc).lower() for w in _PEER_WORDS)


@dataclass(frozen=True)
class Verdict:
    """Why a blocked collective should stop waiting; empty (false) when nothing is known to be wrong.
    ``silent``: rank -> seconds its heartbeat has not moved, only ranks past ``bound`` s. ``store``: why the
    store has not answered for longer than the bound, or None."""
    silent: Dict[int, float] = field(default_factory=dict)
    store: Optional[str] = None
    bound: float = 0.0

    def __bool__(self) -> bool:
        return bool(self.silent) or self.store is not None

    def explain(self, where: Callable[[List[int]], str]) -> str:
        """The verdict in words; ``where(ranks)`` names the ranks' hosts and machines."""
        parts = []
        if self.silent:
            ranks = sorted(self.silent)
            quiet = ", ".join(f"{self.silent[r]:.1f}" for r in ranks)
            parts.append(f"rank(s) {ranks} fell silent ({where(ranks)}): no heartbeat for {quiet} s, past the "
                         f"bound of {self.bound} s (${ENV}); its machine is down, cut off or frozen")
        if self.store is not None:
            parts.append(self.store)
        return "; ".join(parts)


def _own_client(store: Any, timeout: float) -> Any:
    """A client of ``store`` for the heartbeat thread alone, whose calls give up after ``timeout`` s (the
    default store's timeout is the collectives', minutes). A store that cannot be cloned is shared as it is."""
    try:
        client = store.clone()
    except (RuntimeError, AttributeError):  # a store type without clone(): don't change the shared one's timeout
        return store
    client.set_timeout(datetime.timedelta(seconds=timeout))
    return client


class Liveness:
    """Rank ``rank`` of ``world``'s heartbeat under ``prefix`` in ``store``, and its view of the others'.

    ``bound``: seconds of silence that declare a peer dead; ``interval``: seconds between beats (default
    ``min(1, bound / 4)``); ``alive``: whether the owner's process group still exists (the thread ends within one
    ``interval`` after it is gone, e.g. after ``destroy_process_group()``). The constructor writes this rank's
    key at once: a peer's first read, after the group's first collective, finds it. :meth:`start` starts the
    thread; :meth:`close` (idempotent) stops and joins it."""

    def __init__(self, store: Any, prefix: str, rank: int, world: int, bound: float,
                 interval: Optional[float] = None, alive: Optional[Callable[[], bool]] = None) -> None:
        if not bound > 0:
            raise ValueError(f"Liveness: bound must be positive seconds, got {bound!r}")
        self.rank, self.world, self.bound = rank, world, float(bound)
        self.interval = float(interval) if interval is not None else min(1.0, self.bound / 4)
        if not 0 < self.interval < self.bound:
            raise ValueError(f"Liveness: interval must be in (0, bound={bound}) seconds, got {interval!r}")
        self._store = _own_client(store, self.bound)
        self._key = f"{prefix}/{rank}"
        self._others: List[int] = [r for r in range(world) if r != rank]
        self._other_keys = [f"{prefix}/{r}" for r in self._others]
        self._alive = alive if alive is not None else (lambda: True)
        self._beats = 0
        self._store.set(self._key, "0")
        now = time.monotonic()
        self._lock = threading.Lock()  # guards the fields below: written by the thread, read by waiters
        self._last: Dict[int, Optional[bytes]] = {r: None for r in self._others}
        self._moved: Dict[int, float] = {r: now for r in self._others}  # when each peer's counter last changed
        self._read_at = now  # the last successful read of every counter
        self._error: Optional[str] = None  # the last failed beat's error (None once one succeeds)
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._piece = datetime.timedelta(seconds=self.interval)  # one slice of a collective's wait
        self._name = f"dgl-oac-liveness-{prefix.rsplit('/', 1)[-1]}-r{rank}"
        self._crashed: Optional[BaseException] = None  # what ended the thread other than close()

    @classmethod
    def of_group(cls, group: Any, rank: int, world: int, bound: float) -> "Liveness":
        """The monitor of process group ``group`` (None: the default one), not started: it beats under the group's
        name in the store ``init_process_group`` made, while the group exists (destroy_process_group ends it)."""
        pg = group if group is not None else dist.distributed_c10d._get_default_group()
        ref = weakref.ref(pg)  # weakly: the heartbeat must not keep the process group alive
        return cls(dist.distributed_c10d._get_default_store(), f"dgl-oac/liveness/{pg.group_name}", rank, world,
                   bound, alive=lambda: ref() is not None)

    def start(self) -> None:
        """Start beating (once). The thread is a daemon: exit runs :meth:`close` through the owner's finalizer,
        after the interpreter has joined its non-daemon threads (a non-daemon heartbeat would hold exit forever)."""
        if self._thread is None and not self._stop.is_set():
            self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
            self._thread.start()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _run(self) -> None:
        """Thread: beat every ``interval`` s until closed or the owner's process group is gone. A store error is
        recorded (the verdict reads it), never raised: the thread outlives a store that is down for a while."""
        try:
            while not self._stop.is_set() and self._alive():
                self.beat()
                if self._stop.wait(self.interval):
                    return
        except BaseException as exc:  # noqa: BLE001 - a bug: the next wait raises it on the collective's thread
            self._crashed = exc

    def beat(self) -> None:
        """One heartbeat: write this rank's counter, read the others' (the thread calls it; tests may too)."""
        self._beats += 1
        try:
            self._store.set(self._key, str(self._beats))
            values = self._store.multi_get(self._other_keys) if self._others else []
        except RuntimeError as exc:  # c10d's store errors (DistStoreError, timeouts) are RuntimeErrors
            with self._lock:
                self._error = f"{type(exc).__name__}: {exc}"
            return
        now = time.monotonic()
        with self._lock:
            for r, value in zip(self._others, values):
                if value != self._last[r]:
                    self._last[r], self._moved[r] = value, now
            self._read_at, self._error = now, None

    def verdict(self) -> Verdict:
        """The peers declared dead and whether the store is unreachable, now (cheap: no store access)."""
        now = time.monotonic()
        with self._lock:
            silent = {r: self._read_at - t for r, t in self._moved.items()
                      if self._read_at - t > self.bound}
            store = None
            if self._error is not None and now - self._read_at > self.bound:
                store = (f"the rendezvous store has not answered for {now - self._read_at:.1f} s (its host is down, "
                         f"or this rank is cut off from it): {self._error}")
        return Verdict(silent, store, self.bound)

    def wait(self, work: Any) -> Verdict:
        """Wait for ``work`` (an ``async_op=True`` collective's work on a CPU group): an empty verdict once it has
        completed (its own error, if it failed, is raised), else the verdict that ended the wait. The work is
        waited on in slices of ``interval`` s; between slices only the verdict is read."""
        while True:
            try:
                work.wait(self._piece)
                return Verdict()
            except RuntimeError:
                if work.is_completed():
                    # the collective failed (a closed connection, the process group's timeout): wait() raises its
                    # error again; or it completed just after this slice ran out: wait() returns
                    work.wait()
                    return Verdict()
            if self._crashed is not None:
                raise RuntimeError(f"{self._name}: the liveness monitor's thread failed") from self._crashed
            verdict = self.verdict()  # the slice ran out: the collective is still blocked
            if verdict:
                return verdict

    def verdict_within(self, seconds: float) -> Verdict:
        """The verdict, waiting up to ``seconds`` for one while the thread runs (after a collective failed with a
        transport error: a peer whose process died on another machine falls silent)."""
        deadline = time.monotonic() + seconds
        while True:
            verdict = self.verdict()
            if verdict or not self.running or time.monotonic() >= deadline:
                return verdict
            time.sleep(min(self.interval, max(0.0, deadline - time.monotonic())))

    def close(self) -> None:
        """Stop the heartbeat and join its thread (at most one store call's ``bound`` s); idempotent."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=self.bound + self.interval + 1.0)
