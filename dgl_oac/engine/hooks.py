"""The one interface through which a baseline changes what a batch computes: a :class:`BatchHook`.

The engine's exact modes need none. A batch of ``mode="async"`` may carry a hook, given per table by its loader
(the baselines implement async's rules for stale rows as hooks; the engine knows none of them). A batch
with a hook is overwritten and logged at commit like an oac batch (naive async, without one, adds ``new - old``).
The engine calls a hook at three points, all on the caller's thread and device stream:

* hand-out (:mod:`dgl_oac.engine.handout`), after the copy is waited for and before the leaf is made:
  :meth:`BatchHook.at_handout` may change the values the batch computes at;
* commit (:mod:`dgl_oac.engine.commit`), before the kernel: :meth:`BatchHook.before_kernel` brings the
  step's batches to the current rows (``table.catch_up``) and may rescale their gradients;
* commit, after the kernel, before anything is written: :meth:`BatchHook.after_kernel` observes the step.

What a hook may use of its table is :class:`HookTable`; it never writes the table, the log or the clock.
"""
from __future__ import annotations

from typing import List, Optional, Protocol, Sequence

import torch

from .batch import HandedOut, TableRows
from .refresh import Count


class HookTable(Protocol):
    """What the engine offers a hook of its table (a :class:`~dgl_oac.engine.pipeline.TablePipeline`)."""

    name: str

    @property
    def steps(self) -> int:
        """Steps committed so far (the next step's number)."""

    def catch_up(self, batch: HandedOut) -> Count:
        """Bring an async batch's rows (read at ``batch.rv``) to the newest step; returns the rows replaced (an
        int, or a 0-d device tensor: counted without a host sync)."""

    def moved_since(self, batch: TableRows) -> Optional[torch.Tensor]:
        """``bool[n]`` (device): the batch's rows a step after its read version wrote (None: none can have)."""


class BatchHook(Protocol):
    """What one table's async batches do at hand-out and at commit (one hook per loader and table)."""

    #: what a user calls it in an error message
    name: str

    def at_handout(self, table: HookTable, batch: TableRows, leaf: torch.Tensor) -> None:
        """Change ``leaf: float32[n, D]`` (device, the values the gathered ``batch`` computes at) in place, or
        not."""

    def before_kernel(self, table: HookTable, batches: List[HandedOut]) -> Count:
        """Bring ``batches``' rows to the current rows (and change their gradients); returns the rows replaced."""

    def after_kernel(self, rows: torch.Tensor, new: torch.Tensor) -> None:
        """Observe the step: ``rows`` (current value ‖ state) and ``new``, ``float32[u, W]`` on the device."""


def hook_of(table_name: str, batches: Sequence[HandedOut]) -> Optional[BatchHook]:
    """The one hook of a step's batches (None: none has one). A step may mix them with sync reads (``emb(ids)``,
    current rows), not with another hook's or naive async batches (deltas)."""
    hooks = {id(b.hook): b.hook for b in batches if b.hook is not None}
    if len(hooks) > 1 or (hooks and any(b.adds for b in batches)):
        names = sorted({getattr(h, "name", type(h).__name__) for h in hooks.values()} |
                       ({"naive async"} if any(b.adds for b in batches) else set()))
        raise RuntimeError(f"one step of NodeEmbedding {table_name!r} commits async batches of different rules "
                           f"({', '.join(names)}); call step() after each loader's batch")
    return next(iter(hooks.values()), None)
