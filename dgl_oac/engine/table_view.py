"""``emb.weight``: a read-only view of a :class:`~dgl_oac.NodeEmbedding`'s table.

Why read-only (``dgl.nn.NodeEmbedding.weight`` is writable): a batch read ahead (oac, async) holds rows copied
from the table before a write, and the write log only knows the writes that went through a step. An in-place
write through ``emb.weight`` (a TransE-style max-norm renormalisation, say) bypasses both, so the batches in
flight keep the old rows and oac silently stops being equal to sync, by how much depending on thread timing.
So a write through the view raises at once, naming the supported way, ``emb.write_rows(ids, values)``: a logged
step like an optimizer's (clock, log, write-back), which every mode applies in step order, exactly.

Everything that only reads works as on a plain tensor, and whatever does not share the table's memory (an
``index_select``, ``clone()``, ``.to("cuda")``, arithmetic) is a plain tensor. Views of the table (slices,
``.data``, ``detach()``, ``view``) stay read-only, and ``numpy()`` gives a read-only array.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, Optional, Tuple

import torch

#: In-place methods that change no element of the table.
_HARMLESS = frozenset({"requires_grad_", "retain_grad"})
_INPLACE_DUNDERS = frozenset({"__setitem__", "__iadd__", "__isub__", "__imul__", "__itruediv__", "__ifloordiv__",
                              "__imod__", "__ipow__", "__iand__", "__ior__", "__ixor__", "__ilshift__",
                              "__irshift__", "__imatmul__"})


def _writes(name: str) -> bool:
    if name in _INPLACE_DUNDERS:
        return True
    return name.endswith("_") and not name.startswith("__") and name not in _HARMLESS


class TableView(torch.Tensor):
    """A tensor sharing a table's memory that refuses in-place writes (see the module docstring)."""

    _oac_what: str = "the table"

    @classmethod
    def __torch_function__(cls, func: Callable, types: Tuple[type, ...], args: Tuple[Any, ...] = (),
                           kwargs: Optional[Dict[str, Any]] = None) -> Any:
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        views = [a for a in args if isinstance(a, TableView)]
        out_arg = kwargs.get("out")
        if (args and isinstance(args[0], TableView) and _writes(name)) or _aliases(out_arg, views):
            raise RuntimeError(_refusal(views[0]._oac_what if views else "the table", name))
        with torch._C.DisableTorchFunctionSubclass():
            out = func(*args, **kwargs)
        if name in ("numpy", "__array__") and hasattr(out, "flags"):
            out.flags.writeable = False
            return out
        return _protect(out, views)

    def plain(self) -> torch.Tensor:
        """The same memory as a plain tensor (no check: for this module and ``repr``)."""
        with torch._C.DisableTorchFunctionSubclass():
            return torch.Tensor.as_subclass(self, torch.Tensor)

    def __reduce_ex__(self, proto: Any) -> Any:
        """Saved as a plain tensor (``torch.load(..., weights_only=True)`` knows no subclass)."""
        with torch._C.DisableTorchFunctionSubclass():
            return torch.Tensor.__reduce_ex__(self.plain(), proto)

    def __deepcopy__(self, memo: Dict[int, Any]) -> torch.Tensor:
        """A copy is the caller's own (a plain tensor), e.g. ``best = copy.deepcopy(emb.weight)``."""
        out = self.plain().clone()
        memo[id(self)] = out
        return out

    def __repr__(self, **kwargs: Any) -> str:
        return repr(self.plain())


def _shares(t: Any, views: "list[TableView]") -> bool:
    if not isinstance(t, torch.Tensor) or t.device.type != "cpu":
        return False
    with torch._C.DisableTorchFunctionSubclass():
        ptr = t.untyped_storage().data_ptr()
        return any(ptr == v.untyped_storage().data_ptr() for v in views)


def _aliases(out: Any, views: "list[TableView]") -> bool:
    if isinstance(out, (list, tuple)):
        return any(_aliases(o, views) for o in out)
    return isinstance(out, TableView) or _shares(out, views)


def _protect(out: Any, views: "list[TableView]") -> Any:
    """Outputs sharing the table's memory become read-only views too; the rest stay plain tensors."""
    if type(out) in (list, tuple):  # not torch.Size or named tuples
        return type(out)(_protect(o, views) for o in out)
    if views and _shares(out, views):
        return read_only(out, views[0]._oac_what)
    return out


def _refusal(what: str, op: str) -> str:
    return (f"{what} is read-only ({op} would write to it): a write there bypasses dgl_oac's step clock and write "
            f"log, so batches read ahead would keep the old rows and oac would no longer equal sync. Write rows "
            f"with emb.write_rows(ids, values), a logged step (e.g. a max-norm renormalisation: "
            f"emb.write_rows(ids, emb.weight[ids].renorm(2, 0, max_norm))), or replace the whole table with "
            f"emb.load_state_dict(...) / emb.all_set_embedding(...)")


def read_only(t: torch.Tensor, what: str) -> TableView:
    """``t`` (a view of a table: no copy) as a :class:`TableView`; ``what`` names it in the error message."""
    with torch._C.DisableTorchFunctionSubclass():
        view = torch.Tensor.as_subclass(t, TableView)
    view._oac_what = what
    return view
