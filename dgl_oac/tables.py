"""Which embedding tables a loader feeds, whatever its batches are (no graph library).

:func:`unwrap` gives the :class:`~dgl_oac.NodeEmbedding` behind a ``dgl_oac.nn.Embedding``; the checks name a
table that cannot be fed. What a DGL loader's indices and input nodes mean for its tables:
:mod:`dgl_oac.dgl_frontend.inputs`.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence, Union

from .embedding import NodeEmbedding

Embeddings = Union[Sequence[NodeEmbedding], Mapping[str, NodeEmbedding]]


def unwrap(emb: Any) -> Any:
    """The :class:`NodeEmbedding` of ``emb``: itself, or a module's ``node_embedding`` (``dgl_oac.nn.Embedding``)."""
    inner = getattr(emb, "node_embedding", None)
    return inner if isinstance(inner, NodeEmbedding) else emb


def unwrap_all(embeddings: Embeddings) -> Embeddings:
    """``embeddings`` (a sequence or ``{ntype: emb}``) with every ``dgl_oac.nn.Embedding`` unwrapped."""
    if isinstance(embeddings, Mapping):
        return {k: unwrap(e) for k, e in embeddings.items()}
    return [unwrap(e) for e in embeddings]


def check_embedding(emb: Any, num_nodes: int, where: str) -> None:
    """``emb`` is a dgl_oac.NodeEmbedding with one row per node of ``where`` (``num_nodes`` of them)."""
    if not isinstance(emb, NodeEmbedding):
        raise TypeError(f"embeddings must be dgl_oac.NodeEmbedding or dgl_oac.nn.Embedding, got "
                        f"{type(emb).__name__}")
    if emb.num_embeddings != num_nodes:
        raise ValueError(f"NodeEmbedding {emb.name!r} has {emb.num_embeddings} rows but {where} has "
                         f"{num_nodes} nodes")


def check_unique_names(embeddings: Sequence[NodeEmbedding]) -> None:
    names = [e.name for e in embeddings]
    if len(set(names)) != len(names):
        raise ValueError(f"embedding names must be unique, got {names}")
