"""What saving and loading share: the tables a call names (in any form the loaders take), their trainers'
group, and a step every rank runs (or rank 0 alone) with one verdict, so no rank is left waiting."""
from __future__ import annotations

from typing import Any, List, Mapping, Optional, Sequence, Union

import torch

from ..embedding import NodeEmbedding
from .rows import CheckpointError

Tables = Union[NodeEmbedding, Sequence[NodeEmbedding], Mapping[str, NodeEmbedding]]


def group_of(embs: List[NodeEmbedding]) -> Any:
    """The trainers' :class:`~dgl_oac.distributed.Group` of distributed tables, None in one process."""
    return embs[0].group if embs else None


def together(group: Any, fn: Any, what: str, lead_only: bool = False) -> None:
    """Run ``fn()`` (on rank 0 only with ``lead_only``) and decide together: if it fails on any rank, every rank
    raises (the failing one its own error), so no rank is left waiting for the others."""
    if group is None:
        fn()
        return
    error: Optional[BaseException] = None
    if not lead_only or group.rank == 0:
        try:
            fn()
        except Exception as exc:  # noqa: BLE001 - re-raised below, after the ranks agree
            error = exc
    failing = group.ranks_flagging(error is not None, what=what)
    if error is not None:
        raise error
    if failing:
        raise CheckpointError(f"{what} failed on rank(s) {failing} (see their error); rank {group.rank} stops too")


def tables_of(embeddings: Tables) -> List[NodeEmbedding]:
    """The tables a call names: one, a sequence, or a heterograph's ``{ntype: table}``, of NodeEmbedding or
    ``dgl_oac.nn.Embedding`` (which stands for its table); their names unique."""
    if isinstance(embeddings, Mapping):  # a heterograph's {ntype: table}, as the loader takes them
        embeddings = list(embeddings.values())
    embs = [embeddings] if isinstance(embeddings, (NodeEmbedding, torch.nn.Module)) else list(embeddings)
    # a dgl_oac.nn.Embedding stands for its table (found by attribute: this module imports nothing of dgl_oac.nn)
    embs = [e.node_embedding if isinstance(getattr(e, "node_embedding", None), NodeEmbedding) else e for e in embs]
    for e in embs:
        if not isinstance(e, NodeEmbedding):
            raise TypeError(f"checkpoints hold dgl_oac.NodeEmbedding tables, got {type(e).__name__}")
    names = [e.name for e in embs]
    if len(set(names)) != len(names):
        raise ValueError(f"embedding names must be unique in a checkpoint, got {names}")
    return embs
