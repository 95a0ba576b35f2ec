"""The distributed committer: the N-trainer sync step, what ``SparseOptimizer.step()`` runs for tables built after
``init_process_group`` (:class:`DistCommitter`, the :class:`~dgl_oac.engine.step.Committer` they are given).

It is the one step plan (:mod:`dgl_oac.engine.step`: combine, reduce, kernel, finite check, the writes)
with this module's exchange, :class:`DistExchange`: how the gradient rows reach their owners (step 1 below, the
plan's ``inputs``) and what comes back (step 2, its ``settle``); the barrier and the reads' release (step 4)
wrap the plan.

Semantics (DGL's multi-process convention, measured with ``dgl.nn.NodeEmbedding`` + ``dgl.optim``): in step t
every trainer has read rows at version t-1; each row in the union of the trainers' batches gets ONE optimizer
update, with the mean of the gradients of every read of it, on every rank (a row read once by each of two
trainers with gradients 1 and 3 is updated as a row read once with 2). Every rank calls ``step()`` for every
step, also with nothing read (an empty batch): it still takes part in the collectives.

The step t, on every rank, over all the optimizer's tables at once: two exchanges (each one all-to-all of sizes
and one of data, every table's parts of a destination in one frame: :func:`.exchange.pack_frame`), then the
writes.

1. **Registration and gradients.** Per table, to each owner: the reads this trainer opened (+1) and released
   (-1) since the last step (:mod:`.inflight`), and ``id ‖ reads ‖ gradient sum`` of the rows it read (per
   unique id, over every read of it). As an owner: apply the registrations; add the gradient parts in
   source-rank order (each part has unique ids, so every ``index_add_`` is order-free: the result does not
   depend on arrival order or thread counts), divide by the reads (not for a kernel whose
   ``duplicate_reduction`` is ``"sum"``), and run the row kernel on its rows as they are (version t-1).
2. **Decision, forwarding and mirroring.** To every rank: whether anything was not finite here (one rank's
   NaN/Inf skips the step on every rank: every table untouched, the step's number used by an empty step so
   that reads opened meanwhile stay right); per table, the values of the written rows that rank has in flight
   (forwarding); for a replicated table on several machines, the written rows (value ‖ state) to one rank of
   every other machine, which writes them into its machine's replica (:func:`mirror_targets`; :mod:`.shared`)
   once the decision is known.
3. **Writes.** Each rank commits through its tables' pipelines (the single-process commit: its own rows written
   through, its own and the forwarded rows logged as step t, batches released, loader hooks); the clock
   publishes t.
4. A replicated table's reads were held back since step 1 (:mod:`.inflight`): a barrier, so that none reads a
   replica before every owner and mirror has written t in it; then reads open again. A sharded table needs no
   barrier and never held reads back: a read opened during the step reads version t, and each owner serves it
   once t is in its rows (:mod:`.rowserver`), so the gather thread's requests travel while the step runs.

Why this order: registrations must reach owners before they decide what to forward (1 before 2); the decision
must be known everywhere before anything is written (2 before 3); a read that will miss no write must either be
registered before the owners forward (a read opened before step 1) or see the written rows (version t).

OAC with N trainers is this step plus the single-process hand-out: a batch read at version v was registered at
step v + 1 at the latest, so every later write of its rows is in its trainer's log, whoever the owner;
validation patches them as in one process (a torn read belongs to a step after v, so it is patched too). Cost
over sync: 8 bytes per read row for the registration and the values of the rows written while in flight.
"""
from __future__ import annotations

import os
import weakref
from typing import List, Optional, Sequence, Tuple

import torch

from ..config import mirror_from_env
from ..engine.step import KernelInput, RowKernel, StepPlan, TableStep, Update, gradient_problem, run_kernel, skip
from ..engine.pipeline import TablePipeline
from .exchange import exchange_frames, pack_ids, unpack_ids
from .group import Group
from .shared import SharedRowStore


def local_sums(s: TableStep) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(ids: int64[u], reads: float32[u], grad_sum: float32[u, D])``, CPU, over this rank's ready batches of
    the step (:meth:`StepPlan.combine`: every occurrence of a row in them counts as a read)."""
    ids, _, _, sums, counts = StepPlan.combine(s)
    return ids, torch.ones(ids.numel()) if counts is None else counts.cpu(), sums.cpu()


def owner_sums(parts: Sequence[torch.Tensor], dim: int) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(ids: int64[u], grad_sum: float32[u, D], reads: float32[u])`` from the parts ``float32[n_r, 3 + D]`` each
    rank sent, added in rank order (deterministic): each row's gradient summed over its reads on every rank, and
    their number (the plan reduces them: :func:`~dgl_oac.engine.step.reduce_duplicates`)."""
    ids = [unpack_ids(p[:, :2]) for p in parts]
    uniq, inverse = torch.unique(torch.cat(ids), return_inverse=True)
    total = torch.zeros(uniq.numel(), dim)
    reads = torch.zeros(uniq.numel())
    for p, inv in zip(parts, inverse.split([i.numel() for i in ids])):
        reads.index_add_(0, inv, p[:, 2])
        total.index_add_(0, inv, p[:, 3:])
    return uniq, total, reads


def _outgoing(s: TableStep, group: Group, step: int) -> Tuple[List[torch.Tensor], str]:
    """``(frame parts, problem)``: this trainer's registration ``float32[a_r, 3]`` and gradient ``float32[g_r,
    3 + D]`` parts of the table for each owner ``r`` (2 parts a rank, rank order), and what of its gradients is
    not finite ("" if nothing, or no check)."""
    dist = s.table.dist
    added, gone = dist.registry.take(step, [b.registration for b in s.batches])
    ids = torch.cat([added, gone])
    delta = torch.cat([torch.ones(added.numel()), -torch.ones(gone.numel())])
    order, counts = dist.partition.by_owner(ids)
    reg = torch.cat([pack_ids(ids), delta.unsqueeze(1)], 1)[order].split(counts)
    ids, reads, sums = local_sums(s)
    order, counts = dist.partition.by_owner(ids)
    grad = torch.cat([pack_ids(ids), reads.unsqueeze(1), sums], 1)[order].split(counts)
    problem = gradient_problem(s.table.name, ids, sums) if s.check_finite else ""
    return [x for r in range(group.world) for x in (reg[r], grad[r])], problem


def _register(table: TablePipeline, parts: Sequence[torch.Tensor]) -> None:
    """As an owner, apply each trainer's registration part ``float32[a, 3]`` (``id ‖ ±1``), in rank order."""
    for trainer, part in enumerate(parts):
        got = unpack_ids(part[:, :2])
        sign = part[:, 2] > 0
        table.dist.book.apply(trainer, got[sign], +1)
        table.dist.book.apply(trainer, got[~sign], -1)


def _owned(s: TableStep, grads: Sequence[torch.Tensor], problem: str) -> KernelInput:
    """As an owner, the kernel's input: this owner's rows as they are, with the gradients every trainer sent
    (``grads``, rank order). ``problem``: what of this trainer's own gradients was not finite."""
    owned, sums, reads = owner_sums(grads, s.table.store.dim)
    dev = s.table.log.device if s.table.log is not None else torch.device("cpu")
    # the kernel runs on the host (the owner's rows and the exchanged gradients are CPU tensors); the device
    # copy is for the write log only, and the host one is what the table, forwarding and mirroring use
    return KernelInput(owned, owned.to(dev), s.table.store.gather(owned), sums, reads, owners=True, problem=problem)


def forward_parts(table: TablePipeline, owned: torch.Tensor, new: torch.Tensor,
                  group: Group) -> List[torch.Tensor]:
    """As an owner, what each trainer gets of this step: ``id ‖ new value`` of the written rows it has in flight
    (``float32[n_r, 2 + D]``; nothing to itself: its own log holds every row it writes). Values only: a trainer
    patches its batches' values; the optimizer state is the owner's alone. ``new``: CPU, ``float32[u, W]``."""
    book = table.dist.book
    rows = torch.cat([pack_ids(owned), new[:, : table.store.dim]], 1)
    return [rows[:0] if r == group.rank else rows[book.held_by(r, owned)] for r in range(group.world)]


def mirror_targets(group: Group) -> List[int]:
    """The ranks this rank sends its written rows to: one on every other machine (the rank at this rank's
    position on its own machine, wrapped around), so each machine's replica gets every written row once."""
    i = group.machines[group.machine].index(group.rank)
    return [ranks[i % len(ranks)] for m, ranks in enumerate(group.machines) if m != group.machine]


#: what a replicated table's other machines get of a step (``DGL_OAC_MIRROR``, read once at import):
#: ``"step"``, each written row's id and averaged gradient, and they run the row kernel on their replica's rows
#: (2 + D floats a row; bitwise the owner's rows: the kernel is row-wise and deterministic); or ``"rows"``, the
#: written rows themselves (2 + D + S floats a row; no kernel there). benchmarks/shard_memory.py --mirror
#: measures both.
MIRROR = mirror_from_env(os.environ)


def _mirror_parts(u: Update, group: Group) -> List[torch.Tensor]:
    """A replicated table on several machines: what this step's written rows send to each rank that writes them
    into its machine's replica (:func:`mirror_targets`, :data:`MIRROR`); otherwise nothing."""
    payload = u.grad if MIRROR == "step" else u.new_host
    if len(group.machines) < 2 or not isinstance(u.table.store, SharedRowStore):
        return [torch.empty(0, 2 + payload.shape[1])] * group.world
    message = torch.cat([pack_ids(u.ids), payload], 1)
    targets = set(mirror_targets(group))
    return [message if r in targets else message[:0] for r in range(group.world)]


def _apply_mirrored(table: TablePipeline, kernel: RowKernel, got: torch.Tensor) -> None:
    """Write into this machine's replica what other machines' owners sent (:func:`_mirror_parts`)."""
    if not got.shape[0]:
        return
    ids, payload = unpack_ids(got[:, :2]), got[:, 2:]
    if MIRROR == "rows":  # (every rank has the same MIRROR: set before the processes start)
        table.store.write(ids, payload)
        return
    with torch.no_grad():
        table.store.write(ids, run_kernel(kernel, table, table.store.gather(ids), payload, None, False)[0])


class DistExchange:
    """The :class:`~dgl_oac.engine.step.Exchange` of a :class:`Group`'s tables: the two exchanges of the
    module docstring (1 in :meth:`inputs`, 2 in :meth:`settle`). Collective."""

    def __init__(self, group: Group) -> None:
        self.group = group

    def inputs(self, kernel: RowKernel, steps: List[TableStep]) -> List[Optional[KernelInput]]:
        group, world = self.group, self.group.world
        step = steps[0].table.steps
        outgoing = [_outgoing(s, group, step) for s in steps]
        frames = [[p for parts, _ in outgoing for p in parts[2 * r:2 * r + 2]] for r in range(world)]
        got = exchange_frames(group, frames, ("registration", "gradients"),
                              f"step {step}: reads and gradients to owners")
        inputs: List[Optional[KernelInput]] = []
        for i, (s, (_, problem)) in enumerate(zip(steps, outgoing)):
            _register(s.table, [got[r][2 * i] for r in range(world)])
            inputs.append(_owned(s, [got[r][2 * i + 1] for r in range(world)], problem))
        return inputs

    def settle(self, kernel: RowKernel, updates: List[Update], problems: List[str]) -> None:
        group, world = self.group, self.group.world
        tables = [u.table for u in updates]
        step, mine = tables[0].steps, "; ".join(problems)
        flag = torch.tensor([[1.0 if mine else 0.0]])
        out = [forward_parts(u.table, u.ids, u.new_host, group) for u in updates]
        mirror = [_mirror_parts(u, group) for u in updates]
        frames = [[flag] + [x for i in range(len(updates)) for x in (out[i][r], mirror[i][r])]
                  for r in range(world)]
        got = exchange_frames(group, frames, ("decision", "forwarding", "mirror"),
                              f"step {step}: decision, written rows to the trainers reading them and the other "
                              f"machines")
        failing = [r for r in range(world) if float(got[r][0]) != 0.0]
        if failing:
            skip(tables)
            for table in tables:
                table.consume_step()
            raise FloatingPointError(
                f"NaN or Inf in step {step} on rank(s) {failing}{f' (here: {mine})' if mine else ''}; the step was "
                f"skipped on every rank: every table and optimizer state is as it was before it")
        for i, u in enumerate(updates):
            fwd = torch.cat([got[r][1 + 2 * i] for r in range(world)])
            rows = torch.zeros(fwd.shape[0], u.new.shape[1])  # state columns zero: batches' state is never used
            rows[:, : fwd.shape[1] - 2] = fwd[:, 2:]
            u.forwarded = (unpack_ids(fwd[:, :2]).to(u.ids_dev.device), rows.to(u.new.device))
            _apply_mirrored(u.table, kernel, torch.cat([got[r][2 + 2 * i] for r in range(world)]))


class DistCommitter(StepPlan):
    """The committer of the tables a :class:`Group` of trainers shares (one per group: :func:`committer_for`):
    the step plan with :class:`DistExchange`."""

    def __init__(self, group: Group) -> None:
        super().__init__(DistExchange(group))
        self.group = group

    def commit(self, kernel: RowKernel, tables: Sequence[TablePipeline]) -> None:
        """One N-trainer sync step over ``tables`` (see the module docstring). Collective."""
        try:
            super().commit(kernel, tables)
            if any(isinstance(t.store, SharedRowStore) for t in tables):
                self.group.barrier(f"step {tables[0].steps - 1}: every owner has written")
        finally:
            for table in tables:
                table.dist.registry.done()  # reads may open again: this step is written everywhere (or failed)


_COMMITTERS: "weakref.WeakKeyDictionary[Group, DistCommitter]" = weakref.WeakKeyDictionary()


def committer_for(group: Group) -> DistCommitter:
    """The one committer of ``group``'s tables (so an optimizer can check its tables share it)."""
    if group not in _COMMITTERS:
        _COMMITTERS[group] = DistCommitter(group)
    return _COMMITTERS[group]
