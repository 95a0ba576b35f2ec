"""Build and load ``rowops.c`` once per process (and per machine, through a cache of built libraries).

The library is built with the system C compiler (``$CC``, else ``cc``) into a cache directory
(``$DGL_OAC_CACHE``, else ``~/.cache/dgl_oac``), keyed by the source, the compiler, the flags and this CPU
(``-march=native``); a build goes to a temporary name and is renamed into place, so concurrent processes
(torchrun) never load half a file. Without a compiler, or with ``DGL_OAC_NATIVE=0``, nothing is built and every
caller runs its torch op: :func:`status` says which and why.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import Optional

import torch  # noqa: F401 - loaded first: its libgomp is the one the library's OpenMP binds to

SOURCE = Path(__file__).with_name("rowops.c")
#: -ffp-contract=off: no multiply-add is fused behind the source's back (each op rounds as torch's does)
FLAGS = ("-O3", "-march=native", "-ffp-contract=off", "-fopenmp", "-fPIC", "-shared")
_I64, _I32, _PTR = ctypes.c_int64, ctypes.c_int32, ctypes.c_void_p
#: the exported functions' signatures (all return int64)
SIGNATURES = {
    "dgloac_gather": [_I64, _I64, _PTR, _I64, _I64, _PTR, _PTR, _I64],
    "dgloac_scatter": [_I64, _I64, _PTR, _I64, _I64, _PTR, _PTR, _I64],
    "dgloac_pass": [_I32, _I32, _I64, _I64, _PTR, _I64, _PTR, _I64, _PTR, _I64, _PTR, _PTR, _PTR],
}

_lock = threading.Lock()
_lib: Optional[ctypes.CDLL] = None
_status: Optional[str] = None  # None: not tried yet; "native": loaded; else why the torch ops run


def _cpu() -> str:
    """This CPU's model and feature flags (Linux), else the platform's name for it."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        return " ".join(sorted({ln for ln in lines if ln.startswith(("model name", "flags"))}))
    except OSError:
        return platform.machine() + platform.processor()


def _build() -> ctypes.CDLL:
    cc = os.environ.get("CC") or "cc"
    if shutil.which(cc) is None:
        raise RuntimeError(f"no C compiler {cc!r} on PATH")
    key = hashlib.sha256(SOURCE.read_bytes() + " ".join((cc,) + FLAGS + (_cpu(),)).encode()).hexdigest()[:16]
    cache = Path(os.environ.get("DGL_OAC_CACHE") or Path.home() / ".cache" / "dgl_oac")
    lib = cache / f"rowops-{key}.so"
    if not lib.exists():
        cache.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=cache)
        os.close(fd)
        try:
            done = subprocess.run([cc, *FLAGS, "-o", tmp, str(SOURCE)], capture_output=True, text=True,
                                  timeout=120)
            if done.returncode != 0:
                raise RuntimeError(f"{cc} failed: {done.stderr.strip()[-500:]}")
            os.replace(tmp, lib)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    # torch has loaded its libgomp: the library's libgomp.so.1 resolves to it, so both share one OpenMP pool
    # and torch.set_num_threads applies to these loops too
    handle = ctypes.CDLL(str(lib))
    for name, argtypes in SIGNATURES.items():
        fn = getattr(handle, name)
        fn.restype, fn.argtypes = _I64, argtypes
    return handle


def load() -> Optional[ctypes.CDLL]:
    """The library, built on the first call; None where it cannot be (see :func:`status`)."""
    global _lib, _status
    if _status is None:
        with _lock:
            if _status is None:
                if os.environ.get("DGL_OAC_NATIVE", "1") == "0":
                    _status = "torch ops: DGL_OAC_NATIVE=0"
                else:
                    try:
                        _lib = _build()
                        _status = "native"
                    except Exception as exc:  # noqa: BLE001 - any build failure falls back to torch's ops
                        _status = f"torch ops: the native library did not build ({type(exc).__name__}: {exc})"
    return _lib


def status() -> str:
    """``"native"`` when the native row operations run, else why torch's ops run instead (builds on first
    call)."""
    load()
    return str(_status)
