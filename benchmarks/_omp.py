"""Choose OpenMP's wait policy BEFORE torch is imported (libgomp reads ``OMP_WAIT_POLICY`` once, at load).

Why it matters here (measured, see RESULTS.md): libgomp's default policy busy-waits at every barrier before
sleeping. On this 2-core machine shared with other jobs (load 5-8) that was ruinous for the serial modes: each
2-thread parallel region waited for a core another process held (sync, 2 torch threads, small graph: 6.8
batches/s with the default vs 34.6 with ``passive``), while the pipelined modes, whose extra threads make
libgomp throttle its spinning, suffered far less; ratios measured that way say more about the neighbours than
about the modes. On the quiet machine the two policies measured the same within run-to-run noise. The scripts
leave libgomp's default (``unset``) unless told otherwise and record the policy; on a shared machine pass
``--omp-wait-policy passive``.

Import this module first in a script (it must not import torch).
"""
from __future__ import annotations

import argparse
import os

CHOICES = ("passive", "active", "unset")
HELP = ("OpenMP wait policy for this process (set before torch loads): unset (default, unless OMP_WAIT_POLICY is "
        "already set: libgomp's default, spin then sleep), passive (use on a machine shared with other jobs), active")


def apply_from_argv() -> str:
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--omp-wait-policy", choices=CHOICES, default=None)
    args, _ = p.parse_known_args()
    policy = args.omp_wait_policy or os.environ.get("OMP_WAIT_POLICY", "unset").lower()
    if policy == "unset":
        os.environ.pop("OMP_WAIT_POLICY", None)
    else:
        os.environ["OMP_WAIT_POLICY"] = policy.upper()
    return policy


def add_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--omp-wait-policy", choices=CHOICES, default=None, help=HELP)


POLICY = apply_from_argv()
