"""mkdocs hook: fail the build when a public name has no reference entry or no docstring.

The public names are the ``__all__`` of the modules below (or the listed names where a module has none), and
the public methods and properties of each class among them. A
name is covered when some page has a mkdocstrings directive for it (``::: module.name``) or for its module
(``::: module``, which renders every public member). Covered or not, each must have a docstring.
"""
from __future__ import annotations

import importlib
import inspect
import re
from pathlib import Path
from typing import Union

from mkdocs.exceptions import PluginError

PUBLIC = {
    "dgl_oac": None,  # None: the module's __all__
    "dgl_oac.optim": None,
    "dgl_oac.nn": None,
    "dgl_oac.dgl_frontend.blocks": None,
    "dgl_oac.checkpoint": ["save_checkpoint", "load_checkpoint", "Checkpointer", "CheckpointReader",
                           "CheckpointError"],
    "dgl_oac.distributed": None,
    "dgl_oac.distributed.group": ["PeerFailure"],
    "dgl_oac.dgl_frontend.distgraph": ["DistEdgePredictionSampler", "connect", "launch_local"],
    "dgl_oac.app.data": None,
    "dgl_oac.app.models": None,
    "dgl_oac.dgl_frontend.sampling.edge": ["EdgeBatchSampler"],
    "dgl_oac.app.tasks": ["TrainConfig", "train"],
    "dgl_oac.app.cli": ["main", "build_parser"],
}
DIRECTIVE = re.compile(r"^::: ([\w.]+)\s*$", re.M)
# Constants and plain data: documented by the page text around them, no docstring of their own possible.
NO_DOCSTRING = (str, int, float, tuple, dict, frozenset, list, Path, type(Union[int, str]))


def _resolve(path: str) -> object:
    """The object a directive names (``a.b.C``): the longest importable module prefix, then attributes."""
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise PluginError(f"a directive names {path!r}, which does not import")


def problems(docs_dir: Path) -> list:
    directives = set()
    for md in docs_dir.rglob("*.md"):
        directives.update(DIRECTIVE.findall(md.read_text(encoding="utf-8")))
    documented = {id(_resolve(d)) for d in directives}  # a re-export counts: dgl_oac.SparseAdam is optim's
    out = []
    for mod_name, names in PUBLIC.items():
        module = importlib.import_module(mod_name)
        for name in names if names is not None else module.__all__:
            obj = getattr(module, name)
            full = f"{mod_name}.{name}"
            if id(obj) not in documented and mod_name not in directives:
                out.append(f"{full}: no reference entry (add '::: {full}' to a page under docs/api/)")
            if not isinstance(obj, NO_DOCSTRING) and not (inspect.getdoc(obj) or "").strip():
                out.append(f"{full}: no docstring")
            if inspect.isclass(obj):
                out += [f"{full}.{m}: no docstring" for m in _undocumented_members(obj)]
    return out


def _undocumented_members(cls: type) -> list:
    """Public methods and properties defined on ``cls`` whose docstring (inherited ones count) is empty."""
    out = []
    for name, member in vars(cls).items():
        if name.startswith("_") or not (callable(member) or isinstance(member, property)):
            continue
        if isinstance(member, type):  # a nested class: documented on its own
            continue
        if not (inspect.getdoc(getattr(cls, name)) or "").strip():
            out.append(name)
    return out


def on_post_build(config) -> None:
    found = problems(Path(config["docs_dir"]))
    if found:
        raise PluginError("public names without a reference entry or docstring:\n  " + "\n  ".join(found))
