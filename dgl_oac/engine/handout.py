"""Validate and hand out, on the caller's thread: patch a batch's rows and wrap them as leaves.

Runs inside ``next(loader)``, after the previous ``opt.step()`` (so the write log holds every committed step)
and before the caller's forward pass. Order per table: wait for the copy (device-side), patch stale rows
(oac), make the ``requires_grad`` leaf the model reads, register the batch for the next ``step()``.

Graph-agnostic: :func:`validate_rows` returns the leaves (with the batches registered) in the tables' order, and
the loader puts the leaves where its model reads them (:class:`dgl_oac.BatchLoader`: served by ``emb(ids)``; the
DGL frontend's :func:`dgl_oac.dgl_frontend.handout.hand_out`: attached to the sampled graphs).
"""
from __future__ import annotations

import time
import weakref
from typing import List, NamedTuple, Optional, Sequence

import torch

from .batch import BatchState, CommitListener, HandedOut, TableRows
from .hooks import BatchHook
from .pipeline import TablePipeline
from .stats import LoaderStats


class Handed(NamedTuple):
    """One table's part of a batch, as handed out."""

    leaf: torch.Tensor             # float32[n, D], the rows' device, requires grad: what the model reads
    batch: Optional[HandedOut]     # registered for the next step() (None: a node type absent from the batch)


def validate_rows(gathered: List[TableRows], tables: Sequence[TablePipeline], mode: str,
                  check_finite: bool, stats: LoaderStats, listener: Optional[CommitListener],
                  ntypes: Optional[Sequence[Optional[str]]] = None,
                  hooks: Sequence[Optional[BatchHook]] = ()) -> List[Handed]:
    """Validate each table's rows of one batch (oac: patch them from the write log), wrap them as
    ``requires_grad`` leaves ``float32[n, D]`` (the rows' device) and register them with their tables for the
    next ``step()``, each as a :class:`~.batch.HandedOut` whose commit ``listener`` hears of (the batch's first
    table with rows only: a batch counts once). Returns them, in the tables' order. ``ntypes``: each table's
    node type on a heterograph (None: homogeneous). ``hooks``: async only, each table's hook
    (:mod:`dgl_oac.engine.hooks`), which may move the leaf's values."""
    ntypes = ntypes or [None] * len(tables)
    t0 = time.perf_counter()
    counted = False
    out: List[Handed] = []
    with torch.profiler.record_function("dgl_oac.validate"):
        for i, (table, r, ntype) in enumerate(zip(tables, gathered, ntypes)):
            table.check()  # a failed write-back surfaces before the batch is used
            table.transfer.wait_for_copy([r.rows, r.ids_dev], r.event)
            # the log holds every committed step: afterwards the rows are what sync reads (nothing can be stale
            # if no step was committed after the read)
            if mode == "oac" and r.rv < table.steps - 1:
                stats.add_patched(table.log.patch(r.ids_dev, r.rows, r.rv))
            empty = ntype is not None and not r.ids.numel()  # a node type absent from the batch: nothing to commit
            seen = None if mode == "async" else table.steps - 1
            d = table.store.dim
            leaf = r.rows[:, :d].contiguous() if r.rows.shape[1] != d else r.rows.detach().clone()
            hook = hooks[i] if hooks else None
            if hook is not None:
                hook.at_handout(table, r, leaf)
            leaf.requires_grad_(True)
            batch = None
            if empty:
                table.release_gathered(r)
            else:
                batch = HandedOut(r, mode, check_finite, BatchState(seen), hook=hook, leaf_ref=weakref.ref(leaf),
                                  listener=None if counted else listener)
                table.register(batch)
                counted = True
            stats.rows_read += r.ids.numel()
            out.append(Handed(leaf, batch))
    stats.seconds["validate"] += time.perf_counter() - t0
    return out
