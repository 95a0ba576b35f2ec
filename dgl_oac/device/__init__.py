"""Row operations whose torch form differs on a CUDA device, in one place (``rows.py``).

The counterpart of :mod:`dgl_oac.native` (the CPU's compiled row ops): each device path returns None where it does
not apply (a CPU tensor), and the function the engine calls runs it where it applies and the CPU's torch op
otherwise, so no engine module branches on the device for these:

* :func:`segment_add_` / :func:`segment_sums`: a step's gradients summed per row. On a device ``index_add_`` with
  repeated indices uses atomics (the sum's order, so its bits, vary); the device path sorts the occurrences
  (stably) and sums them by segment in occurrence order, with no size that depends on the data (no host
  sync). On the CPU, ``index_add_`` / ``embedding_bag``, serial in occurrence order too.
* :func:`read_counts`: a read's occurrence counts, counted again on a device (a copy would cost more).
* :func:`gather_rows`: ``index_select`` with ``F.embedding``'s backward (a fixed summation order on CUDA).

:func:`dgl_oac.device.rows.on_device` is the one test seam (patch it there; it is not re-exported here, so no
second name escapes a patch): patched to True, the device paths run on CPU tensors (the sync audit,
and their equality with the CPU path). Transfer scheduling (streams, events, pinned buffers) stays in
:mod:`dgl_oac.engine.transfer`, behind its own seam (``CudaStreams``). Imports nothing else of dgl_oac.
"""
from .rows import (gather_rows, occurrences, read_counts, segment_add_, segment_sums, sorted_segment_add_,
                   sorted_segment_sums)

__all__ = ["occurrences", "segment_add_", "segment_sums", "read_counts", "gather_rows", "sorted_segment_add_",
           "sorted_segment_sums"]
