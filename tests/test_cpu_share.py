"""``dgl-oac train`` sets OpenMP's passive wait policy before torch loads, unless the user chose one
(:mod:`dgl_oac.app.cpu_share`): a spinning 2-thread team collapses beside one busy process (issue 39)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from dgl_oac.app.cpu_share import WAIT_POLICY, choose_wait_policy

ROOT = Path(__file__).resolve().parents[1]
# the CLI up to the point where it would import torch: training replaced by a report of what it would see
PROBE = """
import os, sys, types
fake = types.ModuleType("dgl_oac.app.cli_train")
def train(opts):
    print(os.environ.get("OMP_WAIT_POLICY", ""), "torch" in sys.modules)
    raise SystemExit(0)
fake.train = train
sys.modules["dgl_oac.app.cli_train"] = fake
from dgl_oac.app.cli import main
main(["train"])
"""


@pytest.mark.parametrize("user, expected", [(None, WAIT_POLICY), ("active", "active"), ("passive", "passive")])
def test_the_cli_sets_passive_before_torch_unless_the_user_chose(user, expected):
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    if user is not None:
        env["OMP_WAIT_POLICY"] = user
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [expected, "False"]  # in force, and torch not loaded yet


def test_too_late_once_torch_is_loaded():
    import torch  # noqa: F401 - this process: libgomp has read its environment already

    env: dict = {}
    assert choose_wait_policy(env) == "" and env == {}  # nothing pretends to change what is in force
    assert choose_wait_policy({"OMP_WAIT_POLICY": "active"}) == "active"
