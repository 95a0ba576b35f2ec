"""Warnings for ``emb(ids)`` reads that bypass the pipeline during a loader's iteration.

A read of the ``input_nodes`` a loader epoch just handed out goes through the table, unpipelined, when the
loader does not carry the embedding (built without ``embeddings=[emb]``) or when the prefetched rows were
dropped unused: it works, but every such read gathers on the caller's thread, so it is warned about once.

How a read knows where its ids came from: an epoch marks the input-nodes tensor it handed out last with its
:class:`HandOutMark` (the tables the epoch carries), and unmarks it when it hands out the next one or ends. No
registry: a tensor no running epoch just handed out carries no mark. A copy of a marked tensor (``torch.save``,
``copy.deepcopy``, pickling) carries an empty set in its place, which ``torch.load(weights_only=True)`` accepts.
"""
from __future__ import annotations

import warnings
import weakref
from typing import Any, Optional, Sequence

import torch

#: The attribute an input-nodes tensor carries its mark in.
MARK = "_dgl_oac_handed_out_by"


class HandOutMark:
    """One epoch's mark: which tables the epoch carries, which tensor it handed out last while it runs."""

    def __init__(self, embeddings: Sequence[Any]) -> None:
        self.embeddings = list(embeddings)
        self.last: "Optional[weakref.ref[torch.Tensor]]" = None

    def stamp(self, input_nodes: Any) -> None:
        """``input_nodes`` (a tensor; anything else is not marked) is what the epoch handed out last."""
        self.close()
        if isinstance(input_nodes, torch.Tensor):
            setattr(input_nodes, MARK, self)
            self.last = weakref.ref(input_nodes)

    def close(self) -> None:
        """Unmark the tensor handed out last (the epoch moves on, or ended). Idempotent."""
        last = None if self.last is None else self.last()
        if last is not None and getattr(last, MARK, None) is self:  # not re-marked by another epoch since
            delattr(last, MARK)
        self.last = None

    def carries(self, emb: Any) -> bool:
        return any(e is emb for e in self.embeddings)

    def __reduce__(self) -> Any:  # a copy is not its epoch's hand-out; set: what weights_only loading accepts
        return set, ()


def handed_out_by(node_ids: torch.Tensor) -> Optional[HandOutMark]:
    """The running epoch that handed out ``node_ids`` last (as its input nodes), or None."""
    mark = getattr(node_ids, MARK, None)
    return mark if isinstance(mark, HandOutMark) else None


def warn_if_unpipelined(emb: Any, node_ids: torch.Tensor) -> None:
    """Warn once per NodeEmbedding ``emb`` and reason when ``emb(node_ids)`` (called by the user) reads the table
    directly although a loader being iterated just handed out ``node_ids`` as input nodes."""
    mark = handed_out_by(node_ids)
    if mark is None:
        return
    if mark.carries(emb):
        if not emb._warned_bypass:
            # the loader prefetched these very rows, and they were dropped unused (deleted from srcdata, say)
            emb._warned_bypass = True
            warnings.warn(f"NodeEmbedding {emb.name!r}: emb(input_nodes) read the table directly, although the "
                          f"DataLoader prefetched these rows: they were dropped unused (deleted from "
                          f"blocks[0].srcdata?). Every such read gathers on the caller's thread and its step "
                          f"writes through, so the pipeline does nothing for this table (loader.stats: gather and "
                          f"commit seconds near 0). Keep the rows, or pass attach=False to the DataLoader and read "
                          f"them with emb(input_nodes)", stacklevel=3)
        return
    if emb._warned_unpipelined:
        return
    emb._warned_unpipelined = True
    warnings.warn(f"NodeEmbedding {emb.name!r} is read with emb(ids) during a dgl_oac.DataLoader iteration "
                  f"that does not carry it: its rows are read and written synchronously, outside the "
                  f"pipeline. Pass embeddings=[{emb.name!r} embedding, ...] to the DataLoader",
                  stacklevel=3)
