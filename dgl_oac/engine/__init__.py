"""The engine: one table's state and the batches in flight through it (ARCHITECTURE.md draws the schedule).

It imports nothing from the layers above it (``embedding``, ``loading``, ``dgl_frontend``, ``optim``,
``baselines``, ``app``); they plug in through named interfaces: :class:`~.step.RowKernel` and
:class:`~.step.Committer` (optimizers, committers), :class:`~.pipeline.BatchHook` (baselines),
:class:`~.pipeline.CommitListener` and :class:`~.pipeline.HandOutStats` (a loader's epoch and its stats).

Modules, from the bottom up:

* :mod:`.runtime` -- the background runtime: worker threads, how they share the cores, libgomp's spin, finalizers;
* :mod:`.transfer` -- host <-> device copies, pinned buffer pools, the one stream hand-off;
* :mod:`.table` -- one table's state and its writer: rows, versions and write log, reads, write-back, write path;
* :mod:`.pipeline` -- a batch's motion through a table (gather, hand-out, pending, refresh), behind
  ``TablePipeline``;
* :mod:`.step` -- the step: combine, kernel, the step plan and its local exchange;
* :mod:`.syncaudit`, :mod:`.table_view` -- the host-sync audit; ``emb.weight``, whose writes are logged steps.
"""
