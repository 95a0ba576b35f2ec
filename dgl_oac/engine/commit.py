"""The local committer: the step plan (:mod:`.step_plan`) with one process's exchange, run inside
``SparseOptimizer.step()`` on the caller's thread and device stream.

Synchronisation point. When it runs, (1) backward has produced the gradients of the batches being committed
on the current stream, (2) every earlier step of each table was committed by this same thread, so the write
log is complete up to the previous step. That is why bringing held batches up to date here is exact: a row
written after a batch last saw it is replaced (from the log, or re-read after a flush) before the kernel reads
it. Nothing here waits for the write-back: the rows are handed to it (bounded) or, with no pipelined epoch
running, written through.

What a ``step()`` commits (DGL's semantics): every batch of the optimizer's tables read since the last
``step()`` whose leaf has a gradient, all in one step; a row gets the mean of its gradient over every occurrence
of it in those reads, once (:mod:`dgl_oac.engine.combine`: ``dgl.optim`` averages over occurrences), or their
sum for a kernel whose ``duplicate_reduction`` is ``"sum"`` (``torch.optim.SparseAdam``'s convention). Batches
without a gradient stay pending; they are released when their leaves die.

Per kind of read: sync and oac rows are current, and the step overwrites them; async rows may be stale, and the
table gets ``new - old`` added (Marius-style: no update is lost, but it was computed from stale rows). Async
batches with a hook (:mod:`dgl_oac.engine.pipeline`) are first brought to the current rows by it (which may
rescale their gradients), then overwritten and logged like oac's.

Failures: every check (finite values, a failed write-back) runs for every table of the optimizer before
anything is written, so a rejected batch (``FloatingPointError`` for NaN/Inf) leaves every table and every
optimizer state bitwise as before it; the batch is skipped (its reads closed, its gradient never re-applied).
"""
from __future__ import annotations

from typing import List, Optional

from .kernel import RowKernel
from .step_plan import KernelInput, StepPlan, TableStep, Update


class LocalExchange:
    """One process's :class:`~.step_plan.Exchange`, the identity: this process owns every row, and the rows the
    kernel reads are its batches' own, brought up to date; nothing comes back."""

    def inputs(self, kernel: RowKernel, steps: List[TableStep]) -> List[Optional[KernelInput]]:
        return [self._input(s) if s.batches else None for s in steps]

    @staticmethod
    def _input(s: TableStep) -> KernelInput:
        """Bring the batches' rows to the newest step (held batches refreshed; async ones by their hook, which
        may rescale their gradients), then combine them."""
        s.repatched = sum(s.table.refresh(b) for b in s.batches)
        if s.hook is not None:
            s.repatched += s.hook.before_kernel(s.table, [b for b in s.batches if b.hook is s.hook])
        return KernelInput(*StepPlan.combine(s))

    def settle(self, kernel: RowKernel, updates: List[Update], problems: List[str]) -> None:
        if problems:
            raise FloatingPointError(f"NaN or Inf in {problems[0]}; the batch was skipped, the table and optimizer "
                                     f"state are as they were before it")


class LocalCommitter(StepPlan):
    """The committer of a table trained in this process alone (:class:`~dgl_oac.engine.kernel.Committer`)."""

    def __init__(self) -> None:
        super().__init__(LocalExchange())


#: the one local committer (it holds no state): every table trained in one process is given it
LOCAL = LocalCommitter()
