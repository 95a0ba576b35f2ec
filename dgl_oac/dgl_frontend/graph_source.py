"""One epoch of a :class:`dgl_oac.DataLoader`'s graph: :class:`GraphSource`, the epoch's
:class:`~dgl_oac.loading.source.BatchSource`."""
from __future__ import annotations

from typing import Any, List, Optional, Sequence

import torch

from ..engine.pipeline import CommitListener, TableRows
from ..loading.stats import LoaderStats
from ..loading.settings import LoaderSettings
from .handout import hand_out
from .sampling import sample_batch
from .sampling.workers import SampleWorkers
from .structure import StructureCopy


class GraphSource:
    """Epoch ``epoch`` of ``loader``'s graph: batch b is sampled from ``seeds_of(b)`` under its own seed, or taken
    from ``workers`` (``num_workers > 0``), and handed out with each table's rows attached (``attach``) or held
    until the next batch is asked for."""

    def __init__(self, loader: Any, seeds_of: Any, epoch: int, workers: Optional[SampleWorkers],
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

    def retire(self) -> None:
        self.held = None
