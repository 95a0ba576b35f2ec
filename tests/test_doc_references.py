"""Every dotted ``dgl_oac.`` name in the package's docstrings and comments, in docs/, README.md, ARCHITECTURE.md
and the benchmark pages names something that exists (a module, or an attribute of one): a module that moves
takes its references with it. Names inside string literals (profiler labels such as ``"dgl_oac.copy"``) and
file paths are not references."""
from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Dict, List, Set

import pytest

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = re.compile(r"""(?<!["'/\w])dgl_oac(?:\.[A-Za-z_]\w*)+""")


def _files() -> List[Path]:
    return sorted([*(ROOT / "dgl_oac").rglob("*.py"), *(ROOT / "docs").rglob("*.md"), ROOT / "README.md",
                   ROOT / "ARCHITECTURE.md", *(ROOT / "benchmarks").glob("*.md")])


def resolves(ref: str) -> bool:
    """Whether ``ref`` is an importable module, or a chain of attributes of the longest one that is (the docs
    site's own resolver for ``:::`` directives, ``docs/_hooks/api_check.py``)."""
    sys.path.insert(0, str(ROOT / "docs" / "_hooks"))
    try:
        import api_check
    finally:
        sys.path.remove(str(ROOT / "docs" / "_hooks"))
    try:
        api_check._resolve(ref)
    except (AttributeError, api_check.PluginError):
        return False
    return True


def stale() -> Dict[str, Set[str]]:
    out: Dict[str, Set[str]] = {}
    for path in _files():
        for m in REFERENCE.finditer(path.read_text(encoding="utf-8")):
            ref = m.group(0)
            if ref.rsplit(".", 1)[-1] in ("py", "md", "c", "json"):  # a file name
                continue
            if not resolves(ref):
                out.setdefault(ref, set()).add(str(path.relative_to(ROOT)))
    return out


def test_every_dotted_reference_resolves():
    pytest.importorskip("dgl")  # the DGL frontend's modules import it
    assert stale() == {}


def test_the_check_finds_a_stale_reference():
    assert resolves("dgl_oac.engine.step.StepPlan.combine")
    assert not resolves("dgl_oac.sampling.sample_batch")  # moved to dgl_oac.dgl_frontend.sampling
    assert REFERENCE.findall('see dgl_oac.nn.Embedding, record_function("dgl_oac.copy")') == ["dgl_oac.nn.Embedding"]
