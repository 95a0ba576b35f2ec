"""N trainers on torch.distributed (one process per trainer; gloo on CPU, NCCL between GPUs).

Active when ``torch.distributed`` is initialised with more than one rank before a
:class:`~dgl_oac.NodeEmbedding` is built (DGL's rule): the table is then shared by every rank of the machine
(:mod:`.shared`; one replica per machine), each row has one owner, its single writer (:mod:`.partition`: contiguous ranges), and a
sparse optimizer's ``step()`` is the N-trainer sync step (:mod:`.committer`, the tables' committer): every row in the union of the trainers'
batches gets one update, with its gradient averaged over the reads that touched it, as ``dgl.optim`` does. A
loader in
``mode="oac"`` reads ahead and stays bitwise equal to that: owners forward the rows each trainer has in flight.

Modules: :mod:`.group` (the ranks and their collectives, failures named by rank), :mod:`.partition` (who owns a
row), :mod:`.exchange` (uneven all-to-all of rows), :mod:`.shared` (the shared table), :mod:`.inflight`
(registration of reads with owners), :mod:`.committer` (the commit of one step across ranks), :mod:`.split`
(``use_ddp`` index splitting), :mod:`.dense` (DDP's dense gradient average for ``dgl-oac train``), :mod:`.distgraph`
(DGL's DistGraph as the graph; a DistGraph cluster on this machine), :mod:`.report` (a child process's result,
sent to its parent).
"""
from .group import Group, current_group

__all__ = ["Group", "current_group"]
