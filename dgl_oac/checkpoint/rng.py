"""The process's random number generators' states (torch, NumPy, Python, CUDA) as plain data, which a checkpoint
saves (``torch.save``) and reads back with ``weights_only=True``."""
from __future__ import annotations

import random
from typing import Any, Dict

import numpy as np
import torch


def rng_state() -> Dict[str, Any]:
    """Every generator's state: tensors, numbers, strings and tuples only."""
    name, keys, pos, has_gauss, gauss = np.random.get_state()
    return {"torch": torch.get_rng_state(), "numpy": (name, torch.from_numpy(keys.astype(np.int64)), pos,
                                                      has_gauss, gauss),
            "python": random.getstate(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []}


def set_rng_state(state: Dict[str, Any]) -> None:
    """Restore :func:`rng_state`'s ``state`` (CUDA's only on a machine with as many devices)."""
    torch.set_rng_state(state["torch"])
    name, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    random.setstate(_tuples(state["python"]))
    if state["cuda"] and torch.cuda.is_available() and len(state["cuda"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(state["cuda"])


def _tuples(x: Any) -> Any:
    """random.setstate needs tuples; a round trip may turn them into lists."""
    return tuple(_tuples(v) for v in x) if isinstance(x, (list, tuple)) else x
