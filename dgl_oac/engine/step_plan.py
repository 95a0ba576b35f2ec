"""The one step plan: what ``SparseOptimizer.step()`` does to its tables, with one trainer or N.

A step, over all the optimizer's tables at once, in this order:

1. **take** (:meth:`StepPlan.take`): each table's failed write-back surfaces, its ready batches are taken, its
   batch hook found (:mod:`.hooks`);
2. **exchange in** (:meth:`Exchange.inputs`): the gradient rows reach the rows' owners; each table's
   :class:`KernelInput` is the rows this process writes and their gradients summed over every read of them;
3. **kernel** (:meth:`StepPlan.kernel`): duplicates reduced by the kernel's ``duplicate_reduction`` (mean or
   sum, :func:`.kernel.reduce_duplicates`), the row kernel run (into the write log's ring where there is one),
   the finite check (:func:`nonfinite`);
4. **exchange out** (:meth:`Exchange.settle`): every process's verdict, and what comes back of the step (the
   rows other owners wrote); a NaN/Inf anywhere raises here, before anything is written;
5. **write** (:meth:`StepPlan.write`): each table's step through its one write path
   (:meth:`~.pipeline.TablePipeline.commit`: overwrite and log for sync, oac and async with a hook; naive
   async's ``new - old`` added), then each batch's :class:`~.batch.CommitListener` hears of its commit.

Whose part is whose. The plan (this module) owns every stage but the exchange: combine, reduce, kernel, finite
check, async's delta, the write log. An :class:`Exchange` says only how gradient rows reach their owners and how
the results come back: :class:`dgl_oac.engine.commit.LocalExchange` (one process, the identity: the rows are the
batches' own, brought up to date) and ``dgl_oac.distributed.committer.DistExchange`` (N trainers: all-to-all to
the owners, the kernel on the owners' rows, forwarding and mirroring). Failures: anything raised before the
writes skips the step in every table (:func:`skip`): every table and optimizer state is bitwise as before it.
"""
from __future__ import annotations

import time
import warnings
from dataclasses import dataclass
from typing import List, Optional, Protocol, Sequence, Tuple

import torch

from .pipeline import HandedOut
from .combine import combine
from .pipeline import BatchHook, hook_of
from .kernel import RowKernel, reduce_duplicates, run_kernel
from .pipeline import TablePipeline
from .pipeline import Count

#: ``(ids_cpu[u], ids_dev[u], rows[u, W], sums[u, D], counts[u] or None)``: a step's reads of one table combined
Sums = Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, Optional[torch.Tensor]]


@dataclass(eq=False)
class TableStep:
    """One table's part of a step, from :meth:`StepPlan.take` on."""

    table: TablePipeline
    batches: List[HandedOut]  # the ready batches the step commits (read order)
    hook: Optional[BatchHook]  # their async hook, if any
    t0: float                 # when the step took them (perf_counter: the batches' commit seconds)
    repatched: Count = 0      # rows brought up to date at the commit (int, or a 0-d device tensor: no sync)

    @property
    def check_finite(self) -> bool:
        """Whether the step checks for NaN/Inf: one of its batches asks to (no batch: the other ranks' rows)."""
        return not self.batches or any(b.check_finite for b in self.batches)


@dataclass(eq=False)
class KernelInput:
    """What one table's kernel runs on in this process: the rows it writes and their gradients."""

    ids: torch.Tensor               # int64[u], CPU, unique
    ids_dev: torch.Tensor           # int64[u], on the device the step is logged on
    rows: torch.Tensor              # float32[u, W]: value ‖ state the kernel reads, current
    sums: torch.Tensor              # float32[u, D]: each row's gradient summed over its reads
    counts: Optional[torch.Tensor]  # float32[u]: how many reads (None: one each)
    #: the rows are their owner's, the gradients other trainers' too (distributed): the kernel runs on the host,
    #: its result is copied to ``ids_dev``'s device for the log only, always overwrites (the owner's rows are
    #: current, so async has no delta), and a non-finite gradient is its sender's to report
    owners: bool = False
    problem: str = ""               # a NaN/Inf found before the kernel (a sender's own gradients)


@dataclass(eq=False)
class Update:
    """One table's computed (not yet written) step."""

    table: TablePipeline
    batches: List[HandedOut]
    ids: torch.Tensor       # int64[u], CPU, unique
    ids_dev: torch.Tensor   # int64[u], device
    rows: torch.Tensor      # float32[u, W]: what the kernel read (device; owners: CPU)
    grad: torch.Tensor      # float32[u, D]: the reduced gradient the kernel saw
    new: torch.Tensor       # float32[u, W], device: what the step writes
    delta: bool             # naive async: the table gets new - rows added
    hook: Optional[BatchHook]
    repatched: Count
    t0: float
    forwarded: Optional[Tuple[torch.Tensor, torch.Tensor]] = None  # distributed: rows other owners wrote
    new_host: Optional[torch.Tensor] = None  # ``new`` on the CPU where the kernel ran there (distributed owners)


class Exchange(Protocol):
    """How a step's gradient rows reach the rows' owners and how the results come back (see the module
    docstring)."""

    def inputs(self, kernel: RowKernel, steps: List[TableStep]) -> List[Optional[KernelInput]]:
        """Each table's :class:`KernelInput` (None: this process writes nothing of it)."""

    def settle(self, kernel: RowKernel, updates: List[Update], problems: List[str]) -> None:
        """The verdict (``problems``: this process's NaN/Inf, :func:`nonfinite`'s descriptions; raise
        ``FloatingPointError`` if any process has one) and what comes back (``Update.forwarded``). Runs before
        anything is written."""


def nonfinite(name: str, ids: torch.Tensor, parts: Sequence[Tuple[str, torch.Tensor]]) -> str:
    """Which of ``parts`` (``(what, float32[u, k])``, rows of ``ids: int64[u], CPU``) is the first with a NaN or
    Inf, in how many rows, at which ids; "" if none."""
    for what, bad in parts:
        if bad.numel() and not bool(torch.isfinite(bad).all()):
            mask = (~torch.isfinite(bad)).any(1).cpu()
            k = int(mask.sum())
            return f"{what} of NodeEmbedding {name!r}: {k} of {ids.numel()} rows, ids {ids[mask][:5].tolist()}" \
                   f"{' ...' if k > 5 else ''}"
    return ""


def gradient_problem(name: str, ids: torch.Tensor, sums: torch.Tensor) -> str:
    """The finite check of gradients alone, ``sums: float32[u, D]`` of rows ``ids``: one host sync on a sum; the
    exact per-row check only if it is not finite (a NaN/Inf, or a sum of finite values that overflowed)."""
    return "" if bool(torch.isfinite(sums.sum())) else nonfinite(name, ids, [("the gradient", sums)])


def skip(tables: Sequence[TablePipeline]) -> None:
    """Drop the tables' ready batches (their gradients are never applied, their reads closed)."""
    for table in tables:
        for b in table.batches.ready():
            table.release(b)


class StepPlan:
    """Runs a step (the :class:`~.kernel.Committer` of the tables it is given to) with its exchange."""

    def __init__(self, exchange: Exchange) -> None:
        self.exchange = exchange

    def commit(self, kernel: RowKernel, tables: Sequence[TablePipeline]) -> None:
        """Commit every ready batch of every table in ``tables`` as one step, with ``kernel``.

        All or nothing for everything that can be checked first: each table's update is computed and checked
        (finite, shapes, no failed write-back) before any table, log or clock is touched. On such a failure the
        batch is skipped in every table (its gradients dropped, its reads closed) and the error is raised: the
        tables and optimizer state are bitwise as before it. A failure while writing (an I/O error in a
        write-through, a device->host copy) skips the batch in the tables not yet written.
        """
        try:
            with torch.profiler.record_function("dgl_oac.engine.commit"):
                steps = [self.take(table) for table in tables]
                inputs = self.exchange.inputs(kernel, steps)
                planned = [self.kernel(kernel, s, inp) for s, inp in zip(steps, inputs) if inp is not None]
                updates = [u for u, _ in planned]
                self.exchange.settle(kernel, updates, [p for _, p in planned if p])
                for u in updates:
                    if u.hook is not None:
                        u.hook.after_kernel(u.rows, u.new)  # a statistic of the steps written, not table state
        except BaseException:
            skip(tables)
            raise
        if not updates:
            warnings.warn(f"{type(kernel).__name__}.step() found nothing to commit: no row read since the last "
                          f"step() has a gradient (was backward() called, and were the rows read with grad "
                          f"enabled?)", stacklevel=3)
            return
        for i, u in enumerate(updates):
            try:
                self.write(u)
            except BaseException:
                skip([rest.table for rest in updates[i + 1:]])
                raise

    @staticmethod
    def take(table: TablePipeline) -> TableStep:
        """Stage 1: ``table``'s ready batches (a failed write-back surfaces here, at the next ``step()``)."""
        table.check()
        batches = table.batches.ready()
        return TableStep(table, batches, hook_of(table.name, batches), time.perf_counter())

    @staticmethod
    def combine(s: TableStep) -> Sums:
        """:data:`Sums` of the step's batches, for stage 2 (whichever exchange runs it): every occurrence of a row
        in them counts as a read (:func:`.combine.combine`; no batch: empty, on the CPU)."""
        if not s.batches:
            w, d = s.table.store.width, s.table.store.dim
            none = torch.empty(0, dtype=torch.int64)
            return none, none, torch.empty(0, w), torch.empty(0, d), None
        return combine(s.batches, s.table.store.dim)

    @staticmethod
    def kernel(kernel: RowKernel, s: TableStep, inp: KernelInput) -> Tuple[Update, str]:
        """Stage 3: ``(update, problem)``, the table's step computed and checked for NaN/Inf (``problem``:
        :func:`nonfinite`'s description, "" if none); touches no table, log or clock."""
        table, dim = s.table, s.table.store.dim
        grad = reduce_duplicates(kernel, inp.sums, inp.counts)
        out = None if inp.owners else table.kernel_out(inp.ids.numel(), inp.rows.device)
        with torch.no_grad():
            # NaN/Inf in the gradient or the rows read makes `new` non-finite too for the built-in kernels
            # (``propagates_nonfinite``), so their new rows alone are summed; a custom kernel could hide it, so its
            # gradient is summed as well (an owner's gradients were checked by their senders). Fast path: one host
            # sync on a sum (one vectorised pass; isfinite() materialises a mask); only if it is not finite (or a
            # sum of finite values overflowed) does the exact per-row check run.
            new, probe = run_kernel(kernel, table, inp.rows, grad, out,
                                    probe_grad=not inp.owners and not kernel.propagates_nonfinite)
            problem = inp.problem
            if not problem and s.check_finite and not bool(torch.isfinite(probe)):
                sent = inp.owners and not bool(torch.isfinite(grad).all())  # its sender reports it
                if not sent and not bool(torch.isfinite(new).all() & torch.isfinite(grad).all()):
                    problem = nonfinite(table.name, inp.ids, [
                        ("the rows read from the table (values)", inp.rows[:, :dim]),
                        ("the rows read from the table (optimizer state)", inp.rows[:, dim:]),
                        ("the gradient", grad), ("the optimizer's update (overflow)", new)])
        if inp.owners:
            return Update(table, s.batches, inp.ids, inp.ids_dev, inp.rows, grad, new.to(inp.ids_dev.device),
                          False, s.hook, s.repatched, s.t0, new_host=new), problem
        return Update(table, s.batches, inp.ids, inp.ids_dev, inp.rows, grad, new, any(b.adds for b in s.batches),
                      s.hook, s.repatched, s.t0), problem

    @staticmethod
    def write(u: Update) -> None:
        """Stage 5: write the step (through the table's one path: write-back or write-through, log), then
        release its batches and tell their listeners (:class:`~.batch.CommitListener`)."""
        with torch.no_grad():
            u.table.commit(u.batches, u.ids, u.ids_dev, u.new, delta_from=u.rows if u.delta else None,
                           forwarded=u.forwarded, new_host=u.new_host)
        elapsed = time.perf_counter() - u.t0
        for b in u.batches:
            if b.listener is not None:
                b.listener.committed(b, elapsed, u.repatched)
