"""The one write path of a table: every step, whoever makes it, in step order.

A commit of any mode (a loader's batches, ``emb(ids)`` outside a loader) and a row write
(``NodeEmbedding.write_rows``) take the next step number here, on the caller's thread. While an epoch reads
ahead (:mod:`dgl_oac.engine.leases`), the new rows are copied to the host and handed to the write-back thread,
which applies them in step order and publishes each step on the clock; without one they are written through
and published at once, copied to the host the same way (pinned, on the transfer's side stream). When a write
log exists, the step is logged (before the hand-off: what a batch read ahead can miss is in the log by the time
the batch is handed out), and entries no open read can miss are dropped after each step.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch

from .leases import Leases
from .oac import VersionClock
from .store import RowStore
from .transfer import Transfer, wait_host


class StepWriter:
    """Owner of one table's step counter and its write path (see the module docstring). Caller's thread."""

    def __init__(self, name: str, store: RowStore, clock: VersionClock, leases: Leases) -> None:
        self.name = name
        self.store = store
        self.clock = clock
        self.leases = leases
        self.steps = 0  # steps committed so far (= the next step's number)

    def kernel_out(self, n: int, transfer: Optional[Transfer]) -> Optional[torch.Tensor]:
        """Where the next step's row kernel writes ``float32[n, W]``: the log's ring (logged without a copy), a
        pooled CPU buffer, or None (allocate)."""
        if self.leases.log is not None:
            return self.leases.log.reserve(n)
        return None if transfer is None else transfer.kernel_out(n, self.store.width)

    def write(self, ids: torch.Tensor, ids_dev: torch.Tensor, new: torch.Tensor, transfer: Optional[Transfer],
              delta_from: Optional[torch.Tensor] = None,
              forwarded: Optional[Tuple[torch.Tensor, torch.Tensor]] = None,
              new_host: Optional[torch.Tensor] = None) -> int:
        """Write the next step: ``new: float32[u, W]`` (device) for unique ``ids: int64[u], CPU``; with
        ``delta_from`` (naive async) the table gets ``new - delta_from`` added instead. ``forwarded``
        (distributed): ``(ids_dev, rows)`` other owners wrote in this step, logged with it. ``new_host``: the
        same rows already on the CPU (a distributed owner's kernel ran there), written as they are instead of
        copied back from the device. Returns the step."""
        step, log, writer = self.steps, self.leases.log, self.leases.writer
        logged = (ids_dev, new) if not forwarded or not forwarded[0].numel() else \
            (torch.cat([ids_dev, forwarded[0]]), torch.cat([new, forwarded[1]]))
        if delta_from is not None and log is not None:
            raise RuntimeError(f"NodeEmbedding {self.name!r}: an async (delta) commit while an oac write log "
                               f"exists would leave the log wrong")
        payload = new if delta_from is None else torch.sub(new, delta_from, out=new)
        op = "write" if delta_from is None else "add"
        direct = new_host is not None and delta_from is None  # rows the host computed: no device -> host copy
        if writer is not None:
            # the copy starts before the log: a failure here leaves no trace
            (host,), event = ((new_host,), None) if direct else transfer.to_host(payload)
            if log is not None:
                log.append(step, *logged)
            writer.submit(step, ids, host, event, op)
        else:
            host = new_host if direct else self._to_host(payload, transfer)
            (self.store.add if op == "add" else self.store.write)(ids, host)
            if log is not None:
                log.append(step, *logged)
            self.clock.publish(step)
            if transfer is not None:
                transfer.recycle(host)
        self.steps += 1
        return step

    @staticmethod
    def _to_host(payload: torch.Tensor, transfer: Optional[Transfer]) -> torch.Tensor:
        """``payload`` on the CPU for a write-through, by the path the write-back thread takes: the transfer's
        copy into pinned memory on its side stream (a fresh pageable tensor a step is tens of MB mapped and
        page-faulted in, and a slower copy), waited for on this thread before the CPU reads it. On the CPU the
        transfer's copy is the identity: the kernel's pooled buffer itself. Rows on another device than the
        transfer's (``emb(ids, device)`` of a table a loader uses elsewhere) are copied plainly."""
        if transfer is None or payload.device != transfer.device:
            return payload.cpu()
        (host,), event = transfer.to_host(payload)
        wait_host(event)  # a host wait: the CPU write below reads the copy
        return host

    def trim(self) -> None:
        """Drop log entries no open read can miss (after releases: a committed batch's read no longer counts)."""
        if self.leases.log is not None:
            self.leases.log.drop_through(self.clock.horizon())
