"""Resolve "auto" settings in one place (device, pinning, mode), from their arguments only: none of them reads an
environment variable.

The environment variables dgl-oac reads are deployment settings (a compiler and a cache folder for the native
row ops, the distributed row service's address and timeouts), each listed with its default in one place:
``docs/api/environment.md``. Those of the distributed committer and row service and the background threads'
team are parsed here (:func:`mirror_from_env`, :func:`row_timeout_from_env`, :func:`background_threads_from_env`:
a bad value is an error that names the variable);
``dgl_oac/native/loader.py`` reads its own (the native package imports nothing else of dgl_oac).
"""
from __future__ import annotations

import math
from typing import Callable, Mapping, Optional, Union

import torch

MODES = ("sync", "async", "oac")
PRIORITIES = ("auto", "idle", "normal")  # dgl_oac.engine.runtime.set_thread_priority
STALENESS = ("gap", "lookahead")  # dgl_oac.baselines.staleness
MIRRORS = ("step", "rows")  # dgl_oac.distributed.committer.MIRROR
DeviceLike = Union[None, str, torch.device]


def normalize_device(device: torch.device, current_cuda: Callable[[], int] = torch.cuda.current_device
                     ) -> torch.device:
    """The one name of ``device``: ``cuda`` -> ``cuda:<current index>`` (``current_cuda()``), ``cpu:N`` -> ``cpu``.

    torch compares devices by name (``torch.device("cuda") != torch.device("cuda:0")``), so a table used by a
    training loader on ``"cuda"`` and an evaluation loader on ``"cuda:0"`` would look like two devices. Every
    device the loader and the tables compare goes through here first.
    """
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", current_cuda())
    if device.type == "cpu":
        return torch.device("cpu")
    return device


def resolve_check_finite(check_finite: Optional[bool], device: torch.device) -> bool:
    """A loader's ``check_finite``: ``None`` (the default) is on for the CPU and off on a CUDA device.

    The check must finish before ``step()`` writes anything (a rejected batch leaves every table as it was), so
    on a device it is a host sync in every step: the CPU could no longer queue work ahead of the GPU. On the CPU
    it costs one pass over the new rows. Pass ``True`` to pay that sync on a device."""
    return device.type == "cpu" if check_finite is None else bool(check_finite)


def resolve_device(device: DeviceLike) -> torch.device:
    """``None``/``"auto"`` -> CUDA when available, else CPU; otherwise the named device, which must exist.
    Normalised (:func:`normalize_device`): ``"cuda"`` resolves to ``cuda:<current index>``."""
    if device is None or (isinstance(device, str) and device == "auto"):
        return normalize_device(torch.device("cuda" if torch.cuda.is_available() else "cpu"))
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(f"unknown device {device!r}: expected 'auto', 'cpu', 'cuda' or 'cuda:N'") from exc
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"unsupported device {device!r}: dgl-oac runs on 'cpu' or 'cuda'")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device {device!r} was requested but CUDA is not available on this machine")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ValueError(f"device {device!r} does not exist: {torch.cuda.device_count()} CUDA device(s)")
    return normalize_device(dev)


def resolve_pin(pin: Union[bool, str, None], device: torch.device) -> bool:
    """Pin host buffers only when they feed a CUDA device (pinning costs time and locked memory)."""
    if pin is None or pin == "auto":
        return device.type == "cuda" and torch.cuda.is_available()
    if not isinstance(pin, bool):
        raise ValueError(f"pin must be True, False or 'auto', got {pin!r}")
    if pin and not torch.cuda.is_available():
        raise ValueError("pin=True needs CUDA (pinned host memory is a CUDA feature)")
    return pin


def check_mode(mode: str) -> str:
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}: expected one of {', '.join(MODES)}")
    return mode


def check_staleness(staleness: Optional[str], mode: str) -> Optional[str]:
    """``None`` (naive async), ``"gap"`` or ``"lookahead"``; a rule for stale rows, so async mode only."""
    if staleness is None:
        return None
    if staleness not in STALENESS:
        raise ValueError(f"unknown staleness {staleness!r}: expected None or one of {', '.join(STALENESS)}")
    if mode != "async":
        raise ValueError(f"staleness={staleness!r} needs mode='async' (mode={mode!r} reads no stale rows)")
    return staleness


def table_mode(mode: str, staleness: Optional[str]) -> str:
    """How a loader uses its tables (``"sync"``, ``"oac"``, ``"async"`` or ``"async-<staleness>"``)."""
    return mode if staleness is None else f"{mode}-{staleness}"


def logs_writes(table_mode: str) -> bool:
    """Whether batches of a :func:`table_mode` commit by overwriting with a write log (oac, async with a
    staleness rule), not by adding deltas (naive async)."""
    return table_mode == "oac" or table_mode.startswith("async-")


def check_priority(priority: str) -> str:
    if priority not in PRIORITIES:
        raise ValueError(f"unknown background priority {priority!r}: expected one of {', '.join(PRIORITIES)}")
    return priority


def check_positive_int(name: str, value: int, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return value


def check_lr(lr: float, name: str = "lr") -> float:
    if not isinstance(lr, (int, float)) or not (lr > 0) or lr != lr or lr == float("inf"):
        raise ValueError(f"{name} must be a positive finite number, got {lr!r}")
    return float(lr)


def optional_seed(seed: Optional[int]) -> int:
    """A loader without a seed still gets a reproducible one once the user calls ``torch.manual_seed``."""
    if seed is None:
        return int(torch.randint(0, 2**31 - 1, (1,)).item())
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"seed must be an int or None, got {seed!r}")
    return seed


def mirror_from_env(env: Mapping[str, str]) -> str:
    """``$DGL_OAC_MIRROR`` in ``env``: what a replicated table's other machines get of a step, one of
    :data:`MIRRORS` (default ``"step"``; :data:`dgl_oac.distributed.committer.MIRROR`)."""
    value = env.get("DGL_OAC_MIRROR", "step")
    if value not in MIRRORS:
        raise ValueError(f"DGL_OAC_MIRROR={value!r}: expected one of {', '.join(MIRRORS)}")
    return value


def row_timeout_from_env(env: Mapping[str, str]) -> float:
    """``$DGL_OAC_ROW_TIMEOUT`` in ``env``: seconds > 0 a row-service client waits for an owner's reply before it
    names the owner as failed (default 300)."""
    raw = env.get("DGL_OAC_ROW_TIMEOUT", "300")
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(f"DGL_OAC_ROW_TIMEOUT={raw!r}: expected seconds > 0 (how long a client waits for an "
                         f"owner's reply before it names the owner as failed)")
    return value


def background_threads_from_env(env: Mapping[str, str]) -> Optional[int]:
    """``$DGL_OAC_BACKGROUND_THREADS`` in ``env``: the OpenMP team of each gather and write-back thread, a whole
    number >= 1; None (unset or empty): the cores the caller's team leaves
    (:func:`dgl_oac.engine.runtime.background_team`)."""
    raw = env.get("DGL_OAC_BACKGROUND_THREADS", "")
    if not raw:
        return None
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(f"DGL_OAC_BACKGROUND_THREADS={raw!r}: expected a whole number of threads >= 1 (each "
                         f"gather and write-back thread's OpenMP team)")
    return value
