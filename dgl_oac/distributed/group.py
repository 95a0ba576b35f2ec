"""The ranks a table is trained by, and the collectives the protocol uses.

:func:`current_group` is the one place that decides whether dgl-oac runs distributed: ``torch.distributed``
initialised with more than one rank (a world of one is the single-process path, unchanged). The table protocol
(ids, rows, decisions, objects: CPU tensors) runs on a gloo process group of its own, made from the default
group's ranks, whatever backend the default group has: DGL's multi-GPU scripts call
``init_process_group("nccl")``, which refuses CPU tensors. Device tensors (the dense gradients of a model on a
GPU) go through the default group, the backend the user chose for them. Every collective
goes through :class:`Group`, which turns a failure (a peer that died, a collective timeout: the process group's
``timeout``) into a :class:`PeerFailure` that says which collective failed on which rank and which ranks on
this machine have exited (each rank's host and pid are exchanged once, when the group is made), and counts the
bytes each tensor collective sends, by kind (:attr:`Group.sent`).

Machines. Ranks that share a machine share its tables' memory (:mod:`.shared`); a machine is a host name and,
under ``torchrun``, its node rank (``GROUP_RANK``, one per ``torchrun`` agent), so ``torchrun --nnodes=2`` run
twice on one host is two machines, as it is on two hosts. Without torchrun every rank of a host is one machine.
"""
from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import datetime
import os
import socket
import time
import weakref

import torch
import torch.distributed as dist


def _gone(pid: int) -> bool:
    """The process ``pid`` has exited (a zombie its parent has not reaped yet counts as exited)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True
    except OSError:  # no /proc: ask the kernel
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            pass
        return False


def machine_of(env: Optional[Mapping[str, str]] = None) -> Tuple[str, str]:
    """This process's machine: ``(host name, torchrun's node rank GROUP_RANK or "")``."""
    env = os.environ if env is None else env
    return socket.gethostname(), env.get("GROUP_RANK", "")


def machines_of(keys: Sequence[Any]) -> List[List[int]]:
    """The ranks of each machine, machines in the order of their lowest rank, from every rank's machine key."""
    out: Dict[Any, List[int]] = {}
    for rank, key in enumerate(keys):
        out.setdefault(key, []).append(rank)
    return list(out.values())


# How gloo's and NCCL's transports word a peer's failure (gloo raises plain RuntimeErrors, so the type can't tell)
_PEER_WORDS = ("timed out", "timeout", "connection", "peer", "socket", "broken pipe", "nccl error", "aborted")


def _from_peer(exc: BaseException) -> bool:
    """Whether a collective's error comes from the transport (a peer died, hung or failed), not this rank's call."""
    return isinstance(exc, dist.DistError) or any(w in str(exc).lower() for w in _PEER_WORDS)


def _backend(group: Optional[dist.ProcessGroup]) -> str:
    try:
        return str(dist.get_backend(group))
    except (RuntimeError, ValueError):
        return "?"


def _timeout_of(group: Any) -> Optional[datetime.timedelta]:
    """The collective timeout ``group`` was made with (``init_process_group(timeout=...)``), or None if unknown.
    torch exposes it only on each backend's options."""
    for device in ("cpu", "cuda"):
        try:
            return group._get_backend(torch.device(device)).options._timeout
        except (RuntimeError, AttributeError, ValueError):
            continue
    return None


_SAME = object()  # Group(device_group=...) not given: the same group as for CPU tensors


def _weak(group: Optional[dist.ProcessGroup]) -> Any:
    return None if group is None else weakref.ref(group)


def _resolve(ref: Any) -> Optional[dist.ProcessGroup]:
    if ref is None:
        return None  # torch.distributed's default group
    group = ref()
    if group is None:
        raise RuntimeError("dgl_oac's process group was destroyed (torch.distributed.destroy_process_group()): "
                           "its tables can no longer be trained by several ranks")
    return group


class PeerFailure(RuntimeError):
    """A collective failed: another rank died, timed out or failed first. Training cannot continue."""


class Group:
    """``rank`` of ``world`` ranks of a process group (the default one unless given). ``device_group``: the
    process group for tensors not on the CPU (the same one unless given).

    ``sent[kind]``: payload bytes this rank's tensor collectives of that ``kind`` have sent to other ranks so far
    (read it; only the Group writes it). An all-to-all counts the rows addressed to other ranks, a broadcast
    counts the tensor once per receiver on rank 0, an all-reduce counts the tensor once (what each rank
    contributes: the backend's algorithm decides how often it crosses the wire, a ring 2(N-1)/N times). Object
    collectives and barriers (set-up, checkpoints) are not counted.
    """

    def __init__(self, group: Optional[dist.ProcessGroup] = None, device_group: Any = _SAME) -> None:
        # weakly: c10d's own map holds the groups until the user's destroy_process_group(); a strong reference
        # here kept them alive until interpreter finalization, where tearing gloo down aborts now and then
        self._group = _weak(group)
        self._device_group = self._group if device_group is _SAME else _weak(device_group)
        self.rank = dist.get_rank(group)
        self.world = dist.get_world_size(group)
        self.sent: Dict[str, int] = {}
        self.peers: List[Any] = [None] * self.world  # (host, pid, machine key) of every rank
        self._run("exchange of host names and pids", dist.all_gather_object, self.peers,
                  (socket.gethostname(), os.getpid(), machine_of()))
        #: the ranks of each machine (:func:`machines_of`); ``machine``: the index of this rank's
        self.machines: List[List[int]] = machines_of([p[2] for p in self.peers])
        self.machine = next(i for i, ranks in enumerate(self.machines) if self.rank in ranks)

    @property
    def group(self) -> Optional[dist.ProcessGroup]:
        """The process group of CPU tensors and objects (None: the default group)."""
        return _resolve(self._group)

    @property
    def leader(self) -> int:
        """The lowest rank of this rank's machine: it creates and fills the machine's shared tables."""
        return self.machines[self.machine][0]

    def exited(self, wait: float = 1.0) -> List[int]:
        """Ranks on this machine whose process has exited (polled for up to ``wait`` s: a peer's connection
        closes a moment before its process is gone)."""
        host = socket.gethostname()
        local = [r for r, peer in enumerate(self.peers) if peer is not None and peer[0] == host and r != self.rank]
        deadline = time.monotonic() + wait
        while True:
            out = [r for r in local if _gone(self.peers[r][1])]
            if out or time.monotonic() > deadline:
                return out
            time.sleep(0.05)

    def _run(self, what: str, fn: Any, *args: Any, tensor: Optional[torch.Tensor] = None, **kwargs: Any) -> Any:
        """``fn(*args, group=..., **kwargs)`` on the group for ``tensor``'s device (the CPU one without a tensor);
        a peer's failure becomes :class:`PeerFailure`, an error of this rank's own call names itself as such."""
        group = self.group if tensor is None or tensor.device.type == "cpu" else _resolve(self._device_group)
        try:
            return fn(*args, group=group, **kwargs)
        except RuntimeError as exc:  # gloo/NCCL errors (DistBackendError, timeouts) are RuntimeErrors
            dead = self.exited()
            if not dead and not _from_peer(exc):
                # e.g. "No backend type associated with device type cpu": not a peer's failure, so don't blame one
                raise RuntimeError(
                    f"rank {self.rank} of {self.world}: the collective {what!r} could not run on this rank's "
                    f"process group (backend {_backend(group)!r}, tensor on "
                    f"{'cpu' if tensor is None else tensor.device}): {type(exc).__name__}: {exc}") from exc
            cause = (f"rank(s) {dead} exited" if dead else
                     "no rank on this machine has exited: another rank timed out, failed (see its own error) or "
                     "stopped calling step()")
            raise PeerFailure(f"rank {self.rank} of {self.world}: the collective {what!r} failed: {cause}; this "
                              f"rank stops too ({type(exc).__name__}: {exc})") from exc

    def _count(self, kind: str, nbytes: int) -> None:
        if kind:  # "": the caller counts the bytes by purpose itself
            self.sent[kind] = self.sent.get(kind, 0) + nbytes

    def barrier(self, what: str = "barrier") -> None:
        """Wait for every rank; ``what`` names it in a :class:`PeerFailure` when a rank is gone."""
        self._run(what, dist.barrier)

    def broadcast_object(self, obj: Any, what: str = "broadcast") -> Any:
        """``obj`` of rank 0, on every rank."""
        box = [obj]
        self._run(what, dist.broadcast_object_list, box, src=0)
        return box[0]

    def all_to_all(self, out: torch.Tensor, inp: torch.Tensor, out_splits: Optional[List[int]] = None,
                   in_splits: Optional[List[int]] = None, what: str = "all_to_all", kind: str = "other") -> None:
        """``inp``'s rows split by ``in_splits`` (even without) to the ranks; ``out`` gets theirs."""
        self._run(what, dist.all_to_all_single, out, inp, out_splits, in_splits, tensor=inp)
        rows = inp.shape[0]
        own = in_splits[self.rank] if in_splits is not None else rows // self.world
        self._count(kind, (rows - own) * (inp.numel() // max(rows, 1)) * inp.element_size())

    def all_reduce(self, tensor: torch.Tensor, what: str = "all_reduce", kind: str = "other") -> None:
        """Sum ``tensor`` over the ranks, in place (on its device: gloo for CPU, NCCL for CUDA tensors)."""
        self._run(what, dist.all_reduce, tensor, tensor=tensor)
        self._count(kind, tensor.numel() * tensor.element_size())

    def broadcast(self, tensor: torch.Tensor, what: str = "broadcast", kind: str = "other") -> None:
        """Rank 0's ``tensor`` on every rank, in place."""
        self._run(what, dist.broadcast, tensor, src=0, tensor=tensor)
        self._count(kind, (self.world - 1) * tensor.numel() * tensor.element_size() if self.rank == 0 else 0)

    def all_gather_object(self, obj: Any, what: str = "all_gather_object") -> List[Any]:
        """Every rank's ``obj``, in rank order."""
        out: List[Any] = [None] * self.world
        self._run(what, dist.all_gather_object, out, obj)
        return out

    def ranks_flagging(self, flag: bool, what: str) -> List[int]:
        """The ranks whose ``flag`` is True (every rank learns the same list: a collective decision)."""
        flags = torch.zeros(self.world, dtype=torch.int32)
        flags[self.rank] = int(flag)
        self.all_reduce(flags, what, kind="decision")
        return [r for r in range(self.world) if flags[r]]


# (a weak reference to the default process group, its Group): one per process group. Weak because a strong one
# kept the group alive after the user's destroy_process_group(), so gloo's threads were torn down during
# interpreter finalization, which aborts now and then ("terminate called without an active exception").
_CURRENT: List[Any] = [None, None]


def current_group() -> Optional[Group]:
    """The trainers' :class:`Group` when ``torch.distributed`` is initialised with more than one rank, else None:
    a gloo group of its own for the table's CPU tensors (with the default group's timeout), the default group
    for device tensors. Collective the first time for a process group (every rank calls it when it builds a
    NodeEmbedding)."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return None
    world = dist.group.WORLD
    if _CURRENT[0] is None or _CURRENT[0]() is not world:
        table = dist.new_group(backend="gloo", timeout=_timeout_of(world))
        _CURRENT[:] = [weakref.ref(world), Group(table, device_group=None)]
    return _CURRENT[1]
