"""Host <-> device copies and the one helper every cross-stream handoff goes through.

On CPU every function here is the identity (the gather already produced the batch's own tensor). On CUDA:
* host -> device copies run on a side stream from pinned buffers (``non_blocking=True``); the consumer's
  stream waits on the copy with :func:`handoff` before it touches the tensor;
* device -> host copies (write-back) run on a side stream into pinned buffers and return an event that the
  write-back THREAD waits on with ``event.synchronize()`` (a host wait: ``event.wait()`` would only make a
  stream wait and the thread would read the buffer before the copy landed).
"""
from __future__ import annotations

from typing import Optional, Sequence, Tuple

import torch


class Transfer:
    """Copies for one device; owns the side streams."""

    def __init__(self, device: torch.device, pin: bool) -> None:
        self.device = device
        self.cuda = device.type == "cuda"
        self.pin = pin and self.cuda
        self.h2d_stream = torch.cuda.Stream(device) if self.cuda else None
        self.d2h_stream = torch.cuda.Stream(device) if self.cuda else None

    def host_buffer(self, rows: int, width: int) -> Optional[torch.Tensor]:
        """A pinned staging buffer for the gather, or None (gather allocates) on CPU."""
        if not self.pin:
            return None
        return torch.empty(rows, width, dtype=torch.float32, pin_memory=True)

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
