"""``dgl_oac.nn.Embedding``: a drop-in for ``torch.nn.Embedding(num, dim, sparse=True)`` whose table is a
:class:`dgl_oac.NodeEmbedding` in CPU memory.

    emb = dgl_oac.nn.Embedding(num_items, 64, sparse=True)      # was: torch.nn.Embedding(...)
    opt = dgl_oac.nn.SparseAdam(emb.parameters(), lr=0.01)      # was: torch.optim.SparseAdam(...)
    h = emb(ids)                                                # ids: int64 or int32, any shape

``forward`` reads through the table's ``NodeEmbedding.__call__``, so the rows a ``dgl_oac.DataLoader``
prefetched for the batch (``embeddings=[emb.node_embedding]``) are the ones used, validated in oac mode. The
initial values are torch's (``N(0, 1)`` drawn by one ``normal_`` over the whole ``float32[N, D]`` table), so after
the same ``torch.manual_seed`` both tables start bitwise equal; :meth:`Embedding.from_pretrained` and
``load_state_dict`` (of a torch Embedding's state) copy a given table. ``parameters()``: see :mod:`.params`.
"""
from __future__ import annotations

import contextlib
import itertools
from typing import Any, Callable, Dict, List, Optional

import torch
from torch import nn

from ..embedding import NodeEmbedding
from ..engine.table import Storage
from ..engine.table_view import table_view
from .params import TableHandle

_AUTO_NAMES = itertools.count()


class _PassGradient(torch.autograd.Function):
    """Forward: ``values`` (``rows`` rescaled); backward: the gradient to ``rows`` as it comes (torch's renorm
    happens outside autograd, so a rescaled row's gradient is the output's)."""

    @staticmethod
    def forward(ctx: Any, rows: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        return values

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        return grad, None


def _first_occurrences(ids: torch.Tensor) -> Any:
    """The unique values of ``ids: int64[n]`` and the position of each one's first occurrence."""
    uniq, inverse = torch.unique(ids, return_inverse=True)
    first = torch.full((uniq.numel(),), ids.numel(), dtype=torch.int64)
    first.scatter_reduce_(0, inverse, torch.arange(ids.numel()), reduce="amin")
    return uniq, first


def _zeroing(init: Callable[[torch.Tensor], Any], padding_idx: int) -> Callable[[torch.Tensor], torch.Tensor]:
    """``init``, then the padding row zeroed (torch's ``reset_parameters``)."""
    def run(table: torch.Tensor) -> torch.Tensor:
        out = init(table)
        table = out if isinstance(out, torch.Tensor) else table
        with torch.no_grad():
            table[padding_idx].zero_()
        return table
    return run


def torch_init(table: torch.Tensor) -> torch.Tensor:
    """``N(0, 1)`` in place, as ``torch.nn.Embedding.reset_parameters`` fills its weight."""
    return table.normal_()


class Embedding(nn.Module):
    """``Embedding(num_embeddings, embedding_dim, sparse=True, *, name=None, init=torch_init, storage=None,
    device=None)``.

    - ``name``: the table's name in checkpoints and stats (default ``"embedding_<k>"`` in construction order:
      give one when you checkpoint, so a resumed run finds its table by it).
    - ``init``: fills ``float32[N, D]`` in place (or returns it); default ``N(0, 1)`` as torch.
    - ``storage``: ``None`` (memory) or a file path for a table larger than RAM (:class:`dgl_oac.NodeEmbedding`).
    - ``device``: where ``forward`` returns rows (``None``: the ids' device). The table stays on the CPU.
    - ``freeze`` (as ``from_pretrained``'s): rows are read without gradient.
    - ``padding_idx``, ``max_norm``, ``norm_type``: torch's. The padding row starts at zero (not in
      ``from_pretrained``), reads as it is and is never trained: its reads get no gradient, so no optimizer step
      touches its values or state. Rows read while longer than ``max_norm`` are scaled down first, as torch's
      ``embedding_renorm_`` scales them (bitwise), and the scaled rows are written to the table as one logged
      write (:meth:`dgl_oac.NodeEmbedding.write_rows`), which the step's commit applies its update to. Either
      costs a host sync per ``forward`` on a device (the ids' check, the norms).

    torch's ``scale_grad_by_freq`` is not supported (a clear error), nor ``sparse=False``: a dense gradient of
    the whole table is what this module exists to avoid.
    """

    def __init__(self, num_embeddings: int, embedding_dim: int, sparse: bool = True, *, name: Optional[str] = None,
                 init: Optional[Callable[[torch.Tensor], Any]] = torch_init, storage: Optional[Storage] = None,
                 device: Any = None, freeze: bool = False, padding_idx: Optional[int] = None,
                 max_norm: Optional[float] = None, norm_type: float = 2.0, scale_grad_by_freq: bool = False,
                 dtype: Optional[torch.dtype] = None, _zero_padding: bool = True) -> None:
        super().__init__()
        if not isinstance(sparse, bool):  # torch's third positional argument is padding_idx
            raise TypeError(f"dgl_oac.nn.Embedding's third argument is sparse (a bool), got {sparse!r}; pass "
                            f"torch's padding_idx by name (padding_idx={sparse!r})")
        if not sparse:
            raise ValueError("dgl_oac.nn.Embedding trains its rows sparsely (sparse=True); for a dense gradient of "
                             "the whole table use torch.nn.Embedding(sparse=False)")
        if scale_grad_by_freq:
            raise NotImplementedError("dgl_oac.nn.Embedding does not support torch's scale_grad_by_freq=True")
        if dtype not in (None, torch.float32):
            raise ValueError(f"dgl_oac.nn.Embedding keeps float32 rows, not {dtype}")
        self.num_embeddings, self.embedding_dim = int(num_embeddings), int(embedding_dim)
        if padding_idx is not None:  # torch's rule: -num <= padding_idx < num, a negative one counted from the end
            if not -self.num_embeddings <= int(padding_idx) < self.num_embeddings:
                raise ValueError(f"padding_idx must be within num_embeddings ({self.num_embeddings}), got "
                                 f"{padding_idx}")
            padding_idx = int(padding_idx) % self.num_embeddings
        if max_norm is not None and not float(max_norm) > 0:
            raise ValueError(f"max_norm must be > 0, got {max_norm}")
        self.padding_idx = padding_idx
        self.max_norm = None if max_norm is None else float(max_norm)
        self.norm_type = float(norm_type)
        self.sparse, self.freeze = True, bool(freeze)
        self.device = None if device is None else torch.device(device)
        if padding_idx is not None and _zero_padding and init is not None:
            init = _zeroing(init, padding_idx)
        self.node_embedding = NodeEmbedding(self.num_embeddings, self.embedding_dim,
                                            name if name is not None else f"embedding_{next(_AUTO_NAMES)}",
                                            init_func=init, storage="memory" if storage is None else storage)
        self.handle = TableHandle(self.node_embedding)

    @classmethod
    def from_pretrained(cls, embeddings: torch.Tensor, freeze: bool = True, sparse: bool = True,
                        **kwargs: Any) -> "Embedding":
        """A table holding ``embeddings: float[N, D]`` (copied), as ``torch.nn.Embedding.from_pretrained``
        (``freeze=True`` by default there too: pass ``freeze=False`` to train it)."""
        if not isinstance(embeddings, torch.Tensor) or embeddings.dim() != 2:
            raise ValueError("from_pretrained takes a 2-D float tensor [num_embeddings, embedding_dim]")
        values = embeddings.detach().to("cpu", torch.float32)
        return cls(values.shape[0], values.shape[1], sparse, init=lambda t: t.copy_(values), freeze=freeze,
                   _zero_padding=False, **kwargs)

    def reset_parameters(self) -> None:
        """torch's: every row drawn from ``N(0, 1)`` (one ``normal_`` over the table, torch's draws), the padding
        row zeroed; one logged write of the whole table (``weight``'s writes)."""
        with torch.no_grad():
            torch.nn.init.normal_(self.weight)
            if self.padding_idx is not None:
                self.weight[self.padding_idx].fill_(0)

    @property
    def name(self) -> str:
        """The table's name (``name=``, else ``embedding_<k>``): its key in loaders, optimizers and checkpoints."""
        return self.node_embedding.name

    @property
    def weight(self) -> torch.Tensor:
        """``float32[N, D]``, CPU: the table after every committed step (``NodeEmbedding.weight``).

        Written as torch's weight is, and exactly: ``torch.nn.init.*_(emb.weight)``, ``emb.weight.data.copy_(t)``,
        ``emb.weight[ids] = values``, ``emb.weight.fill_(0)``, ... give the values they give on a torch tensor
        (same random draws), and each such write is one logged step of the table (:meth:`NodeEmbedding.write_rows
        <dgl_oac.NodeEmbedding.write_rows>`): batches read ahead are patched, so oac stays equal to sync with
        writes before, between or during epochs (:mod:`dgl_oac.engine.table_view`). A write copies the rows it
        covers (the whole table for a ``torch.nn.init`` call): for a few rows each step, ``write_rows`` is
        cheaper."""
        values = self.node_embedding.weight.plain()
        return table_view(values, f"dgl_oac.nn.Embedding {self.name!r}.weight", table=self.node_embedding)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """``float32[*ids.shape, D]`` on ``device`` (default the ids' device) for ``ids: int64 or int32[*]``, any
        shape, any strides. With grad enabled the read is committed by the next sparse ``step()``; the
        gradient of a row read several times is summed by ``dgl_oac.nn``'s optimizers, as torch's."""
        if not isinstance(ids, torch.Tensor):
            raise TypeError(f"dgl_oac.nn.Embedding {self.name!r} takes a tensor of ids, got {type(ids).__name__}")
        if ids.dtype not in (torch.int64, torch.int32):
            raise TypeError(f"ids passed to dgl_oac.nn.Embedding {self.name!r} must be torch.int64 or torch.int32 "
                            f"(as torch.nn.Embedding's), got {ids.dtype}")
        # A 1-D int64 tensor goes as it is: the loader's input_nodes are recognised by identity (no copy).
        flat = ids if ids.dim() == 1 and ids.dtype == torch.int64 else ids.reshape(-1).to(torch.int64)
        device = self.device if self.device is not None else ids.device
        with torch.no_grad() if self.freeze else contextlib.nullcontext():
            rows = self._read(flat, device)
            if self.max_norm is not None:
                rows = self._renorm(flat, rows)
        return rows if ids.dim() == 1 else rows.reshape(*ids.shape, self.embedding_dim)

    def _read(self, flat: torch.Tensor, device: torch.device) -> torch.Tensor:
        """The rows of ``flat: int64[n]``; positions holding ``padding_idx`` read that row without gradient (a
        read of its own, whose leaf gets none, so no step commits it: torch drops those ids from the gradient)."""
        if self.padding_idx is None:
            return self.node_embedding(flat, device)
        pad = (flat == self.padding_idx).cpu()
        if not bool(pad.any()):
            return self.node_embedding(flat, device)
        live, padded = (~pad).nonzero().flatten(), pad.nonzero().flatten()
        cpu = flat.cpu()
        parts = [self.node_embedding(cpu[padded[:1]], device).detach().expand(padded.numel(), -1)]
        if live.numel():
            parts.insert(0, self.node_embedding(cpu[live], device))
        order = torch.cat([live, padded]).to(parts[0].device)
        return torch.cat(parts)[torch.argsort(order)]

    def _renorm(self, flat: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """``rows`` with each row longer than ``max_norm`` scaled as torch's ``embedding_renorm_`` scales it
        (``row * (max_norm / (norm + 1e-7))``, the norm a double from the row's own ``norm``), those rows written
        to the table (one logged write); the gradient passes through unscaled, as torch's reaches the row."""
        with torch.no_grad():
            values = rows.detach()
            # candidates by a vectorised norm (its bits may differ from the row's own), each decided exactly
            rough = torch.linalg.vector_norm(values, ord=self.norm_type, dim=1)
            near = (rough > self.max_norm * (1 - 1e-4)).nonzero().flatten().cpu()
            if not near.numel():
                return rows
            cpu = flat.cpu()
            ids, first = _first_occurrences(cpu[near])
            fixed_ids, fixed_rows = [], []
            for i, pos in zip(ids.tolist(), near[first].tolist()):
                norm = values[pos].norm(self.norm_type).item()
                if norm > self.max_norm:
                    fixed_ids.append(i)
                    fixed_rows.append(values[pos] * (self.max_norm / (norm + 1e-7)))
            if not fixed_ids:
                return rows
            fixed = torch.tensor(fixed_ids)
            new = torch.stack(fixed_rows)
            self.node_embedding.write_rows(fixed, new)
            # every position of a rescaled row takes its new value
            lookup = torch.full((self.num_embeddings,), -1, dtype=torch.int64)
            lookup[fixed] = torch.arange(fixed.numel())
            slot = lookup[cpu]
            hit = (slot >= 0).nonzero().flatten()
            out = values.clone()
            out[hit.to(out.device)] = new[slot[hit].to(new.device)].to(out.device)
        return _PassGradient.apply(rows, out) if rows.requires_grad else out

    # --- state_dict: the table as torch's "weight" (not the empty handle) ------------------------------------
    def _save_to_state_dict(self, destination: Dict[str, Any], prefix: str, keep_vars: bool) -> None:
        destination[prefix + "weight"] = self.node_embedding.weight.clone()

    def _load_from_state_dict(self, state_dict: Dict[str, Any], prefix: str, local_metadata: Any, strict: bool,
                              missing_keys: List[str], unexpected_keys: List[str], error_msgs: List[str]) -> None:
        key = prefix + "weight"
        if key not in state_dict:
            missing_keys.append(key)
        else:
            try:
                self.node_embedding.load_state_dict({"weight": state_dict[key].detach().to("cpu", torch.float32)})
            except (ValueError, RuntimeError) as exc:
                error_msgs.append(str(exc))
        if strict:
            unexpected_keys.extend(k for k in state_dict if k.startswith(prefix) and k != key
                                   and "." not in k[len(prefix):])

    def __deepcopy__(self, memo: Dict[int, Any]) -> "Embedding":
        raise TypeError(self._no_copy())

    def __reduce_ex__(self, protocol: Any) -> Any:
        raise TypeError(self._no_copy())

    def _no_copy(self) -> str:
        return (f"dgl_oac.nn.Embedding {self.name!r} cannot be copied or pickled (its table lives in CPU memory, "
                f"written by a background thread): save model.state_dict() or a dgl_oac.checkpoint, and build a copy "
                f"with dgl_oac.nn.Embedding.from_pretrained(state['weight'], freeze=False)")

    def extra_repr(self) -> str:
        extra = "".join(f", {k}={v!r}" for k, v in (("padding_idx", self.padding_idx), ("max_norm", self.max_norm))
                        if v is not None)
        return f"{self.num_embeddings}, {self.embedding_dim}{extra}, sparse=True, name={self.name!r}"
