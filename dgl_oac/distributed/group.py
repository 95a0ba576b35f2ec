"""The ranks a table is trained by, and the collectives the protocol uses.

:func:`current_group` is the one place that decides whether dgl-oac runs distributed: ``torch.distributed``
initialised with more than one rank (a world of one is the single-process path, unchanged). Every collective
goes through :class:`Group`, which turns a failure (a peer that died, a collective timeout: the process group's
``timeout``) into a :class:`PeerFailure` that says which collective of which step failed on which rank.
"""
from __future__ import annotations

from typing import Any, List, Optional

import torch
import torch.distributed as dist


class PeerFailure(RuntimeError):
    """A collective failed: another rank died, timed out or failed first. Training cannot continue."""


class Group:
    """``rank`` of ``world`` ranks of a process group (the default one unless given)."""

    def __init__(self, group: Optional[dist.ProcessGroup] = None) -> None:
        self.group = group
        self.rank = dist.get_rank(group)
        self.world = dist.get_world_size(group)

    def _run(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, group=self.group, **kwargs)
        except RuntimeError as exc:  # gloo/NCCL errors (DistBackendError, timeouts) are RuntimeErrors
            raise PeerFailure(f"rank {self.rank} of {self.world}: the collective {what!r} failed ({exc}); another "
                              f"rank has probably died or stopped calling step() (see its own error); this rank "
                              f"stops too") from exc

    def barrier(self, what: str = "barrier") -> None:
        self._run(what, dist.barrier)

    def broadcast_object(self, obj: Any, what: str = "broadcast") -> Any:
        """``obj`` of rank 0, on every rank."""
        box = [obj]
        self._run(what, dist.broadcast_object_list, box, src=0)
        return box[0]

    def all_to_all(self, out: torch.Tensor, inp: torch.Tensor, out_splits: Optional[List[int]] = None,
                   in_splits: Optional[List[int]] = None, what: str = "all_to_all") -> None:
        self._run(what, dist.all_to_all_single, out, inp, out_splits, in_splits)

    def ranks_flagging(self, flag: bool, what: str) -> List[int]:
        """The ranks whose ``flag`` is True (every rank learns the same list: a collective decision)."""
        flags = torch.zeros(self.world, dtype=torch.int32)
        flags[self.rank] = int(flag)
        self._run(what, dist.all_reduce, flags)
        return [r for r in range(self.world) if flags[r]]


def current_group() -> Optional[Group]:
    """The default process group when ``torch.distributed`` is initialised with more than one rank, else None."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return None
    return Group()
