"""How ``parameters()`` reaches dgl-oac's tables: the table handle, and what the sparse optimizers accept.

The story (chosen because it makes a port from torch shortest): :class:`~dgl_oac.nn.Embedding` registers ONE
parameter, a :class:`TableHandle`: an empty (``numel() == 0``), frozen (``requires_grad=False``) ``nn.Parameter``
that names the table, which lives in CPU memory outside autograd's parameters. So

- ``dgl_oac.nn.SparseAdam(emb.parameters())``, ``SparseAdam(model.parameters())`` of a model made only of
  embeddings (node2vec), or ``SparseAdam(dgl_oac.nn.sparse_parameters(model))`` find the table, exactly where
  torch's code passes them;
- ``torch.optim.Adam(model.parameters())`` on a model that holds an Embedding works unchanged: the handle never
  gets a gradient, so torch's optimizers skip it, and ``DistributedDataParallel`` ignores it (not
  ``requires_grad``). A torch model cannot give its ``nn.Embedding(sparse=True)`` to a dense optimizer anyway
  (``Adam does not support sparse gradients``), so no working torch code changes meaning;
- a dense parameter given to a dgl-oac sparse optimizer is a ``TypeError`` that names the fix.
"""
from __future__ import annotations

import weakref
from typing import Any, Iterable, Iterator, List

import torch
from torch import nn

from ..embedding import NodeEmbedding


class TableHandle(nn.Parameter):
    """``float32[0]``, frozen: ``Embedding.parameters()``'s stand-in for a table held in CPU memory."""

    def __new__(cls, table: NodeEmbedding) -> "TableHandle":
        handle = super().__new__(cls, torch.empty(0), requires_grad=False)
        handle._table_ref = weakref.ref(table)  # weakly: copying a handle never copies a table
        return handle

    def __init__(self, table: NodeEmbedding) -> None:  # noqa: D107 - state set in __new__
        pass

    @property
    def table(self) -> NodeEmbedding:
        """The :class:`dgl_oac.NodeEmbedding` this handle names."""
        table = getattr(self, "_table_ref", lambda: None)()
        if table is None:
            raise RuntimeError("this TableHandle's dgl_oac.nn.Embedding no longer exists (or the handle was copied "
                               "without it)")
        return table

    def __repr__(self) -> str:
        table = getattr(self, "_table_ref", lambda: None)()
        what = "a deleted table" if table is None else \
            f"table {table.name!r} ({table.num_embeddings} x {table.embedding_dim}, CPU)"
        return f"TableHandle({what}; trained by dgl_oac.nn's sparse optimizers)"

    def __reduce_ex__(self, proto: Any) -> Any:  # a pickled handle is an empty tensor: the table is not pickled
        return torch.Tensor.__reduce_ex__(torch.empty(0), proto)


def sparse_parameters(module: nn.Module) -> Iterator[TableHandle]:
    """The table handles of every :class:`~dgl_oac.nn.Embedding` in ``module`` (for a sparse optimizer)."""
    return (p for p in module.parameters() if isinstance(p, TableHandle))


def dense_parameters(module: nn.Module) -> Iterator[nn.Parameter]:
    """Every parameter of ``module`` but the table handles (for a dense optimizer, if you prefer it explicit)."""
    return (p for p in module.parameters() if not isinstance(p, TableHandle))


def resolve_tables(params: Iterable[Any], who: str) -> List[NodeEmbedding]:
    """The tables named by ``params``: table handles, ``dgl_oac.nn.Embedding`` modules, ``dgl_oac.NodeEmbedding``
    objects, or torch-style param groups ``{"params": [...]}`` of those (no per-group options). Each table once,
    in first-seen order. Raises ``TypeError`` for a dense tensor (naming the fix) and ``ValueError`` for none."""
    if isinstance(params, (torch.Tensor, NodeEmbedding, nn.Module, dict)):
        params = [params]
    tables: List[NodeEmbedding] = []
    for p in params:
        if isinstance(p, dict):
            extra = sorted(set(p) - {"params"})
            if extra:
                raise ValueError(f"{who}: per-group options {extra} are not supported; one set of hyperparameters "
                                 f"per optimizer (build one optimizer per group instead)")
            found = resolve_tables(p["params"], who)
        elif isinstance(p, TableHandle):
            found = [p.table]
        elif isinstance(p, NodeEmbedding):
            found = [p]
        elif isinstance(p, nn.Module) and isinstance(getattr(p, "node_embedding", None), NodeEmbedding):
            found = [p.node_embedding]
        elif isinstance(p, torch.Tensor):
            raise TypeError(
                f"{who} got a dense tensor of shape {tuple(p.shape)}: it trains dgl_oac.nn.Embedding tables "
                f"only (torch's sparse optimizers reject dense gradients too). Give dense parameters to a dense "
                f"optimizer, e.g. torch.optim.Adam(dgl_oac.nn.dense_parameters(model)), and this one "
                f"dgl_oac.nn.sparse_parameters(model)")
        else:
            raise TypeError(f"{who} takes dgl_oac.nn.Embedding parameters (emb.parameters()), modules or "
                            f"dgl_oac.NodeEmbedding objects, got {type(p).__name__}")
        tables.extend(t for t in found if not any(t is s for s in tables))
    if not tables:
        raise ValueError(f"{who} got an empty parameter list: pass emb.parameters() of a dgl_oac.nn.Embedding "
                         f"(or dgl_oac.nn.sparse_parameters(model))")
    return tables
