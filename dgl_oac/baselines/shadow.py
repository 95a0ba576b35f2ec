"""ShadowSync: dense parameters averaged across the trainers in the background every ``every`` steps, in place of
DDP's all-reduce of the gradients in every step's critical path (``dgl-oac train --dense-sync shadow``).

NOT EXACT, and not DDP: between averagings each rank steps its own dense optimizer on its own gradients (its
optimizer state, e.g. Adam's moments, is never averaged), and an averaging lands ``every`` steps after it was
started. The tables are unaffected (their sparse steps stay N-trainer sync, and oac stays bitwise equal to it).

The schedule, deterministic (no dependence on thread timing), counted in optimizer steps since the last
:meth:`ShadowSync.average`:

* after step ``n`` with ``n % every == 0``: the round started after step ``n - every`` (if any) is waited for and
  applied, ``p += mean_over_ranks(snapshot) - snapshot`` (the average replaces the snapshot, the local progress
  since it is kept); then a new round starts: ``snapshot = p``, all-reduced by a worker thread on a process group
  of its own (gloo; gloo collectives of two threads must not share a group) while the next ``every`` steps run;
* :meth:`ShadowSync.average` (the driver calls it at the end of every epoch, before rank 0 evaluates, and thus at
  the end of training): the pending round is applied, then the parameters are replaced by their mean over the
  ranks, synchronously. Every rank then holds the same parameters, bit for bit.

A round leaves the ranks' mean unchanged (the corrections sum to zero over the ranks): it acts only through the
steps taken after it lands. So with ``every`` at half the steps of an epoch or more, every round lands at the
epoch's end and the run is per-epoch averaging (up to rounding).

A rank that fails makes the others' next wait fail with :class:`.group.PeerFailure` (the worker's collective,
bounded by ``timeout``); :meth:`ShadowSync.close` stops and joins the worker and is idempotent.
"""
from __future__ import annotations

import datetime
import queue
import threading
from typing import Iterable, List, Optional, Union

import torch
import torch.distributed as dist

from ..distributed.group import Group


class ShadowSync:
    """Background averaging of ``params`` (the dense optimizer's parameters; equal on every rank at the start)
    every ``every`` steps over ``group``'s ranks. Collective to construct (it makes a gloo process group for its
    worker thread), collective to call :meth:`after_step` and :meth:`average`: every rank calls them equally
    often. ``timeout``: seconds one averaging may take before the ranks give up (:class:`.group.PeerFailure`)."""

    def __init__(self, params: Iterable[torch.Tensor], group: Group, every: int, timeout: float = 300.0) -> None:
        if not isinstance(every, int) or isinstance(every, bool) or every < 1:
            raise ValueError(f"ShadowSync: every must be a positive integer (steps between averagings), got {every!r}")
        if not timeout > 0:
            raise ValueError(f"ShadowSync: timeout must be positive seconds, got {timeout!r}")
        self.params: List[torch.Tensor] = [p for p in params if p.requires_grad]
        if not self.params:
            raise ValueError("ShadowSync: no parameter that requires grad to average")
        self.every, self.timeout, self.world = every, timeout, group.world
        self.rounds = 0  # averagings started (each one collective on the worker's group)
        self._steps = 0  # optimizer steps since the last average()
        self._pending: Optional[torch.Tensor] = None  # the snapshot whose round is in flight: float32[sum numel], CPU
        self._group = Group(dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=timeout)))
        # one round in flight at a time: the main thread takes a result before it submits the next snapshot
        self._inbox: "queue.Queue[torch.Tensor]" = queue.Queue(maxsize=1)
        self._outbox: "queue.Queue[Union[torch.Tensor, BaseException]]" = queue.Queue(maxsize=1)
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = threading.Thread(
            target=self._serve, name=f"dgl-oac-shadow-sync-rank{group.rank}", daemon=False)
        self._thread.start()

    def _serve(self) -> None:
        """Worker: all-reduce each submitted snapshot into the mean over the ranks; an error ends the worker and
        goes to the main thread through the outbox."""
        while not self._stop.is_set():
            try:
                flat = self._inbox.get(timeout=0.1)
            except queue.Empty:
                continue
            try:
                self._group.all_reduce(flat, what=f"shadow sync: dense parameters, round {self.rounds}",
                                       kind="dense")
                self._outbox.put(flat.div_(self.world))
            except BaseException as exc:  # noqa: BLE001 - re-raised on the main thread
                self._outbox.put(exc)
                return

    def _snapshot(self) -> torch.Tensor:
        """The parameters, concatenated: float[sum numel], CPU (gloo's device; CUDA parameters are copied)."""
        with torch.no_grad():
            return torch.cat([p.detach().reshape(-1).to("cpu") for p in self.params])

    def _start(self) -> None:
        if self._thread is None:
            raise RuntimeError("ShadowSync is closed")
        self._pending = self._snapshot()
        self.rounds += 1
        self._inbox.put(self._pending.clone())  # the worker averages the copy in place

    def _result(self) -> torch.Tensor:
        """The mean over the ranks of the pending snapshot (waits for the worker; its error is raised here)."""
        while True:
            try:
                got = self._outbox.get(timeout=0.1)
                break
            except queue.Empty:
                if self._thread is None or not self._thread.is_alive():
                    raise RuntimeError("ShadowSync's worker thread is gone with a round in flight") from None
        if isinstance(got, BaseException):
            raise got
        return got

    def _apply(self, values: torch.Tensor, replace: bool) -> None:
        """``p = values`` (``replace``) or ``p += values - snapshot`` (a round applied late), per parameter."""
        delta = values if replace else values - self._pending
        self._pending = None
        with torch.no_grad():
            for p, d in zip(self.params, delta.split([p.numel() for p in self.params])):
                d = d.view_as(p).to(p.device)
                if replace:
                    p.copy_(d)  # not p + (mean - p): its rounding would differ between the ranks
                else:
                    p.add_(d)

    def after_step(self) -> None:
        """Call after every dense optimizer step (every rank, every step, the skipped ones included)."""
        self._steps += 1
        if self._steps % self.every:
            return
        if self._pending is not None:
            self._apply(self._result(), replace=False)
        self._start()

    def average(self) -> None:
        """Apply the pending round, then make every rank's parameters their mean over the ranks, synchronously:
        afterwards they are equal on every rank, bit for bit. The step count restarts."""
        if self._pending is not None:
            self._apply(self._result(), replace=False)
        self._start()
        self._apply(self._result(), replace=True)
        self._steps = 0

    def close(self) -> None:
        """Stop and join the worker (idempotent). A round in flight ends first, within ``timeout``."""
        thread, self._thread = self._thread, None
        if thread is None:
            return
        self._stop.set()
        thread.join(timeout=self.timeout + 5.0)
        if thread.is_alive():
            raise RuntimeError(f"ShadowSync's worker {thread.name} did not stop within {self.timeout + 5.0:.0f}s")
