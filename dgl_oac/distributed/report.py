"""A child process's result, sent to its parent: the value as bytes, or the traceback.

Used by :func:`dgl_oac.dgl_frontend.distgraph.launch_local` (and the tests' rank pool): a child runs
``fn(*args)`` inside :func:`report`, the parent turns each message back with :func:`value_of`.
"""
from __future__ import annotations

import io
import traceback
from typing import Any, Callable

import torch
import torch.distributed as dist


def report(out: Any, rank: int, fn: Callable[..., Any], *args: Any) -> None:
    """Put ``(rank, True, bytes of fn(*args))`` or ``(rank, False, traceback)`` on the queue ``out``; the process
    group, if one is up, is destroyed after either."""
    try:
        value = fn(*args)
        buf = io.BytesIO()
        torch.save(value, buf)  # bytes, not shared-memory handles
        out.put((rank, True, buf.getvalue()))
    except BaseException:  # noqa: BLE001 - reported to the parent
        out.put((rank, False, traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def value_of(data: bytes) -> Any:
    """The value a child reported."""
    return torch.load(io.BytesIO(data), weights_only=False)
