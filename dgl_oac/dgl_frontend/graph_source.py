"""One epoch of a :class:`dgl_oac.DataLoader`'s graph: :class:`GraphSource`, the epoch's
:class:`~dgl_oac.loading.source.BatchSource`, and its hand-out.

The hand-out (:func:`hand_out`) is the engine's :func:`~dgl_oac.engine.pipeline.validate_rows`, then each table's
leaf attached where a DGL model reads input-node rows (``blocks[0].srcdata[name]``, or a pair graph's
``ndata[name]``), on the device the loader's :class:`~dgl_oac.dgl_frontend.structure.StructureCopy` moved the
batch to.
"""
from __future__ import annotations

from typing import Any, List, Optional, Sequence, Tuple

import dgl

import torch

from ..engine.pipeline import BatchHook, CommitListener, TablePipeline, TableRows, validate_rows
from ..loading.settings import LoaderSettings
from ..loading.stats import LoaderStats
from .blocks import IndexGraph
from .sampling import sample_batch
from ..loading.workers import BatchWorkers
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


def hand_out(result: Any, gathered: List[TableRows], tables: Sequence[TablePipeline], mode: str,
             device: torch.device, check_finite: bool, stats: LoaderStats,
             listener: Optional[CommitListener],
             ntypes: Optional[Sequence[Optional[str]]] = None,
             hooks: Sequence[Optional[BatchHook]] = (),
             structure: Optional[StructureCopy] = None, attach_rows: bool = True) -> Tuple[Any, List[torch.Tensor]]:
    """:func:`~dgl_oac.engine.pipeline.validate_rows` of one batch of a graph sampler, and ``(result, leaves)``:
    ``result`` is the sampler's output, moved to ``device`` by ``structure`` (its copy started on the gather
    thread, or now; None only on the CPU), with each leaf attached (:func:`attach`) unless ``attach_rows`` is
    False."""
    if structure is not None:
        result = structure.finish(result)
    elif device.type != "cpu":
        raise ValueError(f"hand_out on {device} needs the loader's StructureCopy to move the batch's structure")
    ntypes = ntypes or [None] * len(tables)
    leaves = [h.leaf for h in validate_rows(gathered, tables, mode, check_finite, stats, listener, ntypes, hooks)]
    for table, r, ntype, leaf in zip(tables, gathered, ntypes, leaves):
        if attach_rows:
            attach(result, table.name, leaf, ntype)
        if r.ids_dev is not r.ids and isinstance(result, tuple):
            # hand out the device ids the batch knows, so emb(input_nodes, device) is an identity hit
            first = r.ids_dev if ntype is None else {**result[0], ntype: r.ids_dev}
            result = (first,) + result[1:]
    return result, leaves

class GraphSource:
    """Epoch ``epoch`` of ``loader``'s graph: batch b is sampled from ``seeds_of(b)`` under its own seed, or taken
    from ``workers`` (``num_workers > 0``), and handed out with each table's rows attached (``attach``) or held
    until the next batch is asked for."""

    def __init__(self, loader: Any, seeds_of: Any, epoch: int, workers: Optional[BatchWorkers],
                 structure: Optional[StructureCopy], rules: Sequence[Any], stats: LoaderStats) -> None:
        self.graph, self.graph_sampler, self.seed = loader.graph, loader.graph_sampler, loader.seed
        self.inputs, self.attach = loader.inputs, loader.attach
        self.settings: LoaderSettings = loader.settings
        self.tables = [e.pipeline for e in loader.embeddings]
        self.seeds_of, self.epoch, self.workers, self.structure = seeds_of, epoch, workers, structure
        self.rules, self.stats = rules, stats
        self.held: Optional[List[torch.Tensor]] = None  # attach=False: the leaves emb(input_nodes) reads

    def pull(self, b: int) -> Any:
        """Batch ``b``: sampled under its own seed (or taken from the sampling workers)."""
        if self.workers is not None:
            return self.workers.get(b)
        return sample_batch(self.graph, self.graph_sampler, self.seeds_of, self.seed, self.epoch, b)

    def table_ids(self, batch: Any) -> List[torch.Tensor]:
        return self.inputs.table_ids(batch)

    def hand_out(self, batch: Any, rows: List[TableRows], listener: CommitListener) -> Any:
        """Validate, attach (``attach=True``) and hand out. Without attaching, the batch's leaves are held until
        the next batch is asked for: ``emb(input_nodes)`` reads them in the meantime."""
        s = self.settings
        out, leaves = hand_out(batch, rows, self.tables, s.mode, s.device, s.check_finite, self.stats, listener,
                               self.inputs.ntypes, self.rules, self.structure, attach_rows=self.attach)
        self.held = None if self.attach else leaves
        return out

    def handed_ids(self, out: Any) -> Any:
        """The batch's ``input_nodes``, the first item of what DGL's samplers return."""
        return out[0] if isinstance(out, tuple) and out else None

    def retire(self) -> None:
        self.held = None
