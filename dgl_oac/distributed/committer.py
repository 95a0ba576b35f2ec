"""The distributed committer: the N-trainer sync step, what ``SparseOptimizer.step()`` runs for tables built after
``init_process_group`` (:class:`DistCommitter`, the :class:`~dgl_oac.engine.kernel.Committer` they are given).

Semantics (DGL's multi-process convention, measured with ``dgl.nn.NodeEmbedding`` + ``dgl.optim``): in step t
every trainer has read rows at version t-1; each row in the union of the trainers' batches gets ONE optimizer
update, with the mean of the gradients of every read of it, on every rank (a row read once by each of two
trainers with gradients 1 and 3 is updated as a row read once with 2). Every rank calls ``step()`` for every
step, also with nothing read (an empty batch): it still takes part in the collectives.

The step, on every rank, for each table of the optimizer:

1. sum the gradients of the rows it read since the last step (per unique id, with the number of reads);
2. send each owner its rows' ``id ‖ reads ‖ gradient sum`` (:func:`.exchange.exchange`);
3. as an owner: add the parts in source-rank order (each part has unique ids, so every ``index_add_`` is
   order-free; the result does not depend on arrival order or thread counts), divide by the reads (not for a
   kernel whose ``duplicate_reduction`` is ``"sum"``), and run
   the optimizer's row kernel on its rows as they are in the table (version t-1);

Before step 1, each trainer sends the owners the reads it opened and released since the last step
(:mod:`.inflight`: registration). Then, once for all tables: decide together whether the step is finite (one
rank's NaN/Inf skips it on every rank, every table untouched); each owner sends every trainer the new rows it
has in flight (forwarding); each rank commits through its table's pipeline (the single-process commit: its
own rows written through, its own and the forwarded rows logged as step t, batches released, loader hooks);
with several machines, each owner also sends its written rows to one rank of every other machine, which writes
them into that machine's replica (:func:`mirror_targets`; :mod:`.shared`); a barrier, so that no rank reads
before every owner has written step t everywhere. Reads then open again.

OAC with N trainers is this step plus the single-process hand-out: a batch read ahead at version v was
registered at step v + 1 at the latest (reads do not open during a step), so every later write of its rows is
in its trainer's log, whoever the owner; validation patches them as in one process (a torn read belongs to a
step after v, so it is patched too). Cost over sync: 8 bytes per read row for the registration and only the
rows written while in flight.
"""
from __future__ import annotations

import time
import weakref
from dataclasses import dataclass
from typing import List, Sequence, Tuple

import torch

from ..engine.batch import TableRows
from ..engine.combine import combine as combine_reads
from ..engine.commit import Update, apply_update, skip
from ..engine.kernel import RowKernel, check_reduction
from ..engine.pipeline import TablePipeline
from ..engine.store import RowStore
from .exchange import exchange, pack_ids, unpack_ids
from .group import Group
from .shared import SharedRowStore


def local_sums(batches: Sequence[TableRows], dim: int) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(ids: int64[u], reads: float32[u], grad_sum: float32[u, D])``, CPU, over this rank's ready batches: every
    occurrence of a row in them counts as a read (:mod:`dgl_oac.engine.combine`)."""
    if not batches:
        return torch.empty(0, dtype=torch.int64), torch.empty(0), torch.empty(0, dim)
    ids, _, _, sums, counts = combine_reads(batches, dim)
    return ids, torch.ones(ids.numel()) if counts is None else counts.cpu(), sums.cpu()


def combine(parts: Sequence[torch.Tensor], dim: int, reduction: str = "mean") -> Tuple[torch.Tensor, torch.Tensor]:
    """``(ids: int64[u], grad: float32[u, D])`` from the parts ``float32[n_r, 3 + D]`` each rank sent, added in
    rank order (deterministic): each row's gradient summed over its reads on every rank, divided by their
    number for ``reduction="mean"`` (``"sum"``: not)."""
    ids = [unpack_ids(p[:, :2]) for p in parts]
    uniq, inverse = torch.unique(torch.cat(ids), return_inverse=True)
    total = torch.zeros(uniq.numel(), dim)
    reads = torch.zeros(uniq.numel())
    for p, inv in zip(parts, inverse.split([i.numel() for i in ids])):
        reads.index_add_(0, inv, p[:, 2])
        total.index_add_(0, inv, p[:, 3:])
    return uniq, total if reduction == "sum" else total.div_(reads.unsqueeze(1))


@dataclass(eq=False)
class _Planned:
    update: Update
    bad: str  # what was not finite on this rank ("" if nothing)


def _register(table: TablePipeline, batches: Sequence[TableRows], group: Group, step: int) -> None:
    """Send the owners the reads opened (+1) and released (-1) since the last step, and those this step
    commits (-1); apply what the trainers sent."""
    dist = table.dist
    added, gone = dist.registry.take([b.registration for b in batches])
    ids = torch.cat([added, gone])
    delta = torch.cat([torch.ones(added.numel()), -torch.ones(gone.numel())])
    order, counts = dist.partition.by_owner(ids)
    message = torch.cat([pack_ids(ids), delta.unsqueeze(1)], 1)[order]
    parts = exchange(group, list(message.split(counts)), what=f"step {step} of {table.name!r}: reads to owners",
                     kind="registration")
    for trainer, part in enumerate(parts):
        got = unpack_ids(part[:, :2])
        sign = part[:, 2] > 0
        dist.book.apply(trainer, got[sign], +1)
        dist.book.apply(trainer, got[~sign], -1)


def _plan(table: TablePipeline, kernel: RowKernel, group: Group, step: int) -> _Planned:
    """Steps 1-3 of the module docstring for one table; touches no table."""
    table.check()
    batches = table.ready()
    _register(table, batches, group, step)
    t0 = time.perf_counter()
    d = table.store.dim
    ids, reads, sums = local_sums(batches, d)
    order, counts = table.dist.partition.by_owner(ids)
    message = torch.cat([pack_ids(ids), reads.unsqueeze(1), sums], 1)[order]
    parts = exchange(group, list(message.split(counts)), what=f"step {step} of {table.name!r}: gradients to owners",
                     kind="gradients")
    owned, grad = combine(parts, d, check_reduction(kernel))
    rows = table.store.gather(owned)
    with torch.no_grad():
        new = kernel.update_table(table, rows, grad)
    check = any(b.check_finite for b in batches) or not batches
    bad = ""
    if check and not bool(torch.isfinite(sums.sum())):
        bad = "the gradient"
    elif check and bool(torch.isfinite(grad.sum())) and not bool(torch.isfinite(new.sum())):
        bad = "the rows or the optimizer's update"  # (a non-finite gradient received is its sender's to report)
    dev = table.log.device if table.log is not None else torch.device("cpu")
    # `new` is computed on the host (the owner's rows and the exchanged gradients are CPU tensors); the device
    # copy is for the write log only, and the host one is what the table, forwarding and mirroring use
    update = Update(table, batches, owned, owned.to(dev), rows, new.to(dev), False, 0, t0, new_host=new)
    return _Planned(update, bad)


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


def mirror_rows(group: Group, store: RowStore, ids: torch.Tensor, rows: torch.Tensor, what: str) -> None:
    """Collective, several machines: send ``rows: float32[n, W]`` (value ‖ state) of this owner's ``ids: int64[n]``
    to :func:`mirror_targets`; write what the other machines' owners sent into this machine's replica. ``rows``:
    CPU."""
    message = torch.cat([pack_ids(ids), rows], 1)  # a copy (cat): the commit may recycle `rows`' buffer
    targets = set(mirror_targets(group))
    parts = exchange(group, [message if r in targets else message[:0] for r in range(group.world)], what=what,
                     kind="mirror")
    got = torch.cat(parts)
    if got.shape[0]:
        store.write(unpack_ids(got[:, :2]), got[:, 2:])


def _mirror(u: Update, group: Group, step: int) -> None:
    """Several machines: this step's written rows into every machine's replica (:func:`mirror_rows`); a sharded
    table has no replicas."""
    if len(group.machines) > 1 and isinstance(u.table.store, SharedRowStore):
        mirror_rows(group, u.table.store, u.ids, u.new_host,
                    f"step {step} of {u.table.name!r}: written rows to the other machines")


def _forward(p: _Planned, group: Group, step: int) -> None:
    """Owners send the rows trainers have in flight; the received rows are logged with this step."""
    u = p.update
    parts = exchange(group, forward_parts(u.table, u.ids, u.new_host, group),
                     what=f"step {step} of {u.table.name!r}: written rows to the trainers reading them",
                     kind="forwarding")
    got = torch.cat(parts)
    rows = torch.zeros(got.shape[0], u.new.shape[1])  # state columns zero: batches' state is never used here
    rows[:, : got.shape[1] - 2] = got[:, 2:]
    u.forwarded = (unpack_ids(got[:, :2]).to(u.ids_dev.device), rows.to(u.new.device))


class DistCommitter:
    """The committer of the tables a :class:`Group` of trainers shares (one per group: :func:`committer_for`)."""

    def __init__(self, group: Group) -> None:
        self.group = group

    def commit(self, kernel: RowKernel, tables: Sequence[TablePipeline]) -> None:
        """One N-trainer sync step over ``tables`` (see the module docstring). Collective."""
        try:
            _step(kernel, tables, self.group)
        finally:
            for table in tables:
                table.dist.registry.done()  # reads may open again: this step is written everywhere (or failed)


_COMMITTERS: "weakref.WeakKeyDictionary[Group, DistCommitter]" = weakref.WeakKeyDictionary()


def committer_for(group: Group) -> DistCommitter:
    """The one committer of ``group``'s tables (so an optimizer can check its tables share it)."""
    if group not in _COMMITTERS:
        _COMMITTERS[group] = DistCommitter(group)
    return _COMMITTERS[group]


def _step(kernel: RowKernel, tables: Sequence[TablePipeline], group: Group) -> None:
    step = tables[0].steps
    planned: List[_Planned] = []
    try:
        for table in tables:
            planned.append(_plan(table, kernel, group, step))
        failing = group.ranks_flagging(any(p.bad for p in planned), what=f"step {step}: finite check")
    except BaseException:
        skip(tables)
        raise
    if failing:
        skip(tables)
        mine = "; ".join(f"{p.update.table.name!r}: {p.bad}" for p in planned if p.bad)
        raise FloatingPointError(
            f"NaN or Inf in step {step} on rank(s) {failing}{f' (here: {mine})' if mine else ''}; the step was "
            f"skipped on every rank: every table and optimizer state is as it was before it")
    try:
        for p in planned:
            _forward(p, group, step)
            _mirror(p.update, group, step)
            apply_update(p.update)
    except BaseException:
        skip(tables)
        raise
    group.barrier(f"step {step}: every owner has written")
