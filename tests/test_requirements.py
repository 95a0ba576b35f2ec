"""Hole 6 of issue 22: ``pyproject.toml``'s lower bound on torch covers every torch API the package calls."""
import contextlib
import re
from pathlib import Path

import torch
from packaging.requirements import Requirement
from packaging.version import Version

import dgl_oac
from dgl_oac.app.data import ogb_data

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = Path(dgl_oac.__file__).resolve().parent

#: The torch release that introduced each version-gated API, as a pattern of its call in the package's source.
#: An API used only behind a feature check (``getattr``, a version test) is not a requirement: leave it out.
INTRODUCED = {
    r"\.register_post_accumulate_grad_hook\(": "2.1",  # the commit hook (dgl_oac.engine.pipeline)
    r"torch\.serialization\.safe_globals\(": "2.5",
    r"torch\.serialization\.add_safe_globals\(": "2.4",
    r"torch\.accelerator\.": "2.6",
    r"init_device_mesh\(|torch\.distributed\.device_mesh": "2.2",
    r"torch\.frombuffer\(": "1.10",
    r"\bweights_only=": "1.13",
    r"\bno_dist=": "2.7",  # torch.distributed.checkpoint.save/load without a process group (dgl_oac.checkpoint)
}


def torch_bound() -> Version:
    """The ``torch>=X`` of ``[project] dependencies`` in pyproject.toml."""
    text = (ROOT / "pyproject.toml").read_text()
    deps = re.search(r"^dependencies = \[(.*?)^\]", text, re.S | re.M).group(1)
    for quoted in re.findall(r'"([^"]+)"', deps):
        req = Requirement(quoted)
        if req.name == "torch":
            lows = [Version(s.version) for s in req.specifier if s.operator in (">=", "~=", "==")]
            assert lows, f"torch has no lower bound in pyproject.toml: {quoted!r}"
            return max(lows)
    raise AssertionError("torch is not among pyproject.toml's dependencies")


def test_torch_bound_covers_every_api_the_package_calls():
    source = "\n".join(p.read_text() for p in sorted(PACKAGE.rglob("*.py")))
    used = {pat: Version(v) for pat, v in INTRODUCED.items() if re.search(pat, source)}
    assert r"\.register_post_accumulate_grad_hook\(" in used, "the table no longer matches the code"
    need = max(used.values())
    bound = torch_bound()
    assert bound >= need, (f"pyproject.toml allows torch>={bound}, but the package calls "
                           f"{[p for p, v in used.items() if v > bound]} (torch >= {need})")


def test_installed_torch_meets_the_bound():
    assert Version(torch.__version__.split("+")[0]) >= torch_bound()
    assert hasattr(torch.Tensor, "register_post_accumulate_grad_hook")


def test_ogb_reads_ask_for_safe_globals_only_on_a_torch_that_needs_them(monkeypatch):
    """Before torch 2.6, ``torch.load`` is not weights-only by default (and 2.4 has no ``safe_globals``): the
    OGB loader must not call it there."""
    monkeypatch.setattr(torch, "__version__", "2.4.1")
    monkeypatch.delattr(torch.serialization, "safe_globals", raising=False)
    assert isinstance(ogb_data._numpy_allowed(), contextlib.nullcontext)
