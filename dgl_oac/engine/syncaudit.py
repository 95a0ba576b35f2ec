"""Find the host syncs of dgl_oac's per-batch path: a ``TorchFunctionMode`` that records each call that makes
the host wait for a device, by operation and by the dgl_oac function that made it.

Recorded (on a GPU each waits for the device's queue to drain): ``.item()``, ``bool(t)``, ``int(t)``,
``float(t)``, ``.tolist()``, ``.cpu()``, ``nonzero``/``argwhere``/``masked_select``/one-argument ``where``,
indexing with a boolean mask (read or write: a ``nonzero`` inside), ``unique``/``unique_consecutive`` (the size
of the result is data), ``repeat_interleave`` without ``output_size``, and ``.to(device)`` without
``non_blocking=True`` (a blocking copy). On the CPU these calls are not syncs, which is what makes the audit
run there: the same code path, the same calls, recorded where a GPU would stall.

A call counts only when a dgl_oac function (other than this module) is on the stack: the site is the innermost
one, ``"dgl_oac/engine/commit.py:Commit.apply"``. The mode is thread-local: entered on the caller's thread, it sees
``next(loader)`` and ``opt.step()``, not the gather or write-back threads (whose waits do not hold back the
device's queue). :func:`sync_debug` is the CUDA-side check: ``torch.cuda.set_sync_debug_mode`` for a block.
"""
from __future__ import annotations

import contextlib
import os
import sys
from collections import defaultdict
from typing import Any, Dict, Iterator, List, Set, Tuple

import torch
from torch.overrides import TorchFunctionMode

_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # dgl_oac/
_ROOT = os.path.dirname(_PACKAGE)
_SELF = os.path.abspath(__file__)

_ALWAYS = {
    torch.Tensor.item: "item", torch.Tensor.__bool__: "bool", torch.Tensor.__int__: "int",
    torch.Tensor.__float__: "float", torch.Tensor.tolist: "tolist", torch.Tensor.cpu: "cpu",
    torch.nonzero: "nonzero", torch.Tensor.nonzero: "nonzero", torch.argwhere: "nonzero",
    torch.Tensor.argwhere: "nonzero", torch.masked_select: "nonzero", torch.Tensor.masked_select: "nonzero",
    torch.unique: "unique", torch.Tensor.unique: "unique", torch.unique_consecutive: "unique",
    torch.Tensor.unique_consecutive: "unique",
}


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
    if func is torch.Tensor.to and not kwargs.get("non_blocking", False):
        target = kwargs.get("device", args[1] if len(args) > 1 else None)
        if isinstance(target, (str, torch.device)) and not (len(args) > 3 and args[3]):
            return "blocking to(device)"
    return ""


def _site() -> str:
    """The innermost dgl_oac function on the stack ("" if none): ``"dgl_oac/x.py:Class.method"``."""
    frame = sys._getframe(2)
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
