"""Find the host syncs of dgl_oac's per-batch path: a ``TorchFunctionMode`` that records each call that makes
the host wait for a device, by operation and by the dgl_oac function that made it.

Recorded (on a GPU each waits for the device's queue to drain, or may):

* reading a tensor on the host: ``.item()``, ``bool(t)``, ``int(t)``, ``float(t)``, ``operator.index(t)``,
  ``format(t)``, ``.tolist()``, ``.cpu()``, ``torch.equal``/``allclose``;
* an output size that is data: ``nonzero``/``argwhere``/``masked_select``/one-argument ``where``, indexing with a
  boolean mask (read or write: a ``nonzero`` inside), ``unique``/``unique_consecutive``, ``repeat_interleave``
  without ``output_size``, ``bincount`` (its length is the largest id);
* ``segment_reduce`` without ``unsafe=True`` (ATen checks its lengths with two ``.item()``);
* a host wait on a device's event (:func:`dgl_oac.engine.transfer.wait_host`, which tells the innermost audit
  entered on its thread: :func:`~dgl_oac.engine.transfer.host_wait_listeners`);
* blocking copies: ``.to(device)``/``.cuda()`` without ``non_blocking=True``, and ``copy_`` between two devices
  without it; and, on a GPU only, a ``non_blocking`` copy to it from pageable memory, which the driver may stage
  synchronously (``"pageable copy"``).

On the CPU these calls are not syncs, which is what makes the audit run there: the same code path, the same
calls, recorded where a GPU would stall. Branches that exist only on a device run on the CPU through their
seams (``WriteLog(sync_free=True)``, :func:`dgl_oac.device.rows.on_device`). A call on CPU tensors that a GPU
run makes on CPU tensors too (the host's plan of a step) is recorded all the same: the test that pins the list
says which entries are host work.

A call counts only when a dgl_oac function (other than this module) is on the stack: the site is the innermost
one (its ``co_qualname``), e.g. ``"dgl_oac/engine/pipeline.py:TablePipeline.read_now"``. The mode is
thread-local: entered on the caller's thread, it sees ``next(loader)`` and ``opt.step()``, not the gather or
write-back threads (whose waits do not hold back the device's queue). :func:`sync_debug` is the CUDA-side check:
``torch.cuda.set_sync_debug_mode`` for a block.
"""
from __future__ import annotations

import contextlib
import os
import sys
from collections import defaultdict
from typing import Any, Dict, Iterator, List, Optional, Set, Tuple

import torch
from torch.overrides import TorchFunctionMode

from .transfer import host_wait_listeners

_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # dgl_oac/
_ROOT = os.path.dirname(_PACKAGE)
_SELF = os.path.abspath(__file__)

_ALWAYS = {
    torch.Tensor.item: "item", torch.Tensor.__bool__: "bool", torch.Tensor.__int__: "int",
    torch.Tensor.__float__: "float", torch.Tensor.tolist: "tolist", torch.Tensor.cpu: "cpu",
    torch.nonzero: "nonzero", torch.Tensor.nonzero: "nonzero", torch.argwhere: "nonzero",
    torch.Tensor.argwhere: "nonzero", torch.masked_select: "nonzero", torch.Tensor.masked_select: "nonzero",
    torch.unique: "unique", torch.Tensor.unique: "unique", torch.unique_consecutive: "unique",
    torch.Tensor.unique_consecutive: "unique", torch.Tensor.__index__: "int", torch.Tensor.__format__: "format",
    torch.equal: "equal", torch.Tensor.equal: "equal", torch.allclose: "equal", torch.Tensor.allclose: "equal",
    torch.bincount: "bincount", torch.Tensor.bincount: "bincount",
}


def _device_of(target: Any) -> Optional[torch.device]:
    """The device a ``.to(...)`` argument names, or None (a dtype, a tensor, nothing)."""
    if isinstance(target, torch.device):
        return target
    if isinstance(target, str):
        try:
            return torch.device(target)
        except RuntimeError:
            return None
    return None


def _copy_kind(func: Any, args: tuple, kwargs: Dict[str, Any]) -> str:
    """A blocking copy, or a copy to a GPU from pageable memory (module docstring), or ""."""
    if func is torch.Tensor.cuda:
        return "" if kwargs.get("non_blocking", len(args) > 2 and args[2]) else "blocking to(device)"
    if func is torch.Tensor.copy_:
        src = args[1] if len(args) > 1 else kwargs.get("src")
        blocking = not kwargs.get("non_blocking", len(args) > 2 and args[2])
        return "blocking copy_" if blocking and isinstance(src, torch.Tensor) and src.device != args[0].device \
            else ""
    if func is not torch.Tensor.to:
        return ""
    target = _device_of(kwargs.get("device", args[1] if len(args) > 1 else None))
    if target is None:
        return ""
    non_blocking = kwargs.get("non_blocking", len(args) > 3 and args[3])
    if not non_blocking:
        return "blocking to(device)"
    src = args[0]
    if target.type != "cpu" and src.device.type == "cpu" and not src.is_pinned():
        return "pageable copy"
    return ""


def _bool_index(index: Any) -> bool:
    items = index if isinstance(index, tuple) else (index,)
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in items)


def _sync_name(func: Any, args: tuple, kwargs: Dict[str, Any]) -> str:
    """The kind of host sync ``func(*args, **kwargs)`` makes on a device, or "" for none."""
    name = _ALWAYS.get(func, "")
    if name:
        return name
    if func in (torch.Tensor.__getitem__, torch.Tensor.__setitem__) and len(args) > 1 and _bool_index(args[1]):
        return "bool-mask index"
    if func is torch.where and len(args) + len(kwargs) == 1:
        return "nonzero"
    if func in (torch.repeat_interleave, torch.Tensor.repeat_interleave) and kwargs.get("output_size") is None \
            and isinstance(args[1] if len(args) > 1 else kwargs.get("repeats"), torch.Tensor):
        return "repeat_interleave"
    if func is torch.segment_reduce and not kwargs.get("unsafe", False):
        return "segment_reduce"
    return _copy_kind(func, args, kwargs)


def _site(depth: int = 2) -> str:
    """The innermost dgl_oac function on the stack from ``depth`` frames up ("" if none):
    ``"dgl_oac/x.py:Class.method"``."""
    frame = sys._getframe(depth)
    while frame is not None:
        path = os.path.abspath(frame.f_code.co_filename)
        if path.startswith(_PACKAGE + os.sep) and path != _SELF:
            return f"{os.path.relpath(path, _ROOT)}:{frame.f_code.co_qualname}"
        frame = frame.f_back
    return ""


class SyncAudit(TorchFunctionMode):
    """``with SyncAudit() as audit: ...``; then ``audit.records``: ``[(kind, site), ...]`` in call order, and
    :meth:`sites`: ``{site: {kinds}}``."""

    def __init__(self) -> None:
        super().__init__()
        self.records: List[Tuple[str, str]] = []

    def __enter__(self) -> "SyncAudit":
        host_wait_listeners().append(self._host_wait)
        return super().__enter__()

    def __exit__(self, *exc: Any) -> None:
        host_wait_listeners().remove(self._host_wait)
        super().__exit__(*exc)

    def _host_wait(self) -> None:
        """:func:`~dgl_oac.engine.transfer.wait_host` is about to block this thread on a device's event
        (``event.synchronize()``, no torch function): recorded as ``"wait"`` at the dgl_oac function that asked
        for it. Told whether or not there is an event (none on the CPU), so the CPU run records a GPU run's
        waits."""
        site = _site(3)  # _site, this method, wait_host, then its caller
        if site:
            self.records.append(("wait", site))

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        kind = _sync_name(func, args, kwargs)
        if kind:
            site = _site()
            if site:
                self.records.append((kind, site))
        return func(*args, **kwargs)

    def sites(self) -> Dict[str, Set[str]]:
        out: Dict[str, Set[str]] = defaultdict(set)
        for kind, site in self.records:
            out[site].add(kind)
        return dict(out)


@contextlib.contextmanager
def sync_debug(mode: str = "error") -> Iterator[None]:
    """CUDA: ``torch.cuda.set_sync_debug_mode(mode)`` inside the block ("error": a sync raises, "warn": it
    warns with its Python caller's line), the previous mode after."""
    before = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode(mode)
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode(before)


__all__ = ["SyncAudit", "sync_debug"]
