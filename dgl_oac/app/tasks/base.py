"""What every task shares: the optimiser step, the driver hooks, checkpoint parts and close.

A subclass sets ``cfg``, ``emb``, ``sparse``, ``model``, ``dense``, ``loader`` in ``__init__`` and implements
``step(batch)`` (via :meth:`optimize`; it returns the loss as a 0-d tensor on the device, never read on the host
there: see :meth:`optimize`), ``evaluate()`` and ``dataset_info()``; one that ranks a subset of the
test set (``--eval-limit``) sets ``_test_subset`` in ``evaluate()`` and implements ``_evaluate(splits, full)``.
"""
from __future__ import annotations

from typing import Any, Dict, Iterable, List, Optional, Sequence, Union

import torch

from ...distributed import current_group
from ...distributed.dense import average_gradients
from . import backend


def check_dataset(ds: Any, cls: type, task: str, needs: str, hint: str = "") -> None:
    """Refuse a dataset of the wrong kind for ``--task task``, naming the task that fits it."""
    if isinstance(ds, cls):
        return
    fits = {"NodeDataset": "node", "LinkDataset": "link", "KGDataset": "kg", "HeteroNodeDataset": "hetero-node"}.get(type(ds).__name__)
    advice = ", ".join(x for x in (f"use --task {fits}" if fits else "", hint) if x)
    raise ValueError(f"--task {task} needs {needs}; {ds.name!r} is a {type(ds).__name__}"
                     + (f" ({advice})" if advice else ""))


class EpochLosses:
    """An epoch's training losses, one a step (``step(batch)``'s 0-d tensor, or a float), read on the host only
    when asked (:meth:`values`, the progress bar every few steps, the epoch's end, a checkpoint) or every
    ``every`` steps: one device->host copy for all of them, so adding a step's loss never waits for the device.
    The values are each step's ``float(loss)``, in step order, whenever they are read."""

    def __init__(self, every: int = 1024, done: Sequence[float] = ()) -> None:
        self.every = every  # bounds the device tensors held between reads
        self._read: List[float] = [float(x) for x in done]
        self._pending: List[Union[torch.Tensor, float]] = []

    def __len__(self) -> int:
        return len(self._read) + len(self._pending)

    def add(self, loss: Union[torch.Tensor, float]) -> None:
        self._pending.append(loss)
        if len(self._pending) >= self.every:
            self._flush()

    def values(self) -> List[float]:
        """Every loss so far, as floats (reads the pending ones: one host sync if any is on a device)."""
        self._flush()
        return self._read

    def mean(self, last: Optional[int] = None) -> float:
        """The mean of the last ``last`` losses (all: None); 0.0 for none."""
        xs = self.values()[-last:] if last else self.values()
        return sum(xs) / max(len(xs), 1)

    def _flush(self) -> None:
        items, self._pending = self._pending, []
        tensors = [x for x in items if isinstance(x, torch.Tensor)]
        if items and len(tensors) == len(items) and len({t.device for t in tensors}) == 1:
            self._read += torch.stack([t.reshape(()) for t in tensors]).tolist()  # one copy, one sync
        else:
            self._read += [float(x) for x in items]


class Task:
    _evals = 0  # evaluations so far (subclasses increment in evaluate())
    _steps = 0  # training steps so far (names the step in a collective's error)

    def optimize(self, loss: torch.Tensor, clip: Sequence[Iterable[torch.Tensor]] = (),
                 max_norm: Optional[float] = None) -> torch.Tensor:
        """One training step from ``loss``: dense optimiser, then the sparse commit; returns the loss, detached
        (``float32[]`` on the loss's device). Not read here: ``float(loss)`` would be a host sync every step, and
        the CPU could never run ahead of the device; the driver reads the losses every few steps, together
        (:class:`EpochLosses`). With ``max_norm``, the gradients of each group of ``clip`` (e.g. the batch's
        embedding rows, the encoder, the scorer) are clipped to that norm first, each group on its own (after
        the trainers' average)."""
        self.dense.zero_grad()
        loss.backward()
        group = current_group()
        if group is not None and self.cfg.dense_sync == "allreduce":  # several trainers: DDP's average
            average_gradients((p for g in self.dense.param_groups for p in g["params"]), group, self._steps)
        if max_norm is not None:
            for tensors in clip:
                torch.nn.utils.clip_grad_norm_(list(tensors), max_norm)
        self._steps += 1
        backend.step_sparse(self.sparse)  # first: a non-finite batch raises here and leaves the model intact too
        self.dense.step()
        return loss.detach()

    def sync(self) -> None:
        """Wait until the device (CUDA) has run every step queued; everything committed is then in the table too
        (``emb.weight`` waits for write-backs). Nothing to wait for on the CPU."""
        device = getattr(self, "device", None)
        if isinstance(device, torch.device) and device.type == "cuda":
            torch.cuda.synchronize(device)

    def _last_epoch(self) -> bool:
        """Whether this evaluation follows the run's last epoch (it then scores every valid/test item). The
        loader's epoch counter survives a checkpoint resume; the evaluation count serves plain DGL's loader."""
        done = self._evals
        if hasattr(self.loader, "state_dict"):  # dgl_oac.DataLoader
            done = max(done, int(self.loader.state_dict()["epoch"]))
        return done >= self.cfg.epochs

    _test_subset = False  # the last evaluate() scored only a subset of the test set (--eval-limit)

    def partial_test(self) -> bool:
        """Whether the last ``evaluate()`` scored only a subset of the test set."""
        return self._test_subset

    def full_test(self) -> Dict[str, float]:
        """The ``test_*`` metrics of the current model on the whole test set (the driver asks at each new best
        validation epoch whose test was a subset)."""
        return self._evaluate(("test",), True)

    def checkpoint_parts(self) -> Dict[str, Any]:
        """What a checkpoint holds for this task (keyword arguments of dgl_oac.checkpoint.save/load)."""
        return {"embeddings": [self.emb], "sparse_opt": self.sparse, "dense_modules": {"model": self.model},
                "dense_optimizers": {"dense": self.dense}, "loader": self.loader}

    def close(self) -> None:
        backend.close(self.loader, [self.emb])
