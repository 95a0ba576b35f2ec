"""Gather and copy: read a batch's rows from each CPU table and start their copy to the device.

Runs on the gather thread (pipelined modes) or at hand-out (sync, after a flush). For each table it opens a read
at the table's current version *before* touching the rows: every row written by a step <= that version is read
correctly; a row written later may be stale or torn and is replaced whole by validation (oac) or used as is
(async). The read stays open until the batch is released (see :mod:`dgl_oac.pipeline`).
"""
from __future__ import annotations

import time
from typing import Dict, List, Optional, Sequence

import torch

from .batch import TableRows
from .pipeline import TablePipeline
from .store import check_ids


def gather_rows(tables: Sequence[TablePipeline], table_ids: Sequence[torch.Tensor],
                seconds: Optional[Dict[str, float]] = None) -> List[TableRows]:
    """One :class:`TableRows` per table for its ``ids: int64[n], CPU`` (``table_ids``, in the tables' order: the
    same input nodes for every table of a homogeneous graph, a node type's for a heterograph's); the copies to
    the device are started."""
    out: List[TableRows] = []
    try:
        for table, ids in zip(tables, table_ids):
            # a sampler's bug (or a graph bigger than the table) would otherwise be torch's bare "out of range"
            check_ids(ids, table.store.num_rows,
                      f"input nodes of a batch (from the sampler) for NodeEmbedding {table.name!r}")
            t0 = time.perf_counter()
            rv, reg = table.open_read(ids)
            try:
                with torch.profiler.record_function("dgl_oac.gather"):
                    rows = table.store.gather(ids, out=table.transfer.host_buffer(ids.numel(), table.store.width))
                t1 = time.perf_counter()
                with torch.profiler.record_function("dgl_oac.copy"):
                    (rows_dev, ids_dev), event = table.transfer.to_device(rows, ids)
            except BaseException:
                table.close_read(rv, reg)
                raise
            if seconds is not None:
                seconds["gather"] += t1 - t0
                seconds["copy"] += time.perf_counter() - t1
            out.append(TableRows(ids, ids_dev, rows_dev, rv, event, registration=reg))
    except BaseException:
        release_all(tables, out)
        raise
    return out


def release_all(tables: Sequence[TablePipeline], rows: Sequence[TableRows]) -> None:
    """Close the reads of gathered batches that will never be handed out."""
    for table, r in zip(tables, rows):
        table.release(r)
