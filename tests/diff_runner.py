"""The interpreter of differential-test programs (:mod:`diff_programs`) and what one run records.

``run(program, backend)`` executes the instructions against a backend (:mod:`diff_backends`); instructions
whose precondition does not hold are no-ops. It records each step's loss, every evaluation read, the final
tables and optimizer state, the largest write log seen after any instruction (oac), the threads left over, the
rows oac patched, and three facts about the program that decide which known holes of issue 22 it can reach:

* ``repeat``: in some step, a row of one of dgl-oac's leaves gets several gradient contributions: the batch's
  attached rows and ``emb(input_nodes)``, or ``emb(ids)`` calls whose ids all lie among the newest pending
  read's, or such a call with duplicates (the resolution rules of ``NodeEmbedding.__call__``, modelled by
  :class:`_Leaf`) (hole 1: dgl-oac sums those gradients where DGL averages them over occurrences);
* ``partial``: a step reads part of a batch's rows through ``emb(ids)`` calls that resolve into the batch's
  leaf (e.g. only ``emb(output_nodes)``): dgl-oac commits the whole leaf, the unread rows with a zero
  gradient. With Adam they take a step (moments decay, step count grows); with any optimizer the zero counts
  in the mean of another read of the same row in the step (halving its update). DGL updates only the rows
  read (found by this test; the same cause as hole 1);
* ``held``: a batch whose rows got no gradient was kept alive across a step (peeked, or held as
  ``list(loader)`` does) (hole 3: its open read pins the write log).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

import torch

import dgl_oac
from diff_backends import Batch, OacBackend, table_sizes

#: Row writes need a logged API (issue 22 hole 2, branch holes); until it exists ``write`` is a no-op.
HAS_WRITE_ROWS = hasattr(dgl_oac.NodeEmbedding, "write_rows")


def loss_of(x: torch.Tensor) -> torch.Tensor:
    """Scalar loss of rows ``x: float32[n, D]``; nonlinear, so a gradient depends on the row's value."""
    return x.square().sum() + torch.sin(x).sum() + x[:, 0].sum()


@dataclass
class Outcome:
    losses: List[float] = field(default_factory=list)
    evals: List[torch.Tensor] = field(default_factory=list)
    tables: List[Tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)
    max_log: int = 0
    log_bound: int = 0
    threads_left: List[str] = field(default_factory=list)
    repeat: bool = False
    held: bool = False
    partial: bool = False
    steps: int = 0
    patched: int = 0


class _Leaf:
    """A read dgl-oac keeps as one differentiable leaf (a handed-out batch, or an ``emb(ids)`` call it read
    anew), with how many gradient contributions each of its rows receives in the step."""

    def __init__(self, ids: torch.Tensor) -> None:
        self.ids = ids
        self.members = set(ids.tolist())
        self.counts: Dict[int, int] = {}

    def add(self, ids: torch.Tensor) -> None:
        for i in ids.tolist():
            self.counts[i] = self.counts.get(i, 0) + 1


class _State:
    def __init__(self) -> None:
        self.iters: Optional[List[Any]] = None
        self.held: List[Batch] = []
        # the loop variable: the epoch's last batches stay alive until the next next() (the generator holds
        # them), so dgl-oac keeps them pending; the interpreter must know them to model what it resolves
        self.last: List[Batch] = []
        self.saved: Optional[bool] = None  # whether an epoch was running at the last save


def _subset(ids: torch.Tensor, s: int) -> torch.Tensor:
    n = ids.numel()
    gen = torch.Generator().manual_seed(s)
    m = 1 + s % n
    if s % 3 == 0:
        return ids[:m]  # a block's output nodes are the first of its input nodes
    if s % 3 == 1:
        return ids[torch.randperm(n, generator=gen)[:m]]
    return ids[torch.randint(0, n, (m + 1,), generator=gen)]  # duplicates


def _sums_repeats(leaves: List[_Leaf]) -> bool:
    """Hole 1's trigger: a row of one leaf gets several gradient contributions in a step, which dgl-oac sums
    where DGL averages them (one record per ``emb()`` call)."""
    return any(n > 1 for leaf in leaves for n in leaf.counts.values())


def _partial(opt: str, newest: List[List[_Leaf]], batch_leaves: List[_Leaf]) -> bool:
    """Hole 1b's trigger: a batch's leaf got a gradient through a part of its rows only; its other rows are
    committed with a zero gradient, which moves Adam's state and counts in the mean of any other read of them."""
    for leaf in batch_leaves:
        unread = leaf.members - leaf.counts.keys()
        if not leaf.counts or not unread:
            continue
        if opt == "adam":
            return True
        for per in newest:
            if leaf in per and any(unread & other.counts.keys() for other in per if other is not leaf):
                return True
    return False


def run(program: Any, backend: Any) -> Outcome:
    """Execute ``program`` on ``backend``; see the module docstring for what is recorded."""
    out, st = Outcome(), _State()
    sizes = table_sizes(program.graph)
    is_oac = isinstance(backend, OacBackend)
    if is_oac:
        out.log_bound = backend.log_bound()
    for ins in program.instrs:
        _execute(ins, program, backend, st, out, sizes)
        if is_oac:
            out.max_log = max(out.max_log, backend.log_entries())
    del st  # the loop's variables go: dropped iterators must end their epochs
    out.threads_left = backend.wait_threads()
    out.tables = backend.snapshot()
    out.patched = backend.rows_patched()
    backend.close()
    return out


def _take(st: _State) -> List[Batch]:
    """The epoch's next batch (two when zipped; none when it runs out, which ends it)."""
    try:
        st.last = [next(it) for it in st.iters]
    except StopIteration:
        st.iters, st.last = None, []
    return st.last


def _step(ins: Tuple, program: Any, backend: Any, st: _State, out: Outcome, sizes: List[int]) -> None:
    """One loop body: ``("step", k, rows, reads, hold)`` (see :mod:`diff_programs`)."""
    _, k, rows, reads, hold = ins
    nt = len(sizes)
    batches: List[Batch] = []
    # the loop variables of before this step: alive only if this step takes no batch (the next take drops them)
    prior = [b for b in st.last if all(b is not h for h in st.held)] if k == 0 else []
    for _ in range(k):
        if st.iters is None:
            st.iters = [backend.epoch(0)]
        batches += _take(st)
    terms: List[torch.Tensor] = []
    # dgl-oac's pending reads per table, oldest first (NodeEmbedding.__call__: the input nodes of a pending
    # batch resolve to its leaf, ids all among the newest pending read's to a part of its leaf)
    alive = st.held + [b for b in prior if all(b is not c for c in batches)] + batches  # oldest first
    leaves = {id(b): [_Leaf(b.ids[t]) for t in range(nt)] for b in alive}
    newest = [[leaves[id(b)][t] for b in alive if t not in b.committed] for t in range(nt)]
    if rows:
        for b in batches:
            for t in range(nt):
                terms.append(loss_of(backend.attached(b, t)))
                leaves[id(b)][t].add(b.ids[t].unique())
    for r in reads:
        t = (r[2] if r[0] in ("own", "subset") else r[1]) % nt
        owner = None  # the batch whose own ids are read (found by identity)
        if r[0] in ("own", "subset"):
            if not batches:
                continue
            owner = batches[r[1] % len(batches)]
            ids = owner.ids[t]
            if r[0] == "subset":
                if not ids.numel():
                    continue
                ids, owner = _subset(ids, r[3]), None
        elif r[0] == "ids":
            ids = torch.randint(0, sizes[t], (r[3],), generator=torch.Generator().manual_seed(r[2]))
        elif st.held:
            owner = st.held[-1]
            ids = owner.ids[t]
            if t in owner.committed:  # released at its commit: read anew
                owner = None
        else:
            continue
        own = owner is not None and ids is owner.ids[t]  # emb(input_nodes) of a batch: see DglBackend.own
        terms.append(r[-1] * loss_of(backend.own(owner, t) if own else backend.embs[t](ids)))
        if owner is not None:
            leaves[id(owner)][t].add(ids)
        elif newest[t] and set(ids.tolist()) <= newest[t][-1].members:
            newest[t][-1].add(ids)
        else:  # read anew: a leaf of its own, duplicates as separate rows
            newest[t].append(_Leaf(ids))
            newest[t][-1].add(ids.unique())
    if not terms:
        return
    out.repeat = out.repeat or any(_sums_repeats(per) for per in newest)
    out.partial = out.partial or _partial(program.opt, newest, [per[t] for per in leaves.values()
                                                                for t in range(nt)])
    # a held batch none of whose reads got a gradient stays pending (committed ones are released)
    out.held = out.held or any(t not in b.committed for b in alive if all(b is not c for c in batches)
                               for t in range(nt))
    if program.zero_grad:
        backend.opt.zero_grad()  # DGL's order: before backward
    loss = torch.stack(terms).sum()
    loss.backward()
    backend.opt.step()
    out.losses.append(loss.item())
    out.steps += 1
    for b in alive:
        b.committed.update(t for t in range(nt) if leaves[id(b)][t].counts)
    if hold:
        st.held.extend(batches)


def _execute(ins: Tuple, program: Any, backend: Any, st: _State, out: Outcome, sizes: List[int]) -> None:
    kind = ins[0]
    nt = len(sizes)
    if kind == "iter" and st.iters is None:
        st.iters = [backend.epoch(0)] + ([backend.epoch(1)] if ins[1] else [])
    elif kind == "next" and st.iters is not None:
        _take(st)
    elif kind == "step":
        _step(ins, program, backend, st, out, sizes)
    elif kind == "eval":
        t = ins[1] % nt
        with torch.no_grad():
            out.evals.append(backend.embs[t](torch.arange(sizes[t])).clone())
    elif kind == "peek" and st.iters is None:
        it = backend.epoch(0)
        st.held.append(next(it))
        del it
    elif kind == "break" and st.iters is not None:
        st.iters, st.last = None, []
    elif kind == "save" and (st.iters is None or len(st.iters) == 1):
        backend.save()
        st.saved = st.iters is not None
    elif kind == "load" and st.saved is not None:
        st.iters, st.held, st.last = None, [], []
        backend.load()
        if st.saved:
            st.iters = [backend.epoch(0)]
    elif kind == "write" and HAS_WRITE_ROWS:
        t = ins[1] % nt
        ids = torch.randint(0, sizes[t], (3,), generator=torch.Generator().manual_seed(ins[2])).unique()
        with torch.no_grad():
            cur = backend.embs[t](ids)
            values = cur * (0.5 / cur.norm(dim=1, keepdim=True).clamp_min(1e-12)).clamp(max=1.0)  # max-norm 0.5
        backend.write_rows(t, ids, values)
