"""Reads of a table: each one opens at the current version and closes exactly once.

A read holds back the write log's horizon while it is open (:class:`~dgl_oac.engine.oac.VersionClock`): the
log keeps every step it can miss. It is opened by the gather (on the gather thread, or on the caller's thread
in sync mode and for ``emb(ids)``), carried by its batch as a :class:`ReadTicket`, and closed at hand-out, when
its batch is released, or when the gather fails, whichever comes first (any thread: the close is idempotent,
under this owner's lock). A distributed table (``dist``) also registers each read with the rows' owners
(``dist.registry``: :mod:`dgl_oac.distributed.inflight`) and deregisters it with the close.
"""
from __future__ import annotations

import threading
from typing import Any

import torch

from .oac import VersionClock


class ReadTicket:
    """One open read: its version ``rv`` and its registration (distributed; else None). Immutable; only its
    :class:`Reads` closes it."""

    __slots__ = ("rv", "registration", "_open")

    def __init__(self, rv: int, registration: Any) -> None:
        self.rv = rv
        self.registration = registration
        self._open = True

    @property
    def open(self) -> bool:
        return self._open


class Reads:
    """The reads of one table (see the module docstring)."""

    def __init__(self, clock: VersionClock, dist: Any = None) -> None:
        self.clock = clock
        self.dist = dist
        self._lock = threading.Lock()

    def open(self, ids: torch.Tensor, register: bool = True) -> ReadTicket:
        """Open a read of ``ids: int64[n], CPU`` at the current version (distributed: registered with the rows'
        owners; this waits while a step runs)."""
        if self.dist is None:
            return ReadTicket(self.clock.begin_read(), None)
        return ReadTicket(*self.dist.registry.open_read(self.clock, ids, register))

    def close(self, ticket: ReadTicket) -> bool:
        """Close ``ticket``'s read once; later calls do nothing. Any thread. Returns whether this call closed it
        (what a gathered batch never handed out owns goes back with that call alone)."""
        with self._lock:
            if not ticket._open:
                return False
            ticket._open = False
        self.clock.end_read(ticket.rv)
        if ticket.registration is not None:
            self.dist.registry.release(ticket.registration)
        return True

    def open_count(self) -> int:
        """Reads open now."""
        return self.clock.open_reads()
