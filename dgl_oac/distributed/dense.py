"""Dense parameters with N trainers: DDP's semantics (rank 0's initial values, gradients averaged over the
ranks before every optimizer step), done by hand for ``dgl-oac train``.

Why not ``DistributedDataParallel`` there: DDP's reducer all-reduces only after a forward through the wrapper,
and the tasks call their models' methods as well (the KG scorers' ``score``/``score_neg``/``rel``), which
would silently train each rank's copy apart. Averaging the gradients the dense optimizer is about to apply
covers every task the same way, in one collective per step, named on failure (:class:`.group.PeerFailure`).
A user's own loop keeps DDP (``examples/multi_trainer.py``).
"""
from __future__ import annotations

from typing import Dict, Iterable, List

import torch

from .group import Group


def broadcast_module(module: torch.nn.Module, group: Group) -> None:
    """Give every rank rank 0's parameters and buffers (as DDP does when it wraps a module). Collective."""
    for name, t in list(module.named_parameters()) + list(module.named_buffers()):
        with torch.no_grad():
            group.broadcast(t.data, what=f"initial value of {name!r} from rank 0", kind="dense")


def average_gradients(params: Iterable[torch.Tensor], group: Group, step: int) -> None:
    """Replace each parameter's gradient by its sum over the ranks divided by their number, DDP's average (a
    rank without one adds zeros, as with DDP's ``find_unused_parameters``; a parameter no rank has a gradient
    for keeps none, so the optimizer skips it as in one process). One all-reduce per device. Collective."""
    by_device: Dict[torch.device, List[torch.Tensor]] = {}
    for p in params:
        if p.requires_grad:
            by_device.setdefault(p.device, []).append(p)
    for ps in by_device.values():
        has = torch.tensor([float(p.grad is not None) for p in ps], device=ps[0].device)
        flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in ps] + [has])
        group.all_reduce(flat, what=f"step {step}: dense gradients", kind="dense")
        grads, has = flat[:-len(ps)].div_(group.world), flat[-len(ps):]
        for p, g, any_rank in zip(ps, grads.split([p.numel() for p in ps]), has.tolist()):
            if any_rank:
                p.grad = g.view_as(p).clone()
