"""Pulling a :class:`dgl_oac.BatchLoader`'s source on a background thread (``BatchLoader(pull_thread=True)``).

On the caller's thread, the source's own work for a batch (a ``collate_fn`` that builds pairs, random walks,
negatives) runs between two training steps and is never overlapped with one. :class:`SourceThread` runs it on a
named daemon thread (:class:`dgl_oac.engine.runtime.Worker`: bounded queues, a stop event, timeouts on every wait,
the source's exceptions travelling through the queue with their traceback, an idempotent ``close()``), up to
:data:`PULL_AHEAD` batches before the epoch asks for them; the epoch takes them in order, as it took them from the
caller's thread. The epoch's resources own it: every way an epoch ends closes it (:mod:`dgl_oac.loading.epoch`).

Why it is opt-in. On the caller's thread a pull runs inside the source's own generator states
(:class:`dgl_oac.loading.iterable_source.SourceRNG`), swapped in and out around it. Those generators (torch's CPU
generator, ``random``, numpy's global one) are process-wide: on another thread the swap would hand the source's
states to the training loop's draws (dropout) whenever both run at once, and DGL's RNG is per thread (a new
thread's is seeded from the OS). So on the thread no state is swapped, and the batch stream is a function of
``seed`` only for a source that draws from generators of its own (a ``torch.Generator``, ``random.Random`` or
numpy ``Generator`` it holds, or none). Its ``iter()`` still runs on the caller's thread inside the source's
states (a torch ``DataLoader`` draws its workers' base seed there), so a torch ``DataLoader`` with
``num_workers > 0`` qualifies.
"""
from __future__ import annotations

from typing import Any, Iterator

from ..engine.runtime import Worker, busy_at

#: Batches the thread pulls before the epoch asks for them: two absorb a source whose batches vary in cost; more
#: would only hold memory (the epoch itself pulls up to its prefetch depth ahead of the batch handed out).
PULL_AHEAD = 2
#: How long ``close()`` waits for a pull in progress to end (a source's ``next()`` cannot be interrupted): past
#: it, a warning, and the daemon thread ends after that pull.
CLOSE_S = 2.0


class SourceThread:
    """Pulls ``source`` (an iterator) on a daemon thread named ``name``; :meth:`get` returns its items in order,
    then ``end`` for every later call."""


    def __init__(self, source: Iterator[Any], end: Any, name: str, priority: str, first: int = 0) -> None:
        self._source, self._end = source, end
        self._exhausted = False  # set on the thread: no next() after the end
        self._requested = self._taken = first  # the batch number of the source's next item (resumed: not 0)
        self._worker = Worker(name, self._pull, PULL_AHEAD + 1, PULL_AHEAD + 1, priority=priority)
        self.cores = busy_at(priority)  # what its thread keeps from the caller's team (dgl_oac.engine.runtime)

    def _pull(self, _request: Any) -> Any:
        if self._exhausted:
            return self._end
        item = next(self._source, self._end)
        self._exhausted = item is self._end
        return item

    def get(self, b: int) -> Any:
        """Item ``b`` (the next one: items are taken in order), or ``end``; an exception the source raised for it
        is raised here, with its traceback."""
        if b != self._taken:
            raise RuntimeError(f"SourceThread: batch {b} asked for, batch {self._taken} is next")
        while self._requested <= b + PULL_AHEAD:
            self._worker.submit(None)
            self._requested += 1
        out = self._worker.result()
        self._taken += 1
        return out

    def alive(self) -> bool:
        return self._worker.alive()

    def close(self, timeout: float = CLOSE_S) -> None:
        """Stop the thread, drop the items pulled ahead. Idempotent; returns within ``timeout`` (see
        :data:`CLOSE_S`)."""
        self._worker.close(timeout)
