"""Host <-> device copies and the one helper every cross-stream handoff goes through.

On CPU the copies are the identity (the gather already produced the batch's own tensor, in a pooled buffer that
comes back once the batch is committed). On CUDA:
* host -> device copies run on a side stream from pinned buffers (``non_blocking=True``); the consumer's
  stream waits on the copy with :func:`handoff` before it touches the tensor;
* device -> host copies (write-back) run on a side stream into pinned buffers and return an event that the
  write-back THREAD waits on with ``event.synchronize()`` (a host wait: ``event.wait()`` would only make a
  stream wait and the thread would read the buffer before the copy landed).
"""
from __future__ import annotations

import threading
import weakref
from typing import List, Optional, Sequence, Tuple

import torch


class BufferPool:
    """Reusable ``float32[cap, W]`` CPU buffers for the gathered rows of a CPU-device loader (thread-safe).

    A batch is ~20-40 MB: above glibc's largest mmap threshold (32 MiB), so a fresh tensor per batch is mapped,
    page-faulted in (~8k faults, 2-20 ms of kernel time here) and unmapped every step. Buffers go back with
    :meth:`give_back` once their batch is committed; one that never comes back (a dropped batch) is simply
    garbage-collected, so the pool never holds a buffer someone else still uses.
    """

    def __init__(self, keep: int = 16) -> None:
        self.keep = keep
        self._free: List[torch.Tensor] = []
        self._owned: "weakref.WeakValueDictionary[int, torch.Tensor]" = weakref.WeakValueDictionary()
        self._lock = threading.Lock()
        self.created = 0  # buffers allocated so far (steady state: no more than are in flight at once)

    def take(self, rows: int, width: int) -> torch.Tensor:
        """A ``float32[rows, width]`` view of a pooled buffer (a new one, with 25% spare rows, if none fits)."""
        with self._lock:
            for i, buf in enumerate(self._free):
                if buf.shape[0] >= rows and buf.shape[1] == width:
                    return self._free.pop(i)[:rows]
        buf = torch.empty(max(rows + rows // 4, 1), width, dtype=torch.float32)
        with self._lock:
            self._owned[id(buf)] = buf
            self.created += 1
        return buf[:rows]

    def give_back(self, view: torch.Tensor) -> None:
        """Return the buffer behind ``view`` (from :meth:`take`; anything else is ignored). Its contents are
        dead from here on: only call it once nothing reads the rows any more."""
        base = view if view._base is None else view._base
        with self._lock:
            if self._owned.get(id(base)) is base and all(b is not base for b in self._free):
                self._free.append(base)
                self._free.sort(key=lambda b: b.shape[0])
                del self._free[: max(len(self._free) - self.keep, 0)]  # keep the largest


class Transfer:
    """Copies for one device; owns the side streams (CUDA) or the row-buffer pool (CPU)."""

    def __init__(self, device: torch.device, pin: bool) -> None:
        self.device = device
        self.cuda = device.type == "cuda"
        self.pin = pin and self.cuda
        self.h2d_stream = torch.cuda.Stream(device) if self.cuda else None
        self.d2h_stream = torch.cuda.Stream(device) if self.cuda else None
        self.pool = BufferPool() if not self.cuda else None

    def host_buffer(self, rows: int, width: int) -> Optional[torch.Tensor]:
        """Where the gather writes: a pinned staging buffer (CUDA, pinned), a pooled buffer that is the batch's
        own tensor (CPU), or None (the gather allocates)."""
        if self.pin:
            return torch.empty(rows, width, dtype=torch.float32, pin_memory=True)
        return self.pool.take(rows, width) if self.pool is not None else None

    def kernel_out(self, rows: int, width: int) -> Optional[torch.Tensor]:
        """Where a commit's row kernel writes (sync, async): a pooled buffer on CPU, None (the device allocator)
        on CUDA. Given back once the rows are in the table."""
        return self.pool.take(rows, width) if self.pool is not None else None

    def recycle(self, rows: torch.Tensor) -> None:
        """Rows nothing reads any more (a committed batch's, or new rows once in the table): their pooled buffer
        (CPU) can hold a later batch. Tensors the pool did not hand out are ignored."""
        if self.pool is not None:
            self.pool.give_back(rows)

    def to_device(self, *tensors: torch.Tensor) -> Tuple[Tuple[torch.Tensor, ...], Optional[torch.cuda.Event]]:
        """Start host->device copies on the side stream; returns the device tensors and the copy's event."""
        if not self.cuda:
            return tensors, None
        with torch.cuda.stream(self.h2d_stream):
            out = tuple(t.to(self.device, non_blocking=True) for t in tensors)
            event = torch.cuda.Event()
            event.record(self.h2d_stream)
        return out, event

    def to_host(self, *tensors: torch.Tensor) -> Tuple[Tuple[torch.Tensor, ...], Optional[torch.cuda.Event]]:
        """Start device->host copies after the current stream's work; the caller's thread must ``wait_host``."""
        if not self.cuda:
            return tensors, None
        self.d2h_stream.wait_stream(torch.cuda.current_stream(self.device))  # copy after the commit kernels
        with torch.cuda.stream(self.d2h_stream):
            out = []
            for t in tensors:
                host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
                host.copy_(t, non_blocking=True)
                t.record_stream(self.d2h_stream)  # t's memory must outlive the copy on this stream
                out.append(host)
            event = torch.cuda.Event()
            event.record(self.d2h_stream)
        return tuple(out), event


def handoff(tensors: Sequence[torch.Tensor], event: Optional["torch.cuda.Event"]) -> None:
    """Producer stream -> consumer (current) stream: make the current stream wait for ``event`` (device-side,
    the host does not block) and record the tensors on it so the caching allocator does not recycle their
    memory while the consumer still uses them."""
    if event is None:
        return
    stream = torch.cuda.current_stream()
    stream.wait_event(event)
    for t in tensors:
        t.record_stream(stream)


def wait_host(event: Optional["torch.cuda.Event"]) -> None:
    """Device -> host thread: block this thread until the copies behind ``event`` have landed."""
    if event is not None:
        event.synchronize()
