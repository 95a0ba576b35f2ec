"""Random programs of DGL habits for the differential test (``tests/dgl_frontend/test_differential.py``).

A program is plain data: a setting (optimizer, graph and loader kind, oac depth, whether ``zero_grad()`` is
called) and a list of instructions, mostly loop bodies (``step``). An interpreter (:mod:`diff_runner`) runs
it against dgl-oac (sync, oac) and against ``dgl.nn.NodeEmbedding`` + ``dgl.optim``; an instruction whose
precondition does not hold in the interpreter's state (``break`` with no epoch, ``load`` before any ``save``,
...) is a no-op, so every list is a valid program and hypothesis can shrink a failing one by deleting
instructions.

Instructions (``t``: table index, ``j``: which batch of the step, ``c``: the read's loss weight):

* ``("step", k, rows, reads, hold)``: one loop body. Take k batches (gradient accumulation when k > 1; an
  epoch of loader 0 starts if none runs; k = 0: a step outside the loop), use each one's attached rows
  (``blocks[0].srcdata[emb.name]``) in the loss if ``rows``, then the extra ``reads``, then
  ``opt.zero_grad()`` (DGL's order: before backward; left out when the program says so), ``loss.backward()``,
  ``opt.step()``. The batches are dropped after the step unless ``hold`` (``for b in list(loader)``). Reads:

  - ``("own", j, t, c)``: ``emb(input_nodes)`` of batch j with grad (the batch's own ids);
  - ``("subset", j, t, s, c)``: ``emb(ids)`` for ids drawn from batch j's input nodes: its first ones (DGL's
    output nodes), a random subset, or with duplicates (``s % 3``);
  - ``("ids", t, s, n, c)``: ``emb(ids)`` of n random ids (duplicates allowed) with grad;
  - ``("held_read", t, c)``: ``emb(input_nodes)`` of a held batch with grad (reads the rows as of now);

* ``("iter", zipped)``: start an epoch of loader 0, or ``zip`` of loaders 0 and 1 (same tables, another seed);
* ``("next",)``: hand out a batch nobody uses (it dies at once);
* ``("eval", t)``: ``emb(arange(N))`` under ``torch.no_grad()`` (an evaluation read; its values are compared);
* ``("peek",)``: ``first = next(iter(loader))`` with no epoch running, kept alive to the end;
* ``("break",)``: leave the loop (the epoch's iterator is dropped);
* ``("save",)`` / ``("load",)``: checkpoint between steps (with the loader's mid-epoch position); load drops
  the running epoch and held batches, restores, and resumes the saved epoch where it was;
* ``("write", t, s)``: max-norm renormalisation of a few rows through ``emb.write_rows(ids, values)``
  (a no-op while dgl-oac has no ``write_rows``: see :data:`diff_runner.HAS_WRITE_ROWS`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Tuple, Union

from hypothesis import strategies as st

Instr = Tuple
GRAPHS = ("homo-node", "homo-edge", "hetero-node")
OPTIMIZERS = ("sgd", "adagrad", "adam")
DEPTHS: Tuple[Union[int, str], ...] = (1, 2, 3, 4, 5, 6, 7, 8, "auto")
# The reads' loss weights. No few of them sum to zero: with 1.0 and -0.5, a row read by its batch (1.0) and twice
# by emb(ids) (-0.5 each) had a true gradient of 0, whose rounding residue (its sign and size set by the order of
# the additions, which DGL and dgl-oac choose differently across accumulated batches) Adagrad's and Adam's
# g / sqrt(g^2) turn into a full step either way: the comparison with DGL then measured the rounding, not the
# semantics. -0.3 cancels against 1.0, 2.0 and 0.25 only with more reads of a row than a program makes.
COEFS = (1.0, -0.3, 2.0, 0.25)


@dataclass(frozen=True, repr=False)
class Program:
    opt: str
    graph: str
    depth: Union[int, str]
    zero_grad: bool
    instrs: Tuple[Instr, ...]

    def __repr__(self) -> str:
        head = f"Program(opt={self.opt!r}, graph={self.graph!r}, depth={self.depth!r}, zero_grad={self.zero_grad})"
        return head + "".join(f"\n    {i!r}," for i in self.instrs)


# How often each instruction and each extra read is drawn: the loop body dominates.
BASE_WEIGHTS = {"step": 12, "iter": 2, "next": 1, "eval": 1, "peek": 1, "break": 1, "save": 1, "load": 1,
                "write": 1}
BASE_READS = {"ids": 3, "own": 1, "subset": 1, "held_read": 1}
# Programs aimed at one known hole (issue 22): more of what reaches it.
# (instructions, extra reads, probability of hold, whether a step uses the batches' attached rows)
Bias = Tuple[Dict[str, int], Dict[str, int], float, Tuple[bool, ...]]
BASE: Bias = (BASE_WEIGHTS, BASE_READS, 0.05, (True, True, False))
BIASED: Dict[str, Bias] = {
    "repeat": (BASE_WEIGHTS, {"ids": 2, "own": 3, "subset": 3}, 0.1, (True, True, False)),
    # only parts of a batch read: emb(output_nodes) and the like, no attached rows
    "partial": (BASE_WEIGHTS, {"subset": 4, "ids": 1}, 0.0, (False,)),
    # many steps in one epoch: the write log lives only while an epoch reads ahead
    "held": ({**BASE_WEIGHTS, "peek": 2, "break": 0, "load": 0, "iter": 0}, {"ids": 2, "held_read": 2}, 0.4,
             (True, True, False)),
}


def _read(kind: str) -> st.SearchStrategy[Instr]:
    j, t, c, s = st.integers(0, 3), st.integers(0, 1), st.sampled_from(COEFS), st.integers(0, 50)
    args = {"own": (j, t, c), "subset": (j, t, s, c), "ids": (t, s, st.integers(1, 6), c), "held_read": (t, c)}
    return st.tuples(st.just(kind), *args[kind])


def _instr(kind: str, bias: Bias) -> st.SearchStrategy[Instr]:
    _, reads, hold_p, rows = bias
    if kind == "step":
        read = st.sampled_from([k for k, w in reads.items() for _ in range(w)]).flatmap(_read)
        return st.tuples(st.just("step"), st.sampled_from((1, 1, 1, 2, 3, 0)), st.sampled_from(rows),
                         st.lists(read, max_size=2).map(tuple),
                         st.floats(0, 1).map(lambda u: u < hold_p))
    t, s = st.integers(0, 1), st.integers(0, 50)
    args = {"iter": (st.booleans(),), "eval": (t,), "write": (t, s)}.get(kind, ())
    return st.tuples(st.just(kind), *args)


@st.composite
def programs(draw, weights: str = "base", max_instrs: int = 30, min_instrs: int = 1) -> Program:
    """A random :class:`Program`; ``weights``: ``"base"`` or a key of :data:`BIASED`. A list of instructions
    (hypothesis shrinks a failing one by deleting instructions), after an opening ``("iter", False)``, itself
    after a peek (``first = next(iter(loader))`` before the loop) in half the programs."""
    bias = BASE if weights == "base" else BIASED[weights]
    kinds = [k for k, w in bias[0].items() for _ in range(w)]
    instrs = draw(st.lists(st.sampled_from(kinds).flatmap(lambda k: _instr(k, bias)), min_size=min_instrs,
                           max_size=max_instrs))
    return Program(opt=draw(st.sampled_from(OPTIMIZERS)), graph=draw(st.sampled_from(GRAPHS)),
                   depth=draw(st.sampled_from(DEPTHS)),
                   zero_grad=draw(st.sampled_from((True, True, True, False))),
                   instrs=(("peek",),) * draw(st.booleans()) + (("iter", False),) + tuple(instrs))
