"""Set-up from a folder of wheels, with no network, and the environment every step runs in.

A DGL wheel whose tag does not match this interpreter (1.1.3's stop at Python 3.11) is unzipped into the site
folder and imported with ``DGL_FFI=ctypes``: its Cython module is built for 3.11, its C library ``libdgl.so`` is
not tied to a Python version. Every other wheel goes in with ``pip install --no-index --no-deps --target``, or,
where that fails (no pip on the machine), a pure-Python one is unzipped.
"""
from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any, Dict, List

REPO = Path(__file__).resolve().parents[2]


def step_env(site: Path) -> Dict[str, str]:
    """The steps' environment: the site folder, the repository and ``scripts/`` (for ``-p gpu.pytest_stream``)
    first on ``PYTHONPATH``; DGL's backend named (its first import on a fresh ``HOME`` otherwise prints a notice
    to stdout); unbuffered output, so each step's log streams."""
    env = dict(os.environ)
    paths = [str(site), str(REPO), str(REPO / "scripts"), env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    env["DGLBACKEND"] = "pytorch"
    env["PYTHONUNBUFFERED"] = "1"
    return env


def set_up(wheels: Path, site: Path, env: Dict[str, str]) -> Dict[str, Any]:
    """Install ``wheels`` into ``site`` (module docstring), skipping those already there (their ``.dist-info``: a
    rerun on a warm machine); sets ``env["DGL_FFI"]`` where needed; returns what was done, one entry a wheel."""
    if not wheels.is_dir():
        raise FileNotFoundError(f"--wheels {wheels}: no such folder (make it as docs/guides/gpu.md says)")
    found = sorted(wheels.glob("*.whl"))
    if not found:
        raise FileNotFoundError(f"--wheels {wheels}: no .whl files in it (make it as docs/guides/gpu.md says)")
    site.mkdir(parents=True, exist_ok=True)
    tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    done: Dict[str, Any] = {"site": str(site), "wheels": []}
    by_pip: List[Path] = []
    for whl in found:
        dist, version = whl.name.split("-")[:2]
        unzip = dist == "dgl" and f"-{tag}-" not in whl.name
        if unzip:
            env["DGL_FFI"] = "ctypes"  # the Cython FFI is built for another Python
        if (site / f"{dist}-{version}.dist-info").is_dir():
            done["wheels"].append({"wheel": whl.name, "how": "already in the site folder"})
        elif unzip:
            with zipfile.ZipFile(whl) as z:
                z.extractall(site)
            done["wheels"].append({"wheel": whl.name, "how": "unzipped, DGL_FFI=ctypes"})
        else:
            by_pip.append(whl)
    if by_pip:  # one pip for all: its start-up is seconds
        r = subprocess.run([sys.executable, "-m", "pip", "install", "--no-index", "--no-deps", "--target",
                            str(site), *map(str, by_pip)], capture_output=True, text=True, timeout=300)
        for whl in by_pip:
            rec: Dict[str, Any] = {"wheel": whl.name, "how": "pip --no-index --target", "rc": r.returncode}
            if r.returncode != 0 and whl.name.endswith("-none-any.whl"):
                with zipfile.ZipFile(whl) as z:  # a pure-Python wheel is laid out ready to import
                    z.extractall(site)
                rec.update(how="unzipped: pip failed", err=r.stderr[-2000:])
            elif r.returncode != 0:
                rec["err"] = r.stderr[-2000:]
            done["wheels"].append(rec)
    return done
