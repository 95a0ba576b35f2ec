"""Staleness mitigation for ``mode="async"``: Gap-Aware and DANA-style look-ahead (not exact; baselines for oac).

Naive async (``staleness=None``) computes a batch's gradient at the rows it read ahead (``θ_read``), runs the
row kernel on those rows, and adds ``new - θ_read`` to the table. Both rules here instead apply the update to
the row's *current* value and optimizer state (``θ_now``: every step committed before this one):

* the table keeps its write log in async mode too (as oac), and the commit brings the batch's rows from its read
  version to ``θ_now`` with the log (:meth:`~dgl_oac.engine.pipeline.TablePipeline.catch_up`: one version gather plus a
  copy of the rows written since, the work oac's hand-out does);
* the kernel runs on ``θ_now`` and the step overwrites the rows, which equals adding ``new - θ_now``: no update
  is lost, and the step is logged for the next batches' catch-up.

The rows the gradient is computed at are never patched (that would be oac): what differs is what the commit does
with the stale gradient.

**Gap-Aware** (Barkai, Hakimi, Schuster, "Gap-Aware Mitigation of Gradient Staleness", ICLR 2020). For each row
``r`` of a batch and coordinate ``c`` (values only, ``D`` columns)::

    gap[r, c] = |θ_now[r, c] - θ_read[r, c]| / C        G = max(1, gap)        g'[r, c] = g[r, c] / G[r, c]

and ``new = kernel(θ_now, g')``. ``C`` is the running average of the step size: after every step of this rule,
``C <- β C + (1 - β) mean |new - θ_now|`` over the step's updated value coordinates (``β = 0.9``; the first
step sets ``C``). The mean is taken over an evenly strided sample of at most ``STEP_SAMPLE`` of the step's rows
(every row of a smaller step): that many rows' coordinates pin the mean down far closer than the running
average moves from step to step, and a pass over every row was a measurable share of a CPU step. ``C`` is one
scalar per table (kept by the rule, which the loader makes per table), not per coordinate as in the paper's
dense setting: a per-coordinate average would double the table's memory, and a row's own average would only
move when the row is touched, so it would lag most for the rare rows. The scalar is the size of a typical
coordinate's step in this table, so ``gap`` is about the number of updates the row got while the batch was in
flight. Before the first step of the rule, ``G = 1``.

**DANA-style look-ahead** (Hakimi et al., "Taming Momentum in a Distributed Asynchronous Environment"). At
hand-out, a batch read at version ``rv`` when ``s`` steps are committed will be committed as step ``s`` (the
next), so ``k = s - 1 - rv`` steps were committed after its read. The batch computes at an estimate of the rows
after those steps: for each row the write log reports as written after ``rv`` (the one version gather of oac's
validation, without its patch), the updates that the row's momentum predicts for ``k`` more steps with a zero
gradient (DANA's look-ahead) are subtracted from ``θ_read``; other rows are current and unchanged.

* Adam rows ``[w | m | v | t]``: Adam's ``j``-th zero-gradient step from this state is
  ``lr · (β1^j m / (1 - β1^(t+j))) / (sqrt(β2^j v / (1 - β2^(t+j))) + eps)``; with ``eps`` moved out of the
  bias correction (exact for ``eps = 0``) the ``k`` steps sum to ``θ̂ = w - lr · m / (sqrt(v) + eps) · Σ_{j=1..k}
  β1^j / (1 - β1^(t+j)) · sqrt((1 - β2^(t+j)) / β2^j)``: a per-row factor (a loop over ``k`` on one column)
  times a few passes over the moved rows' two moment columns, gathered contiguous. Each step is counted as
  touching the row: exact for hot rows, which conflict most; an over-estimate for a row touched once in flight.
* Adagrad and SGD rows have no momentum: a zero gradient predicts no update, so ``θ̂ = θ_read``. Look-ahead then
  differs from naive async only at the commit: the update is applied to ``θ_now`` with the current Adagrad sum
  (for SGD: ``θ_now - lr g``, which is naive async's ``θ_now + (θ_read - lr g - θ_read)`` up to float rounding).

The gradient then goes to the kernel unscaled: ``new = kernel(θ_now, g)``.
"""
from __future__ import annotations

from typing import Dict, List, Optional, TYPE_CHECKING

import torch

from ..engine.pipeline import HandedOut, HookTable, TableRows
from ..optim.kernels import SparseAdam

if TYPE_CHECKING:
    from ..embedding import NodeEmbedding

GAP_MOMENTUM = 0.9  # β of the running average step size C
STEP_SAMPLE = 2048  # at most this many of a step's rows estimate its mean step size (Gap-Aware's C)


class Scratch:
    """Reused contiguous ``float32`` buffers of one rule, by name. The rule's arithmetic runs on copies of a few
    columns of the batch's rows: a fresh tensor of megabytes costs its page faults on every step on CPU, and
    elementwise kernels are several times slower on the strided column views of ``[value | state]`` rows than
    on contiguous memory. Used on the caller's thread (and stream) only."""

    def __init__(self) -> None:
        self._bufs: Dict[str, torch.Tensor] = {}

    def take(self, name: str, rows: int, cols: int, device: torch.device) -> torch.Tensor:
        """A ``float32[rows, cols]`` view of buffer ``name`` (contents undefined; valid until ``name`` is taken
        again)."""
        buf = self._bufs.get(name)
        if buf is None or buf.shape[0] < rows or buf.shape[1] != cols or buf.device != device:
            buf = self._bufs[name] = torch.empty(max(rows + rows // 4, 1), cols, device=device)
        return buf[:rows]


class StalenessRule:
    """What one table's async batches do at hand-out and at commit (one rule per loader and table): a
    :class:`~dgl_oac.engine.pipeline.BatchHook`."""

    rule = ""  # its ``staleness=`` value

    @property
    def name(self) -> str:
        return f"staleness rule {self.rule!r}"

    def __init__(self, emb: "NodeEmbedding") -> None:
        self.emb = emb
        self.scratch = Scratch()

    def at_handout(self, table: HookTable, batch: TableRows, leaf: torch.Tensor) -> None:
        """Change ``leaf: float32[n, D]`` (device, the values the batch computes at) in place; default: as read."""

    def before_kernel(self, table: HookTable, batches: List[HandedOut]) -> int:
        """Bring the batches' rows to ``θ_now`` (and change their gradients); returns the rows replaced."""
        return sum(table.catch_up(b) for b in batches)

    def after_kernel(self, rows: torch.Tensor, new: torch.Tensor) -> None:
        """Observe the step: ``rows`` (``θ_now`` ‖ state) and ``new``, ``float32[u, W]`` on the device."""


class GapAware(StalenessRule):
    """Divide each stale gradient coordinate by ``max(1, |θ_now - θ_read| / C)`` (see the module docstring)."""

    rule = "gap"

    def __init__(self, emb: "NodeEmbedding") -> None:
        super().__init__(emb)
        self.step_size: Optional[torch.Tensor] = None  # C: 0-d, on the device (no host sync per step)

    def before_kernel(self, table: HookTable, batches: List[HandedOut]) -> int:
        d = self.emb.embedding_dim
        replaced = 0
        for b in batches:
            read = b.live_leaf().detach()  # the leaf is a copy of the values read: never patched (async)
            replaced += table.catch_up(b)
            if self.step_size is not None and read.numel():
                with torch.profiler.record_function("dgl_oac.gap"):
                    gap = torch.sub(b.rows[:, :d], read, out=self.scratch.take("gap", *read.shape, read.device))
                    gap.abs_().div_(self.step_size.clamp_min(1e-30)).clamp_min_(1.0)
                    # the gradients are this step's alone (the batch is released by it, whatever happens): the
                    # hand-out leaf's (every row), and each emb(ids) read's (its rows `pos`: BatchLoader's reads)
                    for pos, grad, _, _ in b.contributions():
                        grad.div_(gap if pos is None else gap.index_select(0, pos.to(gap.device)))
        return replaced

    def after_kernel(self, rows: torch.Tensor, new: torch.Tensor) -> None:
        d, u = self.emb.embedding_dim, rows.shape[0]
        if not u:
            return
        every = -(-u // STEP_SAMPLE)  # an evenly strided sample of at most STEP_SAMPLE rows
        with torch.profiler.record_function("dgl_oac.step_size"):
            moved = torch.sub(new[::every, :d], rows[::every, :d],
                              out=self.scratch.take("step", -(-u // every), d, new.device))
            step = moved.abs_().mean()
        self.step_size = step if self.step_size is None else self.step_size.mul(GAP_MOMENTUM).add_(
            step, alpha=1.0 - GAP_MOMENTUM)


class LookAhead(StalenessRule):
    """Compute at ``θ_read`` minus the momentum's predicted updates of the steps in flight (module docstring)."""

    rule = "lookahead"

    def at_handout(self, table: HookTable, batch: TableRows, leaf: torch.Tensor) -> None:
        opt = self.emb.optimizer
        if not isinstance(opt, SparseAdam):  # no momentum (Adagrad, SGD): the prediction is no update
            return
        k = table.steps - 1 - batch.rv
        moved = table.moved_since(batch)
        if k <= 0 or moved is None:
            return
        with torch.profiler.record_function("dgl_oac.lookahead"):
            idx = moved.nonzero().squeeze(1)
            if idx.numel():
                leaf.index_add_(0, idx, adam_drift(opt, batch.rows, idx, self.emb.embedding_dim, k, self.scratch),
                                alpha=-1.0)


def adam_drift(opt: SparseAdam, rows: torch.Tensor, idx: torch.Tensor, dim: int, k: int,
               scratch: Optional[Scratch] = None) -> torch.Tensor:
    """``float32[len(idx), D]``: the updates Adam makes to the rows ``idx: int64[r]`` of ``rows: float32[n, W]``
    (``[w | m | v | t]``) in ``k`` more steps with a zero gradient, ``lr · m / (sqrt(v) + eps) · Σ_{j=1..k}
    c_j(t)`` with the per-row factor ``c_j(t) = β1^j / (1 - β1^(t+j)) · sqrt((1 - β2^(t+j)) / β2^j)`` (see the
    module docstring). The result is a ``scratch`` buffer when one is given."""
    b1, b2 = opt.defaults["betas"]
    scratch = scratch or Scratch()
    n, dev = idx.numel(), rows.device
    m_view, v_view = opt._moments(rows, dim)  # the optimizer's own view of its state layout (strided columns)
    if m_view.dtype == torch.float32:  # gathered into contiguous buffers: every pass below runs on them
        m = torch.index_select(m_view, 0, idx, out=scratch.take("m", n, dim, dev))
        v = torch.index_select(v_view, 0, idx, out=scratch.take("v", n, dim, dev))
    else:  # float16 halves packed in the state columns
        m, v = m_view.index_select(0, idx).float(), v_view.index_select(0, idx).float()
    t = rows[:, -1].index_select(0, idx).unsqueeze(1)
    factor = torch.zeros_like(t)  # [r, 1]: a loop over k on one column, not over the rows' D columns
    for j in range(1, k + 1):
        corr1 = torch.pow(b1, t + j).neg_().add_(1.0)  # 1 - b1**(t+j)
        corr2 = torch.pow(b2, t + j).neg_().add_(1.0)  # 1 - b2**(t+j)
        factor.add_(corr2.div_(b2 ** j).sqrt_().div_(corr1).mul_(b1 ** j))
    return m.mul_(factor.mul_(opt.lr)).div_(v.sqrt_().add_(opt.defaults["eps"]))


def make_rule(staleness: Optional[str], emb: "NodeEmbedding") -> Optional[StalenessRule]:
    """The rule of ``staleness`` (None, ``"gap"`` or ``"lookahead"``) for ``emb``'s table."""
    if staleness is None:
        return None
    return {"gap": GapAware, "lookahead": LookAhead}[staleness](emb)
