"""The suite's view of the machine: ``gpu/envprobe.py``'s JSON line (the LAST line of its stdout: DGL's
first-import notice and anything else printed before it cannot break the read), plus what the suite sees from
outside (load, cores, ``nvidia-smi``, a digest of the sources, the commit where ``.git`` came along)."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional

REPO = Path(__file__).resolve().parents[2]
PROBE = [sys.executable, str(Path(__file__).with_name("envprobe.py"))]
SOURCES = ("dgl_oac", "benchmarks", "scripts", "tests")


def last_json(stdout: str) -> Dict[str, Any]:
    """The JSON object on the last non-empty line of ``stdout``; ``ValueError`` naming what was there if none."""
    lines = [ln for ln in stdout.splitlines() if ln.strip()]
    if not lines:
        raise ValueError("the probe printed nothing")
    try:
        obj = json.loads(lines[-1])
    except json.JSONDecodeError as exc:
        raise ValueError(f"the probe's last line is not JSON ({exc}): {lines[-1][:300]!r}") from None
    if not isinstance(obj, dict):
        raise ValueError(f"the probe's last line is not a JSON object: {lines[-1][:300]!r}")
    return obj


def probe(env: Dict[str, str], device: str, argv: Optional[List[str]] = None, timeout: float = 180.0
          ) -> Dict[str, Any]:
    """Run the probe (``argv``, default ``gpu/envprobe.py``) with ``env``; its facts, with ``chatter`` (the lines
    before the JSON) when there were any, or ``probe_error`` when it failed."""
    try:
        r = subprocess.run([*(argv or PROBE), "--device", device], cwd=REPO, env=env, capture_output=True,
                           text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"probe_error": f"the probe ran past {timeout:.0f} s"}
    try:
        info = last_json(r.stdout)
    except ValueError as exc:
        return {"probe_error": str(exc), "rc": r.returncode, "stdout_tail": r.stdout[-2000:],
                "stderr_tail": r.stderr[-2000:]}
    chatter = [ln for ln in r.stdout.splitlines() if ln.strip()][:-1]
    if chatter:
        info["chatter"] = "\n".join(chatter)[-2000:]
    return info


def nvidia_smi() -> Optional[str]:
    q = "name,driver_version,memory.total,pcie.link.gen.current,pcie.link.width.current,clocks.max.sm"
    try:
        r = subprocess.run(["nvidia-smi", f"--query-gpu={q}", "--format=csv"], capture_output=True, text=True,
                           timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return r.stdout.strip() or None


def source_digest() -> str:
    """sha256 over the sources' paths and bytes (``.py``, ``.c``): matches a run to a commit where ``.git`` did
    not travel with the working tree."""
    h = hashlib.sha256()
    for top in SOURCES:
        for path in sorted((REPO / top).rglob("*")):
            if path.suffix in (".py", ".c") and "__pycache__" not in path.parts:
                h.update(str(path.relative_to(REPO)).encode() + b"\0" + path.read_bytes())
    return h.hexdigest()


def machine() -> Dict[str, Any]:
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True,
                                timeout=30).stdout.strip() or None
    except (OSError, subprocess.TimeoutExpired):
        commit = None
    return {"commit": commit, "source_digest": source_digest(), "loadavg": os.getloadavg(), "cpus": os.cpu_count(),
            "nvidia_smi": nvidia_smi()}
