"""How ``dgl-oac train`` shares the CPU with other processes: OpenMP's wait policy, chosen before torch loads.

libgomp (torch's OpenMP on Linux) reads ``OMP_WAIT_POLICY`` once, when torch is imported. Its default spins at
every barrier before sleeping; when another process holds a core, each parallel op of a 2-thread team waits for
a descheduled thread while its partner burns its time slice (measured: held-out UMLS in oac 438 s beside one
busy process vs 10 s quiet; 1.47 batches/s with the default vs 92.45 with ``PASSIVE``; a plain-torch loop of the
same shape 2.2 vs 33.5). ``PASSIVE`` sleeps at once; on a quiet machine it measured the same
(``benchmarks/bench_load.py``). The CLI sets it unless the user did; a program on the Python API sets it itself,
before its first ``import torch`` (docs/concepts/threads.md).
"""
from __future__ import annotations

import os
import sys
from typing import MutableMapping

WAIT_POLICY = "PASSIVE"


def choose_wait_policy(env: MutableMapping[str, str] = os.environ) -> str:
    """Set ``OMP_WAIT_POLICY`` to :data:`WAIT_POLICY` in ``env`` unless it is set (the user's choice stands) or
    torch is already loaded (too late for this process: nothing is changed). Returns the policy in force
    ("" for libgomp's default)."""
    if "OMP_WAIT_POLICY" not in env and "torch" not in sys.modules:
        env["OMP_WAIT_POLICY"] = WAIT_POLICY
    return env.get("OMP_WAIT_POLICY", "")
