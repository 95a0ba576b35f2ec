"""Choose OpenMP's wait policy BEFORE torch is imported (libgomp reads ``OMP_WAIT_POLICY`` once, at load).

Why it matters here (measured, see RESULTS.md): on a 2-core machine that other processes also use, libgomp's
default policy (busy-wait ~300k spins at every barrier before sleeping) makes each 2-thread parallel region wait
for a core another process holds; the serial modes (sync, plain DGL), which run one long chain of small
parallel ops on one thread, slowed down ~10x with 2 torch threads while the pipelined modes (whose extra
threads make libgomp throttle its spinning) slowed down far less. Ratios measured that way say more about the
neighbours than about the modes. ``passive`` (threads sleep at once) removes the effect; the scripts default to
it and record the policy; pass ``--omp-wait-policy unset`` to measure libgomp's default.

Import this module first in a script (it must not import torch).
"""
from __future__ import annotations

import argparse
import os

CHOICES = ("passive", "active", "unset")
HELP = ("OpenMP wait policy for this process (set before torch loads): passive (default unless OMP_WAIT_POLICY is "
        "already set), active, or unset (libgomp's default: spin, then sleep)")


def apply_from_argv() -> str:
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--omp-wait-policy", choices=CHOICES, default=None)
    args, _ = p.parse_known_args()
    policy = args.omp_wait_policy or os.environ.get("OMP_WAIT_POLICY", "passive").lower()
    if policy == "unset":
        os.environ.pop("OMP_WAIT_POLICY", None)
    else:
        os.environ["OMP_WAIT_POLICY"] = policy.upper()
    return policy


def add_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--omp-wait-policy", choices=CHOICES, default=None, help=HELP)


POLICY = apply_from_argv()
