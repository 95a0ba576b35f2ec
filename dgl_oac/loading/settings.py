"""What every loader is told, resolved and checked once: :class:`LoaderSettings`."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Union

import torch

from ..config import (check_mode, check_priority, check_staleness, resolve_check_finite, resolve_device,
                      resolve_pin, table_mode)
from .depth import DepthController, resolve_depths


@dataclass(frozen=True)
class LoaderSettings:
    """A loader's settings (``dgl_oac.DataLoader``'s and ``dgl_oac.BatchLoader``'s arguments of the same names),
    as the epoch and the tables use them. Made by :meth:`resolve`."""

    mode: str
    staleness: Optional[str]  # async's rule for stale rows (dgl_oac.baselines.staleness); None elsewhere
    table_mode: str  # what the tables are told: mode, or mode-staleness (dgl_oac.config.table_mode)
    device: torch.device
    pin: bool
    check_finite: bool
    #: the most batches read ahead: the depth itself, or with prefetch="auto" the deepest the controller picks
    prefetch: int
    #: prefetch="auto": chooses the depth online, 0 or up to ``prefetch`` (dgl_oac.loading.depth); else None
    depth_controller: Optional[DepthController]
    writeback_depth: int
    background_priority: str

    @classmethod
    def resolve(cls, mode: str, device: Any, prefetch: Union[int, str], writeback_depth: Optional[int],
                pin: Any, check_finite: Optional[bool], background_priority: str,
                staleness: Optional[str] = None) -> "LoaderSettings":
        """Check each argument (a clear error naming the one that is wrong) and resolve the defaults:
        ``device=None`` is the CPU, ``pin="auto"`` and ``check_finite=None`` depend on the device."""
        mode = check_mode(mode)
        staleness = check_staleness(staleness, mode)
        dev = resolve_device("cpu" if device is None else device)
        depth, controller, wb = resolve_depths(prefetch, writeback_depth)
        return cls(mode=mode, staleness=staleness, table_mode=table_mode(mode, staleness), device=dev,
                   pin=resolve_pin(pin, dev), check_finite=resolve_check_finite(check_finite, dev),
                   prefetch=depth, depth_controller=controller, writeback_depth=wb,
                   background_priority=check_priority(background_priority))

    def first_depth(self) -> int:
        """The depth an epoch starts at."""
        return self.prefetch if self.depth_controller is None else self.depth_controller.depth()
