"""Validate and hand out, on the caller's thread: patch a batch's rows, wrap them as leaves, attach them
(graph samplers' batches; a batch source's rows are not attached: :mod:`dgl_oac.sources`).

Runs inside ``next(loader)``, after the previous ``opt.step()`` (so the write log holds every committed step)
and before the caller's forward pass. Order per table: wait for the copy (device-side), patch stale rows
(oac), make the ``requires_grad`` leaf the model reads, register the batch for the next ``step()``.
"""
from __future__ import annotations

import time
from typing import Any, Callable, List, Optional, Sequence, Tuple

import dgl
import torch

from ..blocks import IndexGraph
from .batch import TableRows
from .hooks import BatchHook
from .pipeline import TablePipeline
from .stats import LoaderStats
from .structure import StructureCopy


def attach(result: Any, name: str, leaf: torch.Tensor, ntype: Optional[str] = None) -> None:
    """Put ``leaf: float32[n, D]`` where a model looks for input-node rows: ``blocks[0].srcdata[name]``, or,
    with no blocks, the ``ndata[name]`` of every graph in the tuple whose nodes are the input nodes. With a
    node type (heterographs): the data of that type, ``srcnodes[ntype].data[name]`` (so ``srcdata[name]`` is
    ``{ntype: rows}``) or ``nodes[ntype].data[name]``."""
    blocks = result[-1] if isinstance(result[-1], list) else []
    if blocks:
        (blocks[0].srcdata if ntype is None else blocks[0].srcnodes[ntype].data)[name] = leaf
        return
    graphs = [g for g in result[1:] if (isinstance(g, dgl.DGLGraph) and (ntype is None or ntype in g.ntypes)
                                        and g.num_nodes(ntype) == leaf.shape[0])
              or (isinstance(g, IndexGraph) and ntype is None and g.num_nodes() == leaf.shape[0])]
    if not graphs:
        raise ValueError(f"cannot attach {name!r}: the sampler returned no blocks and no graph over its "
                         f"{leaf.shape[0]} input nodes" + ("" if ntype is None else f" of type {ntype!r}"))
    for g in graphs:
        (g.ndata if ntype is None else g.nodes[ntype].data)[name] = leaf


def validate_rows(gathered: List[TableRows], tables: Sequence[TablePipeline], mode: str,
                  check_finite: bool, stats: LoaderStats,
                  on_commit: Optional[Callable[[TableRows, float, int], None]],
                  ntypes: Optional[Sequence[Optional[str]]] = None,
                  hooks: Sequence[Optional[BatchHook]] = ()) -> List[torch.Tensor]:
    """Validate each table's rows of one batch (oac: patch them from the write log), wrap them as
    ``requires_grad`` leaves ``float32[n, D]`` (the rows' device) and register them with their tables for the
    next ``step()``. Returns the leaves, in the tables' order. ``ntypes``: each table's node type on a
    heterograph (None: homogeneous). ``hooks``: async only, each table's hook (:mod:`dgl_oac.engine.hooks`),
    which may move the leaf's values."""
    ntypes = ntypes or [None] * len(tables)
    t0 = time.perf_counter()
    counted = False
    leaves: List[torch.Tensor] = []
    with torch.profiler.record_function("dgl_oac.validate"):
        for i, (table, r, ntype) in enumerate(zip(tables, gathered, ntypes)):
            table.check()  # a failed write-back surfaces before the batch is used
            table.transfer.wait_for_copy([r.rows, r.ids_dev], r.event)
            # the log holds every committed step: afterwards the rows are what sync reads (nothing can be stale
            # if no step was committed after the read)
            if mode == "oac" and r.rv < table.steps - 1:
                stats.add_patched(table.log.patch(r.ids_dev, r.rows, r.rv))
            r.kind, r.check_finite = mode, check_finite
            empty = ntype is not None and not r.ids.numel()  # a node type absent from the batch: nothing to commit
            r.on_commit = None if counted or empty else on_commit  # a batch counts once, with its first table
            r.seen = None if mode == "async" else table.steps - 1
            d = table.store.dim
            leaf = r.rows[:, :d].contiguous() if r.rows.shape[1] != d else r.rows.detach().clone()
            r.hook = hooks[i] if hooks else None
            if r.hook is not None:
                r.hook.at_handout(table, r, leaf)
            leaf.requires_grad_(True)
            if empty:
                table.release(r)
            else:
                table.register(r, leaf)
                counted = True
            stats.rows_read += r.ids.numel()
            leaves.append(leaf)
    stats.seconds["validate"] += time.perf_counter() - t0
    return leaves


def hand_out(result: Any, gathered: List[TableRows], tables: Sequence[TablePipeline], mode: str,
             device: torch.device, check_finite: bool, stats: LoaderStats,
             on_commit: Optional[Callable[[TableRows, float, int], None]],
             ntypes: Optional[Sequence[Optional[str]]] = None,
             hooks: Sequence[Optional[BatchHook]] = (),
             structure: Optional[StructureCopy] = None, attach_rows: bool = True) -> Tuple[Any, List[torch.Tensor]]:
    """:func:`validate_rows` of one batch of a graph sampler, and ``(result, leaves)``: ``result`` is the
    sampler's output, moved to ``device`` by ``structure`` (its copy started on the gather thread, or now;
    None only on the CPU), with each leaf attached (:func:`attach`) unless ``attach_rows`` is False."""
    if structure is not None:
        result = structure.finish(result)
    elif device.type != "cpu":
        raise ValueError(f"hand_out on {device} needs the loader's StructureCopy to move the batch's structure")
    ntypes = ntypes or [None] * len(tables)
    leaves = validate_rows(gathered, tables, mode, check_finite, stats, on_commit, ntypes, hooks)
    for table, r, ntype, leaf in zip(tables, gathered, ntypes, leaves):
        if attach_rows:
            attach(result, table.name, leaf, ntype)
        if r.ids_dev is not r.ids and isinstance(result, tuple):
            # hand out the device ids the batch knows, so emb(input_nodes, device) is an identity hit
            first = r.ids_dev if ntype is None else {**result[0], ntype: r.ids_dev}
            result = (first,) + result[1:]
    return result, leaves
