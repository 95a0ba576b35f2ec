"""``dgl-oac train`` under ``torchrun``: N trainers, one process each.

``torchrun --standalone --nproc_per_node=N -m dgl_oac train ...`` sets ``WORLD_SIZE``, ``RANK``, ``LOCAL_RANK``
and the rendezvous in the environment; :func:`start` then initialises ``torch.distributed`` before the task is
built, so every table the task makes is one shared table trained by N-trainer sync steps
(:mod:`dgl_oac.distributed`), the loaders take ``use_ddp=True`` (:func:`dgl_oac.app.tasks.backend.make_loader`), the
dense parameters start from rank 0's and their gradients are averaged (:mod:`dgl_oac.distributed.dense`; or,
with ``--dense-sync shadow``, the parameters in the background, :mod:`dgl_oac.baselines.shadow`), and
only rank 0 evaluates, prints and writes ``--out`` (:mod:`dgl_oac.app.tasks.common`). Without ``WORLD_SIZE`` (or
with 1) nothing changes.

Settings are resolved by pure functions (:func:`trainer_device`, :func:`backend_for`), so the CUDA choices
are tested on CPU.
"""
from __future__ import annotations

import os
from typing import Any, Mapping, Optional

import torch

from ...distributed import Group, current_group

#: modes with several trainers: async reads stale rows (the N-trainer step still runs on the owners' rows); dgl is
#: plain DGL's single-process path
MODES = ("sync", "oac", "async")


def world_size(env: Mapping[str, str]) -> int:
    """The number of trainers torchrun started (``WORLD_SIZE``; 1 without torchrun)."""
    text = env.get("WORLD_SIZE", "1")
    try:
        world = int(text)
    except ValueError:
        world = 0
    if world < 1:
        raise ValueError(f"WORLD_SIZE must be a positive integer, got {text!r}")
    return world


def trainer_device(device: str, local_rank: int, cuda_available: bool) -> str:
    """This trainer's ``--device``: ``cuda`` (or ``auto`` with CUDA present) becomes ``cuda:<LOCAL_RANK>``,
    one GPU per trainer; an explicit ``cuda:N`` or ``cpu`` is kept."""
    if device == "cuda" or (device == "auto" and cuda_available):
        return f"cuda:{local_rank}"
    return "cpu" if device == "auto" else device


def backend_for(device: str) -> str:
    """The process group's backend: gloo on CPU; with CUDA, NCCL for CUDA tensors (the dense gradients) and
    gloo for CPU ones (the table's rows and ids travel as CPU tensors, :mod:`dgl_oac.distributed.exchange`)."""
    return "cpu:gloo,cuda:nccl" if torch.device(device).type == "cuda" else "gloo"


def start(cfg: Any, env: Optional[Mapping[str, str]] = None) -> Optional[Group]:
    """Under torchrun (``WORLD_SIZE`` > 1): check ``cfg``, set ``cfg.device`` to this trainer's, initialise
    ``torch.distributed`` (torchrun's rendezvous) and return the trainers' :class:`Group`; else None."""
    env = os.environ if env is None else env
    world = world_size(env)
    if world == 1:
        return None
    if cfg.mode not in MODES:
        raise ValueError(f"--mode {cfg.mode} with {world} trainers (WORLD_SIZE={world}): several trainers train "
                         f"with --mode {' or --mode '.join(MODES)} (sync and oac: the same table, bit for bit)")
    cfg.device = trainer_device(cfg.device, int(env.get("LOCAL_RANK", "0")), torch.cuda.is_available())
    if torch.device(cfg.device).type == "cuda":
        torch.cuda.set_device(torch.device(cfg.device))
    import torch.distributed as dist

    dist.init_process_group(backend_for(cfg.device))
    return current_group()


def stop() -> None:
    """Tear down what :func:`start` initialised (every rank calls it once training is over)."""
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


def is_lead() -> bool:
    """Whether this process evaluates, prints and writes files: rank 0, or the only process."""
    group = current_group()
    return group is None or group.rank == 0
