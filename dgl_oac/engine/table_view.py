"""``emb.weight``: a view of a table's values that no write bypasses.

A batch read ahead (oac, async) holds rows copied from the table before a write, and the write log only knows
the writes that went through a step. An in-place write straight into the table's memory (a TransE-style
max-norm renormalisation, a ``torch.nn.init`` call) would bypass both: the batches in flight would keep the old
rows and oac would silently stop being equal to sync, by how much depending on thread timing. So a view either:

- **writes through a step** (a view made with ``table=``: ``dgl_oac.nn.Embedding.weight``, whose users initialise
  with ``torch.nn.init`` and ``weight.data``): the operation runs on a copy of the rows it covers, exactly as
  torch runs it on a plain tensor (same random draws), and the rows it changed go to the table as one logged
  step (``table.write_rows(ids, values)``), which every mode applies in step order and oac patches into the
  batches read ahead: oac equals sync with writes before, between and during epochs. The view then holds the
  new values, and the call returns the object it was given, as torch's in-place operations do;
- or **refuses** every in-place write at once, naming the supported ways (``NodeEmbedding.weight``,
  ``optm_state``: ``emb.write_rows(ids, values)``, ``load_state_dict``, ``all_set_embedding``).

Either way, ``t.data = x`` on a view is a write (a copy, for the same shape) or a refusal, never lost silently.
Everything that only reads works as on a plain tensor, and whatever does not share the table's memory (an
``index_select``, ``clone()``, ``.to("cuda")``, arithmetic) is a plain tensor. Views of the table (slices,
``.data``, ``detach()``, ``view``) are views of the same kind, and ``numpy()`` gives a read-only array.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

#: In-place methods that change no element of the table.
_HARMLESS = frozenset({"requires_grad_", "retain_grad"})
#: In-place methods that change the view's shape rather than the table's elements: refused even with a table.
_RESHAPES = frozenset({"resize_", "resize_as_", "set_", "as_strided_", "t_", "transpose_", "squeeze_",
                       "unsqueeze_", "swapdims_", "swapaxes_"})
_INPLACE_DUNDERS = frozenset({"__setitem__", "__iadd__", "__isub__", "__imul__", "__itruediv__", "__ifloordiv__",
                              "__imod__", "__ipow__", "__iand__", "__ior__", "__ixor__", "__ilshift__",
                              "__irshift__", "__imatmul__"})


def _writes(name: str) -> bool:
    if name in _INPLACE_DUNDERS:
        return True
    return name.endswith("_") and not name.startswith("__") and name not in _HARMLESS


class TableView(torch.Tensor):
    """A tensor sharing a table's memory whose in-place writes become logged steps (a view with a table) or are
    refused (see the module docstring)."""

    _oac_what: str = "the table"
    _oac_table: Any = None  # the writer: .flush(), .write_rows(ids: int64[n], values: float32[n, D]); None: refuse
    _oac_base: Optional[torch.Tensor] = None  # the whole table's values, plain float32[N, D] (row stride R, 1)

    @classmethod
    def __torch_function__(cls, func: Callable, types: Tuple[type, ...], args: Tuple[Any, ...] = (),
                           kwargs: Optional[Dict[str, Any]] = None) -> Any:
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        views = [a for a in (*args, *kwargs.values()) if isinstance(a, TableView)]
        target = _target(func, name, args, kwargs)
        if target is not None:
            return _write_through(func, name, target, args, kwargs)
        if _aliases(kwargs.get("out"), views):  # a plain tensor sharing the table's memory as out=
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


def _target(func: Callable, name: str, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> "Optional[TableView]":
    """The view ``func`` writes: the first argument of an in-place operation (``tensor=`` for ``torch.nn.init``'s
    functions), ``out=``, or ``view.data = x``; None for a read."""
    if name == "__set__":  # a property's setter: only .data writes elements
        owner = getattr(func, "__self__", None)
        hit = getattr(owner, "__name__", "") == "data" and args and isinstance(args[0], TableView)
        return args[0] if hit else None
    first = args[0] if args else kwargs.get("tensor", kwargs.get("input"))
    if isinstance(first, TableView) and _writes(name):
        return first
    out = kwargs.get("out")
    return out if isinstance(out, TableView) else None


def _write_through(func: Callable, name: str, target: TableView, args: Tuple[Any, ...],
                   kwargs: Dict[str, Any]) -> Any:
    """Run the write ``func`` on a copy of the rows of ``target``'s table it covers, then commit the rows it changed
    as one step of the table; returns what ``func`` returns, with ``target`` in place of its copy."""
    table, base = target._oac_table, target._oac_base
    if table is None or base is None or name in _RESHAPES:
        raise RuntimeError(_refusal(target._oac_what, name))
    table.flush()  # every committed step is in the table: the copy starts from the current rows
    mine = [v for v in (*args, *kwargs.values(), target) if isinstance(v, TableView) and _same_table(v, base)]
    lo, hi = _row_span(mine, base)
    block = base[lo:hi].clone()  # plain, contiguous float32[hi - lo, D]
    before = block.clone()
    copies: Dict[int, torch.Tensor] = {id(v): _in_block(v, base, lo, block) for v in mine}

    def swap(a: Any) -> Any:
        if isinstance(a, TableView):
            return copies[id(a)] if id(a) in copies else a.plain().clone()  # another table's rows: read only
        if type(a) in (list, tuple):
            return type(a)(swap(x) for x in a)
        return a

    copy = copies[id(target)]
    if name == "__set__":  # view.data = x: torch would rebind the view; here the rows take x's values
        value = args[1]
        if not isinstance(value, torch.Tensor) or tuple(value.shape) != tuple(target.shape):
            got = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
            raise RuntimeError(f"{target._oac_what}.data = x copies x into the table: x must be a tensor of shape "
                               f"{tuple(target.shape)}, got {got}")
        copy.copy_(swap(value))
        out = None
    else:
        out = func(*swap(args), **{k: swap(v) for k, v in kwargs.items()})
    changed = (block.view(torch.int32) != before.view(torch.int32)).any(1)  # bits: NaN and -0.0 count
    if bool(changed.any()):
        ids = torch.nonzero(changed).view(-1)
        table.write_rows(ids + lo, block[ids])
        table.flush()  # the view (the table's memory) holds the new values before the call returns
    return target if out is copy else out


def _same_table(v: TableView, base: torch.Tensor) -> bool:
    with torch._C.DisableTorchFunctionSubclass():
        return v.untyped_storage().data_ptr() == base.untyped_storage().data_ptr()


def _row_span(views: "List[TableView]", base: torch.Tensor) -> Tuple[int, int]:
    """``(lo, hi)``: the table rows ``lo <= r < hi`` the elements of ``views`` lie in."""
    stride, lo, hi = base.stride(0), base.shape[0], 0
    for v in views:
        if v.numel():
            first = v.storage_offset() - base.storage_offset()
            last = first + sum((n - 1) * s for n, s in zip(v.shape, v.stride()))
            lo, hi = min(lo, first // stride), max(hi, last // stride + 1)
    return (lo, hi) if lo < hi else (0, 0)


def _in_block(v: TableView, base: torch.Tensor, lo: int, block: torch.Tensor) -> torch.Tensor:
    """The elements of ``v`` (a view of ``base``, row stride R) in ``block`` (``base[lo:hi]``, row stride D)."""
    if not v.numel():
        return block.new_empty(v.shape)
    stride, dim = base.stride(0), base.shape[1]

    def moved(step: int) -> int:  # a step of R*rows + cols in the table is D*rows + cols in the block
        cols = step % stride
        cols = cols - stride if cols >= dim else cols
        return (step - cols) // stride * dim + cols

    offset = moved(v.storage_offset() - base.storage_offset() - lo * stride)
    strides = [moved(s) for s in v.stride()]
    mapped = None
    if offset >= 0 and all(s >= 0 for s in strides):
        mapped = block.as_strided(v.shape, strides, offset)
    if mapped is None or not torch.equal(mapped.view(torch.int32), v.plain().view(torch.int32)):
        raise RuntimeError(f"{v._oac_what}: cannot write through this view (shape {tuple(v.shape)}, strides "
                           f"{tuple(v.stride())}); write whole rows with emb.write_rows(ids, values)")
    return mapped


def _shares(t: Any, views: "List[TableView]") -> bool:
    if not isinstance(t, torch.Tensor) or t.device.type != "cpu":
        return False
    with torch._C.DisableTorchFunctionSubclass():
        ptr = t.untyped_storage().data_ptr()
        return any(ptr == v.untyped_storage().data_ptr() for v in views)


def _aliases(out: Any, views: "List[TableView]") -> bool:
    if isinstance(out, (list, tuple)):
        return any(_aliases(o, views) for o in out)
    return isinstance(out, TableView) or _shares(out, views)


def _protect(out: Any, views: "List[TableView]") -> Any:
    """Outputs sharing the table's memory become views of the same kind; the rest stay plain tensors."""
    if type(out) in (list, tuple):  # not torch.Size or named tuples
        return type(out)(_protect(o, views) for o in out)
    if views and _shares(out, views):
        source = views[0]
        return table_view(out, source._oac_what, source._oac_table, source._oac_base)
    return out


def _refusal(what: str, op: str) -> str:
    return (f"{what} is read-only ({op} would write to it): a write there bypasses dgl_oac's step clock and write "
            f"log, so batches read ahead would keep the old rows and oac would no longer equal sync. Write rows "
            f"with emb.write_rows(ids, values), a logged step (e.g. a max-norm renormalisation: "
            f"emb.write_rows(ids, emb.weight[ids].renorm(2, 0, max_norm))), or replace the whole table with "
            f"emb.load_state_dict(...) / emb.all_set_embedding(...)")


def table_view(t: torch.Tensor, what: str, table: Any = None, base: Optional[torch.Tensor] = None) -> TableView:
    """``t`` (a view of a table: no copy) as a :class:`TableView`; ``what`` names it in messages. With ``table``
    (``.flush()``, ``.write_rows(ids, values)``), in-place writes become that table's logged steps; ``base``: the
    whole table's values ``float32[N, D]`` (row stride R, column stride 1), default ``t``."""
    with torch._C.DisableTorchFunctionSubclass():
        view = torch.Tensor.as_subclass(t, TableView)
        plain = torch.Tensor.as_subclass(t, torch.Tensor) if base is None else base
    view._oac_what = what
    if table is not None and plain.dim() == 2 and plain.stride(1) == 1:
        view._oac_table, view._oac_base = table, plain
    return view
