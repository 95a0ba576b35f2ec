"""Gather and copy: read a batch's rows from each CPU table and start their copy to the device.

Runs on the gather thread (pipelined modes) or at hand-out (sync, after a flush). For each table it opens a read
at the table's current version *before* touching the rows: every row written by a step <= that version is read
correctly; a row written later may be stale or torn and is replaced whole by validation (oac) or used as is
(async). The read stays open until the batch is released (see :mod:`dgl_oac.engine.pipeline`).

Reading ahead (the gather thread, ``read_ahead=True``): an out-of-core table's pages (a file larger than the
memory allows: :attr:`~dgl_oac.engine.table.RowStore.out_of_core`) for the whole batch are requested from the
disk together first (:meth:`~dgl_oac.engine.table.RowStore.read_ahead`), so a table larger than the
page cache is read at the disk's queue depth instead of one page fault at a time. Sync's gather at hand-out
does not read ahead: it reads its batch as it always did (after the previous step's write), which is the
baseline the pipelined modes are compared with.
"""
from __future__ import annotations

import time
from typing import Dict, List, Optional, Sequence

import torch

from .batch import TableRows
from .pipeline import TablePipeline
from .table import check_ids


def gather_rows(tables: Sequence[TablePipeline], table_ids: Sequence[torch.Tensor],
                seconds: Optional[Dict[str, float]] = None, read_ahead: bool = False,
                register: bool = True) -> List[TableRows]:
    """One :class:`TableRows` per table for its ``ids: int64[n], CPU`` (``table_ids``, in the tables' order: the
    same input nodes for every table of a homogeneous graph, a node type's for a heterograph's); the copies to
    the device are started. ``read_ahead``: first ask the disk for every file-backed table's pages of the batch
    (before the reads open, so they open at the newest version the I/O allows). ``register``: distributed, list the
    reads with the rows' owners so that they forward later writes (not for async batches, which are never
    patched)."""
    for table, ids in zip(tables, table_ids):
        # a sampler's bug (or a graph bigger than the table) would otherwise be torch's bare "out of range"
        check_ids(ids, table.store.num_rows,
                  f"input nodes of a batch (from the sampler) for NodeEmbedding {table.name!r}")
    if read_ahead and any(t.store.out_of_core for t in tables):
        t0 = time.perf_counter()
        with torch.profiler.record_function("dgl_oac.read_ahead"):
            for table, ids in zip(tables, table_ids):
                if table.store.out_of_core:
                    table.store.read_ahead(ids)
        if seconds is not None:
            seconds["gather"] += time.perf_counter() - t0
    out: List[TableRows] = []
    try:
        for table, ids in zip(tables, table_ids):
            t0 = time.perf_counter()
            ticket = table.open_read(ids, register)
            try:
                with torch.profiler.record_function("dgl_oac.engine.gather"):
                    rows = table.store.gather(ids, out=table.transfer.host_buffer(ids.numel(), table.store.width),
                                             at=ticket.rv)
                t1 = time.perf_counter()
                with torch.profiler.record_function("dgl_oac.copy"):
                    # the ids ride with the rows, from pinned memory too: a copy from pageable memory may
                    # make this thread wait for the copy stream (the driver stages it synchronously)
                    tr = table.transfer
                    (rows_dev, ids_dev), event = tr.to_device(rows, tr.staged(ids))
            except BaseException:
                table.close_read(ticket)
                raise
            if seconds is not None:
                seconds["gather"] += t1 - t0
                seconds["copy"] += time.perf_counter() - t1
            out.append(TableRows(ids, ids_dev, rows_dev, ticket.rv, event, ticket=ticket))
    except BaseException:
        release_all(tables, out)
        raise
    return out


def release_all(tables: Sequence[TablePipeline], rows: Sequence[TableRows]) -> None:
    """Give back gathered batches that will never be handed out (their reads, their rows); one a failed hand-out
    registered is released (:meth:`~dgl_oac.engine.pipeline.TablePipeline.release_gathered`). Idempotent."""
    for table, r in zip(tables, rows):
        table.release_gathered(r)
