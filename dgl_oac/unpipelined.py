"""Warnings for ``emb(ids)`` reads that bypass the pipeline during a loader's iteration.

A read of the ``input_nodes`` a loader epoch just handed out goes through the table, unpipelined, when the
loader does not carry the embedding (built without ``embeddings=[emb]``) or when the prefetched rows were
dropped unused: it works, but every such read gathers on the caller's thread, so it is warned about once.
"""
from __future__ import annotations

import warnings
import weakref
from typing import Any

import torch

#: Loader epochs being iterated (the loader adds them).
ITERATING: "weakref.WeakSet[Any]" = weakref.WeakSet()


def warn_if_unpipelined(emb: Any, node_ids: torch.Tensor) -> None:
    """Warn once per NodeEmbedding ``emb`` and reason when ``emb(node_ids)`` (called by the user) reads the table
    directly although a loader being iterated just handed out ``node_ids`` as input nodes."""
    if not emb._warned_bypass and any(
            ep.last_input_nodes is not None and ep.last_input_nodes() is node_ids and emb in ep.embeddings
            for ep in list(ITERATING)):
        # the loader prefetched these very rows, and they were dropped unused (deleted from srcdata, say)
        emb._warned_bypass = True
        warnings.warn(f"NodeEmbedding {emb.name!r}: emb(input_nodes) read the table directly, although the "
                      f"DataLoader prefetched these rows: they were dropped unused (deleted from "
                      f"blocks[0].srcdata?). Every such read gathers on the caller's thread and its step "
                      f"writes through, so the pipeline does nothing for this table (loader.stats: gather and "
                      f"commit seconds near 0). Keep the rows, or pass attach=False to the DataLoader and read "
                      f"them with emb(input_nodes)", stacklevel=3)
    if emb._warned_unpipelined or not any(
            ep.last_input_nodes is not None and ep.last_input_nodes() is node_ids and emb not in ep.embeddings
            for ep in list(ITERATING)):
        return
    emb._warned_unpipelined = True
    warnings.warn(f"NodeEmbedding {emb.name!r} is read with emb(ids) during a dgl_oac.DataLoader iteration "
                  f"that does not carry it: its rows are read and written synchronously, outside the "
                  f"pipeline. Pass embeddings=[{emb.name!r} embedding, ...] to the DataLoader",
                  stacklevel=3)
