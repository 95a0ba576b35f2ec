"""Random programs of DGL habits for the differential test (``tests/test_differential.py``).

A program is plain data: a setting (optimizer, graph and loader kind, oac depth, whether ``zero_grad()`` is
called) and a flat list of instructions. An interpreter (:mod:`diff_runner`) runs it against dgl-oac (sync,
oac) and against ``dgl.nn.NodeEmbedding`` + ``dgl.optim``; an instruction whose precondition does not hold in
the interpreter's state (``next`` with no epoch, ``step`` with no loss, ...) is a no-op, so every list is a
valid program and hypothesis can shrink a failing one to the few instructions that matter.

Instructions (``t``: table index, ``j``: which batch of the current step, ``c``: the read's loss weight):

* ``("iter", zipped)``: start an epoch of loader 0, or ``zip`` of loaders 0 and 1 (same tables, another seed);
* ``("next",)``: take the epoch's next batch (two when zipped); the epoch ends when it runs out;
* ``("rows", j, t, c)``: the rows attached to batch j (``blocks[0].srcdata[emb.name]``), used in the loss;
* ``("own", j, t, c)``: ``emb(input_nodes)`` of batch j with grad (the batch's own ids);
* ``("subset", j, t, s, c)``: ``emb(ids)`` for ids drawn from batch j's input nodes: its first ones (DGL's
  output nodes), a random subset, or with duplicates (``s % 3``);
* ``("ids", t, s, n, c)``: ``emb(ids)`` of n random ids (duplicates allowed) with grad, in or outside an epoch;
* ``("eval", t)``: ``emb(arange(N))`` under ``torch.no_grad()`` (an evaluation read; its values are compared);
* ``("step",)``: ``opt.zero_grad()`` (DGL's order: before backward; left out when the program says so),
  ``loss.backward()``, ``opt.step()``; the loop variables (this step's batches) are dropped;
* ``("hold",)``: keep this step's batches alive past the step (``for b in list(loader)``);
* ``("held_read", t, c)``: ``emb(input_nodes)`` of a held batch with grad (reads the rows as of now);
* ``("peek",)``: ``first = next(iter(loader))`` with no epoch running, kept alive (shapes are looked at);
* ``("break",)``: leave the loop (the epoch's iterator is dropped);
* ``("save",)`` / ``("load",)``: checkpoint between steps (with the loader's mid-epoch position); load drops
  the running epoch and held batches, restores, and resumes the saved epoch where it was;
* ``("write", t, s)``: max-norm renormalisation of a few rows through ``emb.write_rows(ids, values)``
  (a no-op while dgl-oac has no ``write_rows``: see :data:`diff_runner.HAS_WRITE_ROWS`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple, Union

from hypothesis import strategies as st

Instr = Tuple
GRAPHS = ("homo-node", "homo-edge", "hetero-node")
OPTIMIZERS = ("sgd", "adagrad", "adam")
DEPTHS: Tuple[Union[int, str], ...] = (1, 2, 3, 4, 5, 6, 7, 8, "auto")
COEFS = (1.0, -0.5, 2.0, 0.25)


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


# How often each instruction is drawn: the loop's skeleton (iter, next, rows, step) dominates.
BASE_WEIGHTS = {"iter": 3, "next": 8, "rows": 8, "own": 1, "subset": 1, "ids": 2, "eval": 1, "step": 7,
                "hold": 1, "held_read": 1, "peek": 1, "break": 1, "save": 1, "load": 1, "write": 1}
# Programs aimed at one known hole (issue 22): more of the instructions that reach it.
BIASED = {
    "repeat": {**BASE_WEIGHTS, "own": 4, "subset": 4, "ids": 3, "hold": 0, "peek": 0},
    "held": {**BASE_WEIGHTS, "hold": 3, "held_read": 2, "peek": 3, "own": 0, "subset": 0},
}


def _instr(draw, kind: str) -> Instr:
    j = lambda: draw(st.integers(0, 3))  # noqa: E731
    t = lambda: draw(st.integers(0, 1))  # noqa: E731
    c = lambda: draw(st.sampled_from(COEFS))  # noqa: E731
    if kind == "iter":
        return ("iter", draw(st.booleans()))
    if kind in ("rows", "own"):
        return (kind, j(), t(), c())
    if kind == "subset":
        return ("subset", j(), t(), draw(st.integers(0, 50)), c())
    if kind == "ids":
        return ("ids", t(), draw(st.integers(0, 50)), draw(st.integers(1, 6)), c())
    if kind == "eval":
        return ("eval", t())
    if kind == "held_read":
        return ("held_read", t(), c())
    if kind == "write":
        return ("write", t(), draw(st.integers(0, 50)))
    return (kind,)


@st.composite
def programs(draw, weights: str = "base", max_instrs: int = 40) -> Program:
    """A random :class:`Program`; ``weights``: ``"base"`` or a key of :data:`BIASED`."""
    table = BASE_WEIGHTS if weights == "base" else BIASED[weights]
    kinds = [k for k, w in table.items() for _ in range(w)]
    n = draw(st.integers(3, max_instrs))
    instrs = [("iter", False)] + [_instr(draw, draw(st.sampled_from(kinds))) for _ in range(n)]
    return Program(opt=draw(st.sampled_from(OPTIMIZERS)), graph=draw(st.sampled_from(GRAPHS)),
                   depth=draw(st.sampled_from(DEPTHS)),
                   zero_grad=draw(st.sampled_from((True, True, True, False))), instrs=tuple(instrs))
