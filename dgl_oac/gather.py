"""Stages G + H: read a batch's rows from the CPU table and start their copy to the device.

Runs on the gather thread (pipelined modes) or inline at hand-out (sync). For each embedding it opens a read
at the table's current version *before* touching the rows: every row written by a step <= that version is read
correctly; a row written later may be stale or torn and will be replaced whole by validation (oac) or used as
is (async).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Dict, List, Optional

import torch

from .embedding import NodeEmbedding
from .store import check_ids


@dataclass(eq=False)
class Rows:
    """One embedding's rows for one batch, in flight to the device."""

    emb: NodeEmbedding
    ids: torch.Tensor       # int64[n], CPU
    ids_dev: torch.Tensor   # int64[n], device
    rows: torch.Tensor      # float32[n, D+S], device (copy possibly still running: see ``event``)
    rv: Optional[int]       # read version (None in sync mode)
    event: Optional["torch.cuda.Event"]


def gather_rows(embeddings: List[NodeEmbedding], ids: torch.Tensor, open_read: bool,
                seconds: Optional[Dict[str, float]] = None) -> List[Rows]:
    """Gather ``ids: int64[n], CPU`` from every embedding's table and start the host->device copies."""
    out = []
    for emb in embeddings:
        # a sampler's bug (or a graph bigger than the table) would otherwise be torch's bare "index out of range"
        check_ids(ids, emb.num_embeddings, f"input nodes of a batch (from the sampler) for NodeEmbedding {emb.name!r}")
        t0 = time.perf_counter()
        rv = emb.clock.begin_read() if open_read else None
        try:
            rows = emb.store.gather(ids, out=emb.transfer.host_buffer(ids.numel(), emb.store.width))
            t1 = time.perf_counter()
            (rows_dev, ids_dev), event = emb.transfer.to_device(rows, ids)
        except BaseException:
            if rv is not None:
                emb.clock.end_read(rv)
            raise
        if seconds is not None:
            seconds["gather"] += t1 - t0
            seconds["copy"] += time.perf_counter() - t1
        out.append(Rows(emb, ids, ids_dev, rows_dev, rv, event))
    return out
