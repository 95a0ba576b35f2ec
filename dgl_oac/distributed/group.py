"""The ranks a table is trained by, and the collectives the protocol uses.

:func:`current_group` is the one place that decides whether dgl-oac runs distributed: ``torch.distributed``
initialised with more than one rank (a world of one is the single-process path, unchanged). The table protocol
(ids, rows, decisions, objects: CPU tensors) runs on a gloo process group of its own, made from the default
group's ranks, whatever backend the default group has: DGL's multi-GPU scripts call
``init_process_group("nccl")``, which refuses CPU tensors. Device tensors (the dense gradients of a model on a
GPU) go through the default group, the backend the user chose for them. Every collective
goes through :class:`Group`, which turns a failure (a peer that died, a collective timeout: the process group's
``timeout``) into a :class:`PeerFailure` that says which collective failed on which rank and which ranks have
exited or fallen silent, with their host, pid and machine (exchanged once, when the group is made), and counts
the bytes each tensor collective sends, by kind (:attr:`Group.sent`).

Liveness. A machine that loses power, is cut off or freezes keeps its peers' sockets open, so a blocking gloo
collective would wait for the process group's timeout. The Group's :class:`~.liveness.Liveness` monitor beats
through the rendezvous store; CPU collectives run with ``async_op=True`` and are waited on in slices, so a peer
silent for ``DGL_OAC_PEER_TIMEOUT`` s (default 10) ends the wait with a PeerFailure naming it, and every later
collective of that Group fails at once. Device collectives (NCCL) keep their blocking call and their backend's
own timeout.

Machines. Ranks that share a machine share its tables' memory (:mod:`.shared`); a machine is a host name and,
under ``torchrun``, its node rank (``GROUP_RANK``, one per ``torchrun`` agent), so ``torchrun --nnodes=2`` run
twice on one host is two machines, as it is on two hosts. Without torchrun every rank of a host is one machine.
"""
from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import atexit
import ctypes
import datetime
import os
import pickle
import socket
import weakref

import torch
import torch.distributed as dist

from ..engine.runtime import finalizer
from .liveness import ENV, Liveness, Verdict, exited, from_peer, peer_timeout as peer_timeout_of_env


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


def _pickled(obj: Any) -> torch.Tensor:
    """``obj``'s pickle: uint8[n], CPU."""
    return torch.frombuffer(bytearray(pickle.dumps(obj)), dtype=torch.uint8)


def _abandon(group: Optional[dist.ProcessGroup]) -> None:
    """Never free ``group``: a collective of it is blocked on a silent peer, and gloo's destructor joins the thread
    that runs it, so the process would hang at exit (or wherever the group's last reference goes) until the
    process group's timeout. A failed rank must be able to exit; a leaked group costs its buffers and threads."""
    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(pg))


class PeerFailure(RuntimeError):
    """A collective failed: another rank died, timed out or failed first. Training cannot continue."""


class Group:
    """``rank`` of ``world`` ranks of a process group (the default one unless given). ``device_group``: the
    process group for tensors not on the CPU (the same one unless given). ``peer_timeout``: seconds a peer may
    stay silent before its collectives fail (:mod:`.liveness`; None: ``$DGL_OAC_PEER_TIMEOUT``, default 10;
    0: no monitor, a hung peer is seen at the process group's timeout); the same on every rank. Collective to
    make; :meth:`close` (idempotent; also run when the Group is collected) stops the monitor's thread.

    ``sent[kind]``: payload bytes this rank's tensor collectives of that ``kind`` have sent to other ranks so far
    (read it; only the Group writes it). An all-to-all counts the rows addressed to other ranks, a broadcast
    counts the tensor once per receiver on rank 0, an all-reduce counts the tensor once (what each rank
    contributes: the backend's algorithm decides how often it crosses the wire, a ring 2(N-1)/N times). Object
    collectives and barriers (set-up, checkpoints) are not counted.
    """

    def __init__(self, group: Optional[dist.ProcessGroup] = None, device_group: Any = _SAME,
                 peer_timeout: Optional[float] = None) -> None:
        # weakly: c10d's own map holds the groups until the user's destroy_process_group(); a strong reference
        # here kept them alive until interpreter finalization, where tearing gloo down aborts now and then
        self._group = _weak(group)
        self._device_group = self._group if device_group is _SAME else _weak(device_group)
        self.rank = dist.get_rank(group)
        self.world = dist.get_world_size(group)
        self.sent: Dict[str, int] = {}
        self._failed: Optional[str] = None  # why a collective failed: every later one fails at once with it
        bound = peer_timeout_of_env() if peer_timeout is None else (float(peer_timeout) or None)
        # before the exchange: a peer's first heartbeat read comes after it, and finds this rank's key
        self._liveness = Liveness.of_group(group, self.rank, self.world, bound) if bound else None
        self._closer = finalizer(self, Liveness.close, self._liveness) if self._liveness else None
        #: (host, pid, machine key) of every rank; the ranks of each machine (:func:`machines_of`)
        self.peers: List[Any] = [None] * self.world
        self.machines: List[List[int]] = []
        info = self.all_gather_object((socket.gethostname(), os.getpid(), machine_of(), bound),
                                      "exchange of host names, pids and liveness bounds")
        self.peers = [i[:3] for i in info]
        self.machines = machines_of([p[2] for p in self.peers])
        #: the index of this rank's machine in :attr:`machines`
        self.machine = next(i for i, ranks in enumerate(self.machines) if self.rank in ranks)
        if len({i[3] for i in info}) > 1:
            self.close()
            raise ValueError(f"{ENV} differs across the ranks (seconds, None: off): {[i[3] for i in info]}; "
                             "every rank must tolerate a silent peer equally long")
        if self._liveness is not None:
            self._liveness.start()

    def close(self) -> None:
        """Stop the liveness monitor's heartbeat (its peers then declare this rank dead if they still wait on
        it); idempotent."""
        if self._closer is not None:
            self._closer()

    @property
    def group(self) -> Optional[dist.ProcessGroup]:
        """The process group of CPU tensors and objects (None: the default group)."""
        return _resolve(self._group)

    @property
    def leader(self) -> int:
        """The lowest rank of this rank's machine: it creates and fills the machine's shared tables."""
        return self.machines[self.machine][0]

    def exited(self, wait: float = 1.0) -> List[int]:
        """Ranks on this host whose process has exited (:func:`.liveness.exited`)."""
        return exited(self.peers, self.rank, wait)

    def where(self, ranks: Sequence[int]) -> str:
        """``ranks``' hosts, pids and machines, for error messages."""
        out = []
        for r in ranks:
            host, pid, key = self.peers[r] or ("?", "?", "?")
            machine = next((i for i, rs in enumerate(self.machines) if r in rs), "?")
            out.append(f"rank {r}: host {host!r}, pid {pid}, machine {machine} {key}")
        return "; ".join(out)

    def _run(self, what: str, fn: Any, *args: Any, tensor: Optional[torch.Tensor] = None, **kwargs: Any) -> None:
        """``fn(*args, group=..., **kwargs)`` (a tensor collective) on the group for ``tensor``'s device (the CPU
        one without a tensor). On the CPU group it runs with ``async_op=True`` and is waited on under the liveness
        monitor. A peer's failure (exited, silent, a transport error) becomes :class:`PeerFailure`, and every
        later collective of this Group fails at once with it; an error of this rank's own call names itself."""
        if self._failed is not None:
            raise PeerFailure(f"rank {self.rank} of {self.world}: the collective {what!r} cannot run: this group "
                              f"failed earlier ({self._failed})")
        cpu = tensor is None or tensor.device.type == "cpu"
        group = self.group if cpu else _resolve(self._device_group)
        try:
            if not cpu or self._liveness is None:
                fn(*args, group=group, **kwargs)
                return
            verdict = self._liveness.wait(fn(*args, group=group, async_op=True, **kwargs))
        except RuntimeError as exc:  # gloo/NCCL errors (DistBackendError, timeouts) are RuntimeErrors
            dead = self.exited()
            if not dead and not from_peer(exc):
                # e.g. "No backend type associated with device type cpu": not a peer's failure, so don't blame one
                raise RuntimeError(
                    f"rank {self.rank} of {self.world}: the collective {what!r} could not run on this rank's "
                    f"process group (backend {_backend(group)!r}, tensor on "
                    f"{'cpu' if tensor is None else tensor.device}): {type(exc).__name__}: {exc}") from exc
            if dead:
                cause = f"rank(s) {dead} exited ({self.where(dead)})"
            else:  # a process that died on another machine falls silent: wait for the monitor to say which
                live = self._liveness
                verdict = live.verdict_within(live.bound + 2 * live.interval) if live is not None else Verdict()
                cause = verdict.explain(self.where) if verdict else (
                    "no rank has exited or fallen silent: another rank timed out, failed (see its own error) or "
                    "stopped calling step()")
            raise self._fail(what, cause, exc) from exc
        if verdict:
            _abandon(group)
            raise self._fail(what, verdict.explain(self.where), None)

    def _fail(self, what: str, cause: str, exc: Optional[BaseException]) -> PeerFailure:
        msg = f"rank {self.rank} of {self.world}: the collective {what!r} failed: {cause}; this rank stops too"
        self._failed = msg if exc is None else f"{msg} ({type(exc).__name__}: {exc})"
        return PeerFailure(self._failed)

    def _count(self, kind: str, nbytes: int) -> None:
        if kind:  # "": the caller counts the bytes by purpose itself
            self.sent[kind] = self.sent.get(kind, 0) + nbytes

    def barrier(self, what: str = "barrier") -> None:
        """Wait for every rank; ``what`` names it in a :class:`PeerFailure` when a rank is gone."""
        self._run(what, dist.barrier)

    def broadcast_object(self, obj: Any, what: str = "broadcast") -> Any:
        """``obj`` of rank 0 (pickled), on every rank; rank 0 gets ``obj`` itself. Two broadcasts (length,
        bytes): torch's object collectives block and could not be watched by the liveness monitor."""
        data = _pickled(obj) if self.rank == 0 else torch.empty(0, dtype=torch.uint8)
        size = torch.tensor([data.numel()], dtype=torch.int64)
        self._run(what, dist.broadcast, size, src=0)
        if self.rank != 0:
            data = torch.empty(int(size), dtype=torch.uint8)
        self._run(what, dist.broadcast, data, src=0)
        return obj if self.rank == 0 else pickle.loads(data.numpy().tobytes())

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
        """Every rank's ``obj`` (pickled), in rank order: two all-gathers (lengths, bytes padded to the longest)."""
        data = _pickled(obj)
        sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(self.world)]
        self._run(what, dist.all_gather, sizes, torch.tensor([data.numel()], dtype=torch.int64))
        padded = torch.zeros(max(int(n) for n in sizes), dtype=torch.uint8)
        padded[:data.numel()] = data
        out = [torch.empty_like(padded) for _ in range(self.world)]
        self._run(what, dist.all_gather, out, padded)
        return [pickle.loads(b[:int(n)].numpy().tobytes()) for b, n in zip(out, sizes)]

    def ranks_flagging(self, flag: bool, what: str) -> List[int]:
        """The ranks whose ``flag`` is True (every rank learns the same list: a collective decision)."""
        flags = torch.zeros(self.world, dtype=torch.int32)
        flags[self.rank] = int(flag)
        self.all_reduce(flags, what, kind="decision")
        return [r for r in range(self.world) if flags[r]]


# (a weak reference to the default process group, its Group, the Group's own gloo process group): one per
# default process group. The default group weakly: a strong reference kept it alive after the user's
# destroy_process_group(), so gloo's threads were torn down during interpreter finalization, which aborts now and
# then ("terminate called without an active exception"). The table's gloo group strongly, until the next default
# group or exit (_release_at_exit): on torch 2.7.0 a gloo group that only c10d references is destroyed inside
# destroy_process_group()'s clearing of its maps, and that deadlocks now and then (scripts/repro_destroy_hang.py:
# a plain torch repro is its "unreferenced side group" case).
_CURRENT: List[Any] = [None, None, None]


@atexit.register
def _release_at_exit() -> None:
    """Tear the table's gloo group down while the interpreter still runs (not during its finalization)."""
    if _CURRENT[1] is not None:
        _CURRENT[1].close()
    _CURRENT[:] = [None, None, None]


def current_group() -> Optional[Group]:
    """The trainers' :class:`Group` when ``torch.distributed`` is initialised with more than one rank, else None:
    a gloo group of its own for the table's CPU tensors (with the default group's timeout), the default group
    for device tensors. Collective the first time for a process group (every rank calls it when it builds a
    NodeEmbedding)."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return None
    world = dist.group.WORLD
    if _CURRENT[0] is None or _CURRENT[0]() is not world:
        if _CURRENT[1] is not None:
            _CURRENT[1].close()  # its process group was destroyed: its heartbeat ends now, not at the next beat
        table = dist.new_group(backend="gloo", timeout=_timeout_of(world))
        _CURRENT[:] = [weakref.ref(world), Group(table, device_group=None), table]
    return _CURRENT[1]
