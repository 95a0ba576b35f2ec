"""dgl_oac.engine.table.write_step: a write-through (no epoch reading ahead: sync's path) copies its rows to the host
the way the write-back thread does. It goes through the transfer's pinned copy on the side stream and waits for
it on the host before the CPU write, where it used to copy into a fresh pageable tensor a step. On the CPU it is
the identity, bits and buffers as before."""
from __future__ import annotations

from typing import Any, List

import torch

from dgl_oac.engine.table import RowStore, VersionClock, write_step
from dgl_oac.engine.transfer import Transfer


class _Table:
    """A table written through: no write-back thread, no log (sync's path)."""

    def __init__(self, rows: int = 6, dim: int = 3) -> None:
        self.store, self.clock, self.steps = RowStore(rows, dim), VersionClock(), 0

    def write(self, ids: torch.Tensor, new: torch.Tensor, transfer: Any) -> int:
        step = self.steps
        write_step("t", self.store, self.clock, step, ids, ids, new, transfer, None, None)
        self.steps += 1
        return step


class _Event:
    def __init__(self, log: List[Any]) -> None:
        self.log = log

    def synchronize(self) -> None:
        self.log.append("event.synchronize")


class _DeviceTransfer:
    """A transfer whose device is "the device" (the CPU here), recording what the write path asks of it: the
    seam through which the CUDA path runs on the CPU."""

    def __init__(self) -> None:
        self.device = torch.device("cpu")
        self.log: List[Any] = []

    def to_host(self, *tensors: torch.Tensor):
        self.log.append("to_host")
        return tuple(t.clone() for t in tensors), _Event(self.log)

    def recycle(self, rows: torch.Tensor) -> None:
        self.log.append("recycle")


def test_write_through_copies_by_the_transfer_and_waits_on_the_host_before_the_cpu_write(monkeypatch):
    w = _Table()
    t = _DeviceTransfer()
    store_write = w.store.write
    monkeypatch.setattr(w.store, "write", lambda ids, rows: (t.log.append("store.write"), store_write(ids, rows)))
    ids, new = torch.tensor([4, 1]), torch.arange(6, dtype=torch.float32).reshape(2, 3)
    assert w.write(ids, new, t) == 0
    # the copy by the transfer (pinned, side stream on CUDA), a host wait on its event, then the CPU write
    assert t.log == ["to_host", "event.synchronize", "store.write", "recycle"]
    assert torch.equal(w.store.value()[ids], new) and w.clock.applied == 0


def test_rows_on_another_device_than_the_transfers_are_copied_plainly():
    w = _Table()
    t = _DeviceTransfer()
    t.device = torch.device("meta")  # a loader elsewhere; these rows came from emb(ids) on the CPU
    ids, new = torch.tensor([2]), torch.ones(1, 3)
    w.write(ids, new, t)
    assert t.log == ["recycle"] and torch.equal(w.store.value()[2], torch.ones(3))


def test_on_the_cpu_the_kernels_pooled_buffer_is_written_and_given_back_as_before():
    w = _Table()
    t = Transfer(torch.device("cpu"), False)
    new = t.kernel_out(2, w.store.width)
    new.copy_(torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]))
    ids = torch.tensor([0, 5])
    w.write(ids, new, t)
    assert torch.equal(w.store.value()[ids], new)
    assert t.kernel_out(2, w.store.width).data_ptr() == new.data_ptr()  # no copy: the same buffer came back
