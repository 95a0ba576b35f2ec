"""Host <-> device copies and the one helper every cross-stream handoff goes through.

On CPU the copies are the identity (the gather already produced the batch's own tensor, in a pooled buffer that
comes back once the batch is committed). On CUDA:
* host -> device copies run on a side stream from pinned buffers (``non_blocking=True``): a batch's rows are
  gathered straight into one, its ids are staged in one (:meth:`Transfer.staged`), so the gather thread never
  waits on a copy from pageable memory (which the driver may stage synchronously); the compute
  stream of the same device waits on the copy with :meth:`Transfer.wait_for_copy` before it touches them;
* small host tensors the caller's thread needs on the device at once (an ``emb(ids)`` read, a commit's plan)
  go through :func:`to_device_now`: pinned, ``non_blocking``, on the current stream, so the host never waits;
* device -> host copies (write-back) run on a side stream into pinned buffers and return an event that the
  write-back THREAD waits on with ``event.synchronize()`` (a host wait: ``event.wait()`` would only make a
  stream wait and the thread would read the buffer before the copy landed).

Pinned buffers come from torch's caching host allocator (:func:`pinned_empty`), a pool: a block freed while a
``non_blocking`` copy from it is queued is reused only once the copy's stream has passed it (the allocator records
the copy's stream on the block), so a buffer may be dropped right after its copy is started.
"""
from __future__ import annotations

import threading
import weakref
from typing import Any, Callable, List, Optional, Sequence, Tuple

import torch


class BufferPool:
    """Reusable ``float32[cap, W]`` CPU buffers for the gathered rows of a CPU-device loader (thread-safe).

    A batch of rows is tens of MB: above glibc's largest mmap threshold (32 MiB), so a fresh tensor per batch is
    mapped, page-faulted in and unmapped every step (costs measured in ``benchmarks/RESULTS.md``). Buffers go back with
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


def pinned_empty(shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
    """An uninitialised pinned host tensor from torch's caching host allocator (module docstring)."""
    return torch.empty(tuple(shape), dtype=dtype, pin_memory=True)


def to_device_now(device: torch.device, *tensors: torch.Tensor) -> Tuple[torch.Tensor, ...]:
    """Caller's thread: host ``tensors`` on ``device`` for the work it queues next, without a host sync. On CUDA
    each is copied into pinned memory (unless it is pinned) and from there ``non_blocking`` on the current
    stream, whose own order makes the copy land before that work runs (no event); on the CPU the identity."""
    if device.type == "cpu":
        return tensors
    return tuple((t if t.is_pinned() else t.pin_memory()).to(device, non_blocking=True) for t in tensors)


class CudaStreams:
    """The raw CUDA stream/event/pinned-memory calls of a :class:`Transfer`, in one place: the seam through which
    tests run the stream and pinned paths on CPU with a recording fake (no other line of the transfer needs a
    GPU)."""

    def new_stream(self, device: torch.device) -> Any:
        return torch.cuda.Stream(device)

    def current(self, device: torch.device) -> Any:
        return torch.cuda.current_stream(device)

    def use(self, stream: Any) -> Any:
        return torch.cuda.stream(stream)

    def new_event(self) -> Any:
        # blocking: a host wait (event.synchronize() in the write-back thread) sleeps instead of spinning a core
        # the sampler and the gather need
        return torch.cuda.Event(blocking=True)

    def record(self, tensor: torch.Tensor, stream: Any) -> None:
        tensor.record_stream(stream)

    def pinned(self, shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
        return pinned_empty(shape, dtype)


class Transfer:
    """Copies for one device; owns the side streams (CUDA, or ``streams`` given) or the row-buffer pool (CPU).
    ``pin``: stage host->device copies in pinned memory (where there are streams: CUDA, or a test's fake)."""

    def __init__(self, device: torch.device, pin: bool, streams: Optional[CudaStreams] = None) -> None:
        self.device = device
        self.streams = CudaStreams() if streams is None and device.type == "cuda" else streams
        self.pin = bool(pin) and self.streams is not None
        self.h2d_stream = self.streams.new_stream(device) if self.streams else None
        self.d2h_stream = self.streams.new_stream(device) if self.streams else None
        self.pool = BufferPool() if device.type == "cpu" else None

    def host_buffer(self, rows: int, width: int) -> Optional[torch.Tensor]:
        """Where the gather writes: a pinned staging buffer (CUDA, pinned), a pooled buffer that is the batch's
        own tensor (CPU), or None (the gather allocates)."""
        if self.pin:
            return self.streams.pinned((rows, width), torch.float32)
        return self.pool.take(rows, width) if self.pool is not None else None

    def staged(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` (host) where :meth:`to_device` copies it from without waiting: a pinned copy (pinned transfer,
        ``t`` not pinned yet; the copy is host work, on the calling thread), else ``t`` itself."""
        if not self.pin or t.is_pinned():
            return t
        return self.streams.pinned(t.shape, t.dtype).copy_(t)

    def kernel_out(self, rows: int, width: int) -> Optional[torch.Tensor]:
        """Where a commit's row kernel writes (sync, async): a pooled buffer on CPU, None (the device allocator)
        on CUDA. Given back once the rows are in the table."""
        return self.pool.take(rows, width) if self.pool is not None else None

    def recycle(self, rows: torch.Tensor) -> None:
        """Rows nothing reads any more (a committed batch's, or new rows once in the table): their pooled buffer
        (CPU) can hold a later batch. Tensors the pool did not hand out are ignored."""
        if self.pool is not None:
            self.pool.give_back(rows)

    def device_copy(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` (host) on the device, copied ``non_blocking`` from pinned memory (:meth:`staged`) on the current
        stream (a structure's tensors, inside the caller's side stream). Its handoff to compute is
        :meth:`wait_for_copy`."""
        return self.staged(t).to(self.device, non_blocking=True)

    def to_device(self, *tensors: torch.Tensor) -> Tuple[Tuple[torch.Tensor, ...], Any]:
        """Start host->device copies on the side stream; returns the device tensors and the copy's event."""
        if self.streams is None:
            return tensors, None
        with self.streams.use(self.h2d_stream):
            out = tuple(t.to(self.device, non_blocking=True) for t in tensors)  # staged by the caller
            event = self.streams.new_event()
            event.record(self.h2d_stream)
        return out, event

    def wait_for_copy(self, tensors: Sequence[torch.Tensor], event: Any) -> None:
        """Copy stream -> compute stream: make the current stream *of this transfer's device* wait for
        ``event`` (device-side; the host does not block) and record the tensors on it so the caching allocator
        does not reuse their memory while compute still reads them. The one helper every handoff of a copied
        batch to compute goes through."""
        if event is None:
            return
        stream = self.streams.current(self.device)
        stream.wait_event(event)
        for t in tensors:
            self.streams.record(t, stream)

    def to_host(self, *tensors: torch.Tensor) -> Tuple[Tuple[torch.Tensor, ...], Any]:
        """Start device->host copies after the compute stream's work; the receiving thread must
        :func:`wait_host` on the returned event before it reads them."""
        if self.streams is None:
            return tensors, None
        self.d2h_stream.wait_stream(self.streams.current(self.device))  # copy after the commit kernels
        with self.streams.use(self.d2h_stream):
            out = []
            for t in tensors:
                host = self.streams.pinned(t.shape, t.dtype) if self.pin else torch.empty(t.shape, dtype=t.dtype)
                host.copy_(t, non_blocking=True)
                self.streams.record(t, self.d2h_stream)  # t's memory must outlive the copy on this stream
                out.append(host)
            event = self.streams.new_event()
            event.record(self.d2h_stream)
        return tuple(out), event


_HOST_WAITS = threading.local()


def host_wait_listeners() -> List[Callable[[], None]]:
    """This thread's listeners of :func:`wait_host`, innermost last: a sync audit entered on the thread
    (:class:`dgl_oac.engine.syncaudit.SyncAudit`) adds one, as ``event.synchronize()`` is no torch function it
    could see."""
    if not hasattr(_HOST_WAITS, "listeners"):
        _HOST_WAITS.listeners = []
    return _HOST_WAITS.listeners


def wait_host(event: Any) -> None:
    """Device -> host thread: block this thread until the copies behind ``event`` have landed (a host sync:
    the innermost listener on this thread hears of it, also on the CPU, where there is no event)."""
    listeners = getattr(_HOST_WAITS, "listeners", None)
    if listeners:
        listeners[-1]()
    if event is not None:
        event.synchronize()
