"""Native CPU row operations: ``rowops.c``, compiled on first use, called through ctypes.

What they speed up, each bitwise equal to the torch op it replaces (``tests/native/test_native.py``):

* :func:`gather` / :func:`scatter`: a table's ``index_select`` / ``index_copy_`` of rows, with the next rows
  prefetched (random rows of a table larger than the caches: gather 1.07-1.25x, scatter 1.45-1.77x here,
  ``benchmarks/studies/row_ops.py``);
* :func:`update`: ``SparseAdagrad`` / ``SparseAdam``'s row update in two passes instead of one per op.

Every caller falls back to its torch op where they do not apply or did not build (:func:`status` says why).
"""
from .loader import status
from .rows import gather, scatter, update

__all__ = ["status", "gather", "scatter", "update"]
