"""The step: what ``SparseOptimizer.step()`` does to its tables, with one trainer or N.

Its parts, each explained below: the interfaces the engine asks of an optimizer and a committer
(:class:`RowKernel`, :class:`Committer`); :func:`combine` (one gradient per row over a step's reads);
:class:`StepPlan` (the one step, all or nothing, with the :class:`Exchange` a committer supplies); and the local
committer, :data:`LOCAL` (the step plan with one process's exchange, :class:`LocalExchange`).

What the engine asks of an optimizer and of a committer: two small interfaces, no implementation.

A **row kernel** (:class:`RowKernel`; ``dgl_oac.optim``'s optimizers are ones) is pure math over rows: it maps
``rows: float32[n, D+S]`` (value ‖ state) and ``grad: float32[n, D]`` to new rows on whatever device they are
on, and never touches a table. A **committer** (:class:`Committer`) runs a step: it combines the gradients of
the tables' ready batches, calls the kernel once per table and writes the result through each table's one
write path. Each :class:`~dgl_oac.engine.pipeline.TablePipeline` is built with its committer: the local one
(:class:`dgl_oac.engine.step.LocalCommitter`) or, for a table shared by several trainers, the distributed one
(``dgl_oac.distributed.committer``). ``SparseOptimizer.step()`` only asks it to commit its tables with itself
as the kernel.

Combine one table's reads of a step into one gradient per row: DGL's per-occurrence mean.

``dgl.nn.NodeEmbedding`` records one trace per ``emb(ids)`` call, and ``dgl.optim`` gives each row the mean of
its gradient over EVERY occurrence of it in the step, across and within calls (``unique`` + ``index_add_`` +
divide by the counts). Here the rows of a step live in :class:`~dgl_oac.engine.pipeline.HandedOut` batches (unique ids,
value ‖ state), and each read of them is a leaf with its own gradient (:meth:`HandedOut.contributions`): the hand-out
leaf (every row once) or an ``emb(ids)`` call's leaf (positions into the batch, repeats allowed). A row's
gradient is the sum over its occurrences divided by their number; rows no read with a gradient touched are not
updated (as in DGL, whose traces never name them).

Cost: nothing is copied when one leaf covers a batch (a loader step); otherwise one pass over the gradients.
Full-width rows (value ‖ state) are gathered only for unique rows, and only when several batches meet in a
step (gradient accumulation) or a batch was read in part.

Deterministic, and no host sync on a device: the sums are :mod:`dgl_oac.device.rows`' (on CPU ``index_add_``
or ``embedding_bag`` in occurrence order; on a device, :func:`~dgl_oac.device.rows.on_device`, sorted segment
sums over EVERY destination row, so no size depends on the data). What does depend on the data is planned on the
HOST from the CPU ids, before anything is copied: which rows of a batch read in part the step writes (each read's
occurrence counts, kept on the host by
:meth:`~dgl_oac.engine.pipeline.TablePipeline.read`), and the unique ids of several batches; their index tensors
reach the device through :func:`~dgl_oac.engine.transfer.to_device_now`. Counts are whole numbers: summed with
``index_add_``, they are exact in any order.

The one step plan: what ``SparseOptimizer.step()`` does to its tables, with one trainer or N.

A step, over all the optimizer's tables at once, in this order:

1. **take** (:meth:`StepPlan.take`): each table's failed write-back surfaces, its ready batches are taken, its
   batch hook found (:class:`~dgl_oac.engine.pipeline.BatchHook`);
2. **exchange in** (:meth:`Exchange.inputs`): the gradient rows reach the rows' owners; each table's
   :class:`KernelInput` is the rows this process writes and their gradients summed over every read of them;
3. **kernel** (:meth:`StepPlan.kernel`): duplicates reduced by the kernel's ``duplicate_reduction`` (mean or
   sum, :func:`.step.reduce_duplicates`), the row kernel run (into the write log's ring where there is one),
   the finite check (:func:`nonfinite`);
4. **exchange out** (:meth:`Exchange.settle`): every process's verdict, and what comes back of the step (the
   rows other owners wrote); a NaN/Inf anywhere raises here, before anything is written;
5. **write** (:meth:`StepPlan.write`): each table's step through its one write path
   (:meth:`~.pipeline.TablePipeline.commit`: overwrite and log for sync, oac and async with a hook; naive
   async's ``new - old`` added), then each batch's :class:`~.pipeline.CommitListener` hears of its commit.

Whose part is whose. The plan (this module) owns every stage but the exchange: combine, reduce, kernel, finite
check, async's delta, the write log. An :class:`Exchange` says only how gradient rows reach their owners and how
the results come back: :class:`dgl_oac.engine.step.LocalExchange` (one process, the identity: the rows are the
batches' own, brought up to date) and ``dgl_oac.distributed.committer.DistExchange`` (N trainers: all-to-all to
the owners, the kernel on the owners' rows, forwarding and mirroring). Failures: anything raised before the
writes skips the step in every table (:func:`skip`): every table and optimizer state is bitwise as before it.

The local committer: the step plan (:class:`StepPlan`) with one process's exchange, run inside
``SparseOptimizer.step()`` on the caller's thread and device stream.

Synchronisation point. When it runs, (1) backward has produced the gradients of the batches being committed
on the current stream, (2) every earlier step of each table was committed by this same thread, so the write
log is complete up to the previous step. That is why bringing held batches up to date here is exact: a row
written after a batch last saw it is replaced (from the log, or re-read after a flush) before the kernel reads
it. Nothing here waits for the write-back: the rows are handed to it (bounded) or, with no pipelined epoch
running, written through.

What a ``step()`` commits (DGL's semantics): every batch of the optimizer's tables read since the last
``step()`` whose leaf has a gradient, all in one step; a row gets the mean of its gradient over every occurrence
of it in those reads, once (:mod:`dgl_oac.engine.step`: ``dgl.optim`` averages over occurrences), or their
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

import time
import warnings
from dataclasses import dataclass
from typing import Any, List, NamedTuple, Optional, Protocol, Sequence, Tuple

import torch

from ..device import rows as device_rows
from ..device.rows import occurrences, read_counts, segment_add_, segment_sums
from .pipeline import BatchHook, Count, HandedOut, TablePipeline, hook_of
from .transfer import to_device_now


# ---- What the engine asks of an optimizer and of a committer: two small interfaces, no implementation

#: how a row's gradients over its occurrences in one step are combined before the kernel sees the row once:
#: ``"mean"`` (``dgl.optim``'s convention) or ``"sum"`` (``torch.optim.SparseAdam``'s)
REDUCTIONS = ("mean", "sum")


class RowKernel(Protocol):
    """The optimizer's math, as the committers call it. A kernel may also have ``update_checked(table, rows,
    grad, out) -> (new, finite or None)`` (``SparseOptimizer``'s): :meth:`update_table` that says whether the
    new rows are finite where it learned that on the way, so the commit's check need not read them again."""

    #: a NaN/Inf in the gradient always makes the new rows non-finite (``w - f(g, ...)``): the finite check then
    #: reads only the new rows; False makes it read the gradient too
    propagates_nonfinite: bool
    #: one of :data:`REDUCTIONS`: a duplicated row's gradient is the mean or the sum of its occurrences
    duplicate_reduction: str

    def state_width(self, dim: int) -> int:
        """Number of float32 state columns a row of ``dim`` values needs."""

    def update_rows(self, rows: torch.Tensor, grad: torch.Tensor, dim: int,
                    out: Optional[torch.Tensor] = None) -> torch.Tensor:
        """New rows ``float32[n, D+S]`` from ``rows: float32[n, D+S]`` and unique-id ``grad: float32[n, D]``,
        written into ``out`` when given (same shape and device as ``rows``, never aliasing it)."""

    def update_table(self, table: Any, rows: torch.Tensor, grad: torch.Tensor,
                     out: Optional[torch.Tensor] = None) -> torch.Tensor:
        """What the committers call for one table's step (``table``: its ``TablePipeline``, with ``name`` and
        ``store.dim``): :meth:`update_rows` with that table's dim, plus any state the kernel keeps per table
        (torch's tensor-level step count)."""


class Committer(Protocol):
    """Runs one step of a kernel over tables (all of them, or none: see :mod:`dgl_oac.engine.step`)."""

    def commit(self, kernel: RowKernel, tables: Sequence[Any]) -> None:
        """Commit every ready batch of every table in ``tables`` (:class:`~dgl_oac.engine.pipeline.TablePipeline`
        objects; not imported here, which imports this module) as one step, with ``kernel``."""


def reduce_duplicates(kernel: RowKernel, sums: torch.Tensor, counts: Optional[torch.Tensor]) -> torch.Tensor:
    """The gradient the kernel sees, ``float32[u, D]``, from the per-row ``sums: float32[u, D]`` over
    ``counts: float32[u]`` occurrences (None: one each), by the kernel's ``duplicate_reduction`` (in place)."""
    return sums if check_reduction(kernel) == "sum" else mean_(sums, counts)


def check_reduction(kernel: RowKernel) -> str:
    """The kernel's ``duplicate_reduction``, or ValueError naming what it should be."""
    how = getattr(kernel, "duplicate_reduction", "mean")
    if how not in REDUCTIONS:
        raise ValueError(f"{type(kernel).__name__}.duplicate_reduction must be one of {REDUCTIONS}, got {how!r}")
    return how


def run_kernel(kernel: RowKernel, table: Any, rows: torch.Tensor, grad: torch.Tensor,
               out: Optional[torch.Tensor], probe_grad: bool) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(new, probe)``: ``kernel.update_table`` of ``table`` over ``rows: float32[u, W]`` and ``grad: float32[u,
    D]`` (one device) into ``out`` (None: allocated), its shape checked, and ``probe``, a 0-d tensor that is
    finite when ``new`` (and ``grad`` with ``probe_grad``) are (the commits' finite check; no host sync by
    itself): a sum of them, or, where the kernel's ``update_checked`` learned it on the way, 0 or NaN. Running
    the kernel on cache-sized blocks of rows was measured and is slower in a real step: the rows come from the
    gather still in cache, and each block pays every op's dispatch again."""
    checked = getattr(kernel, "update_checked", None)  # optional: a RowKernel may have update_table alone
    if checked is None:
        new, finite = kernel.update_table(table, rows, grad, out=out), None
    else:
        new, finite = checked(table, rows, grad, out=out)
    _check_shape(kernel, new, rows)
    probe = new.sum() if finite is None else torch.tensor(0.0 if finite else float("nan"), device=new.device)
    return new, (probe + grad.sum()) if probe_grad else probe


def _check_shape(kernel: RowKernel, new: torch.Tensor, rows: torch.Tensor) -> None:
    if tuple(new.shape) != tuple(rows.shape):
        raise RuntimeError(f"{type(kernel).__name__}.update_rows returned shape {tuple(new.shape)} for rows of "
                           f"shape {tuple(rows.shape)}")


# ---- Combine one table's reads of a step into one gradient per row: DGL's per-occurrence mean

class _Sums(NamedTuple):
    """One batch's part of a step: ``sums: float32[k, D]`` and ``counts: float32[k]`` (None: every row once,
    ``sums`` is the gradient itself) on the device, for the rows ``keep: int64[k]`` of the batch (None: all of
    them, in order), on the host and as ``keep_dev`` on the device."""

    sums: torch.Tensor
    counts: Optional[torch.Tensor]
    keep: Optional[torch.Tensor] = None
    keep_dev: Optional[torch.Tensor] = None


def _touched(parts: list, counts: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(keep, keep_dev)``: the rows some read touched, ``int64[k]`` on the host and on the device. On a device
    from the reads' host counts; a read made without them (not through ``TablePipeline.read``) leaves only the
    device's counts, whose non-zeros are a host sync."""
    if device_rows.on_device(counts.device) and all(segments is not None for _, _, _, segments in parts):
        hit = torch.zeros(counts.shape[0], dtype=torch.bool)
        for _, _, _, (_, host_counts) in parts:
            hit |= host_counts > 0
        keep = hit.nonzero().squeeze(1)  # host
        return keep, to_device_now(counts.device, keep)[0]
    keep_dev = counts.nonzero().squeeze(1)  # a host sync on a device (see the docstring)
    return keep_dev.cpu(), keep_dev


def _batch_sums(b: HandedOut, dim: int) -> _Sums:
    """``b``'s part of the step over its leaves with a gradient (:class:`_Sums`)."""
    parts = b.contributions()
    if len(parts) == 1 and parts[0][0] is None:
        return _Sums(parts[0][1], None)  # one leaf over the whole batch: its gradient as is (no copy)
    n = b.rows.shape[0]
    if len(parts) == 1 and parts[0][3] is not None and parts[0][2]:  # one emb(ids) of every row: sums by segment
        pos, grad, _, (order, host_counts) = parts[0]
        counts = read_counts(pos, host_counts, n)
        return _Sums(segment_sums(grad, order, counts), counts.to(grad.dtype))
    sums = torch.zeros(n, dim, dtype=parts[0][1].dtype, device=parts[0][1].device)
    counts = torch.zeros(n, dtype=sums.dtype, device=sums.device)
    covered = False
    for pos, grad, whole, segments in parts:
        if pos is None:
            sums.add_(grad)
            counts.add_(1.0)
        elif segments is not None:
            c = read_counts(pos, segments[1], n)
            sums.add_(segment_sums(grad, segments[0], c))
            counts.add_(c.to(counts.dtype))
        else:
            segment_add_(sums, pos, grad)
            counts.add_(occurrences(pos, n, counts.dtype))
        covered = covered or whole
    if covered:
        return _Sums(sums, counts)
    keep, keep_dev = _touched(parts, counts)
    return _Sums(sums.index_select(0, keep_dev), counts.index_select(0, keep_dev), keep, keep_dev)


def combine(batches: Sequence[HandedOut], dim: int
            ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
    """``(ids_cpu[u], ids_dev[u], rows[u, W], sums[u, D], counts[u] or None)`` over a step's ready ``batches``
    (read order): each row read with a gradient once, its rows from the first batch that has it, its gradient
    summed over its occurrences (``counts``: how many; None: one each). The mean is ``sums / counts``."""
    per: List[Tuple[HandedOut, _Sums]] = [(b, _batch_sums(b, dim)) for b in batches]
    if len(per) == 1:
        b, s = per[0]
        if s.keep is None:
            return b.ids, b.ids_dev, b.rows, s.sums, s.counts
        return b.ids[s.keep], b.ids_dev.index_select(0, s.keep_dev), b.rows.index_select(0, s.keep_dev), \
            s.sums, s.counts
    rows = torch.cat([b.rows if s.keep is None else b.rows.index_select(0, s.keep_dev) for b, s in per])
    sums = torch.cat([s.sums for _, s in per])
    counts = torch.cat([torch.ones(s.sums.shape[0], dtype=sums.dtype, device=sums.device) if s.counts is None
                        else s.counts for _, s in per])
    # the step's rows, planned on the host from the CPU ids (on a device the number of unique ids is a sync)
    ids = torch.cat([b.ids if s.keep is None else b.ids[s.keep] for b, s in per])
    uniq, inverse = torch.unique(ids, return_inverse=True)
    first = torch.full((uniq.numel(),), inverse.numel(), dtype=torch.int64)
    first.scatter_reduce_(0, inverse, torch.arange(inverse.numel()), "amin")  # each row's first batch (order-free)
    uniq_dev, inverse, first = to_device_now(sums.device, uniq, inverse, first)
    total = segment_add_(torch.zeros(uniq.numel(), dim, dtype=sums.dtype, device=sums.device), inverse, sums)
    # whole numbers: exact in any order, so index_add_ is deterministic here even with atomics
    reads = torch.zeros(uniq.numel(), dtype=sums.dtype, device=sums.device).index_add_(0, inverse, counts)
    return uniq, uniq_dev, rows.index_select(0, first), total, reads


def mean_(sums: torch.Tensor, counts: Optional[torch.Tensor]) -> torch.Tensor:
    """``sums / counts`` per row, in place (``counts`` None: already a mean)."""
    return sums if counts is None else sums.div_(counts.unsqueeze(1))


# ---- The one step plan: what ``SparseOptimizer.step()`` does to its tables, with one trainer or N

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
        table.drop_ready()


class StepPlan:
    """Runs a step (the :class:`~.step.Committer` of the tables it is given to) with its exchange."""

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
            with torch.profiler.record_function("dgl_oac.commit"):
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
        batches = table.take_ready()
        return TableStep(table, batches, hook_of(table.name, batches), time.perf_counter())

    @staticmethod
    def combine(s: TableStep) -> Sums:
        """:data:`Sums` of the step's batches, for stage 2 (whichever exchange runs it): every occurrence of a row
        in them counts as a read (:func:`.step.combine`; no batch: empty, on the CPU)."""
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
        release its batches and tell their listeners (:class:`~.pipeline.CommitListener`)."""
        with torch.no_grad():
            u.table.commit(u.batches, u.ids, u.ids_dev, u.new, delta_from=u.rows if u.delta else None,
                           forwarded=u.forwarded, new_host=u.new_host)
        elapsed = time.perf_counter() - u.t0
        for b in u.batches:
            if b.listener is not None:
                b.listener.committed(b, elapsed, u.repatched)


# ---- The local committer: the step plan with one process's exchange

class LocalExchange:
    """One process's :class:`~.step.Exchange`, the identity: this process owns every row, and the rows the
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
    """The committer of a table trained in this process alone (:class:`~dgl_oac.engine.step.Committer`)."""

    def __init__(self) -> None:
        super().__init__(LocalExchange())


#: the one local committer (it holds no state): every table trained in one process is given it
LOCAL = LocalCommitter()
