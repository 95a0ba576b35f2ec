"""The interpreter of differential-test programs (:mod:`diff_programs`) and what one run records.

``run(program, backend)`` executes the instructions against a backend (:mod:`diff_backends`); instructions
whose precondition does not hold are no-ops. It records each step's loss, every evaluation read, the final
tables and optimizer state, the largest write log seen after any instruction (oac), the threads left over, and
two facts about the program that decide which known holes of issue 22 it can reach:

* ``repeat``: some step reads a row more than once through ``emb(ids)`` calls that dgl-oac resolves into an
  earlier read's leaf (ids all among a live batch's or an earlier call's ids, see
  ``NodeEmbedding.__call__``) together with another read of those rows or duplicates (hole 1: dgl-oac sums
  those gradients where DGL averages them over occurrences);
* ``held``: a batch was kept alive across a step (peeked, or held as ``list(loader)`` does) (hole 3: its open
  read pins the write log).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, List, Optional, Set, Tuple

import torch

from diff_backends import Batch, OacBackend, table_sizes

HAS_WRITE_ROWS = hasattr(__import__("dgl_oac").NodeEmbedding, "write_rows")


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
    steps: int = 0


@dataclass
class _Read:
    t: int
    ids: torch.Tensor
    call: bool  # an emb(ids) call (else a batch's attached rows / the batch itself)


class _State:
    def __init__(self) -> None:
        self.iters: Optional[List[Any]] = None
        self.current: List[Batch] = []
        self.held: List[Batch] = []
        self.terms: List[torch.Tensor] = []
        self.reads: List[_Read] = []     # this step's grad reads
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


def _repeats(reads: List[_Read], live: List[Tuple[int, torch.Tensor]]) -> bool:
    """Whether a call in ``reads`` resolves into a live read (``live``: earlier reads' ``(t, ids)``) and its rows
    are read again in the step (or it has duplicates). A deliberately generous reading of hole 1's trigger."""
    for k, r in enumerate(reads):
        if not r.call or not r.ids.numel():
            continue
        mine: Set[int] = set(r.ids.tolist())
        earlier = live + [(q.t, q.ids) for q in reads[:k]]
        if not any(t == r.t and mine <= set(ids.tolist()) for t, ids in earlier):
            continue
        if len(mine) < r.ids.numel():
            return True
        if any(q is not r and q.t == r.t and mine & set(q.ids.tolist()) for q in reads):
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
    out.threads_left = backend.finish()
    return out


def _read(backend: Any, st: _State, t: int, ids: torch.Tensor, c: float, call: bool = True) -> None:
    x = backend.embs[t](ids) if call else ids
    st.terms.append(c * loss_of(x))


def _execute(ins: Tuple, program: Any, backend: Any, st: _State, out: Outcome, sizes: List[int]) -> None:
    kind = ins[0]
    nt = len(sizes)
    if kind == "iter" and st.iters is None:
        st.iters = [backend.epoch(0)] + ([backend.epoch(1)] if ins[1] else [])
    elif kind == "next" and st.iters is not None:
        try:
            st.current.extend([next(it) for it in st.iters])
        except StopIteration:
            st.iters = None
    elif kind in ("rows", "own", "subset") and st.current:
        b, t = st.current[ins[1] % len(st.current)], ins[2] % nt
        ids = b.ids[t]
        if kind == "rows":
            x = backend.attached(b, t)
            st.terms.append(ins[3] * loss_of(x))
            st.reads.append(_Read(t, ids, call=False))
        else:
            if kind == "subset":
                if not ids.numel():
                    return
                ids = _subset(ids, ins[3])
            st.terms.append(ins[-1] * loss_of(backend.embs[t](ids)))
            st.reads.append(_Read(t, ids, call=True))
    elif kind == "ids":
        t = ins[1] % nt
        ids = torch.randint(0, sizes[t], (ins[3],), generator=torch.Generator().manual_seed(ins[2]))
        st.terms.append(ins[4] * loss_of(backend.embs[t](ids)))
        st.reads.append(_Read(t, ids, call=True))
    elif kind == "held_read" and st.held:
        t = ins[1] % nt
        ids = st.held[-1].ids[t]
        st.terms.append(ins[2] * loss_of(backend.embs[t](ids)))
        st.reads.append(_Read(t, ids, call=True))
    elif kind == "eval":
        t = ins[1] % nt
        with torch.no_grad():
            out.evals.append(backend.embs[t](torch.arange(sizes[t])).clone())
    elif kind == "step" and st.terms:
        live = [(t, b.ids[t]) for b in st.current + st.held for t in range(nt)]
        out.repeat = out.repeat or _repeats(st.reads, live)
        out.held = out.held or bool(st.held)
        if program.zero_grad:
            backend.opt.zero_grad()  # DGL's order: before backward
        loss = torch.stack(st.terms).sum()
        loss.backward()
        backend.opt.step()
        out.losses.append(loss.item())
        out.steps += 1
        st.current, st.terms, st.reads = [], [], []
    elif kind == "hold":
        st.held.extend(st.current)
    elif kind == "peek" and st.iters is None:
        it = backend.epoch(0)
        st.held.append(next(it))
        del it
    elif kind == "break" and st.iters is not None and not st.terms:
        st.iters, st.current = None, []
    elif kind == "save" and not st.terms and (st.iters is None or len(st.iters) == 1):
        backend.save()
        st.saved = st.iters is not None
    elif kind == "load" and st.saved is not None and not st.terms:
        st.iters, st.current, st.held, st.reads = None, [], [], []
        backend.load()
        if st.saved:
            st.iters = [backend.epoch(0)]
    elif kind == "write" and HAS_WRITE_ROWS and not st.terms:
        t = ins[1] % nt
        ids = torch.randint(0, sizes[t], (3,), generator=torch.Generator().manual_seed(ins[2])).unique()
        with torch.no_grad():
            cur = backend.embs[t](ids)
            values = cur * (0.5 / cur.norm(dim=1, keepdim=True).clamp_min(1e-12)).clamp(max=1.0)  # max-norm 0.5
        backend.write_rows(t, ids, values)
