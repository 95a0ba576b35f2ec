"""The package layout: the module import graph has no cycle (TYPE_CHECKING and function-level imports included),
the engine depends on no layer above it, the optimizers do not orchestrate, only the DGL frontend (and the
application) import DGL. No line budget: a module is split by concept, never to fit a line count (STYLE).

Every module of ``dgl_oac`` is parsed with :mod:`ast` (not imported), so an import anywhere in a file counts.
"""
from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, List, Optional, Set

import dgl_oac

ROOT = Path(dgl_oac.__file__).parent
#: what the engine (the per-batch stages, the table's in-flight state) must not depend on: the layers above it
ENGINE_MUST_NOT_IMPORT = ("dgl_oac.baselines", "dgl_oac.app", "dgl_oac.optim", "dgl_oac.dgl_frontend",
                          "dgl_oac.embedding", "dgl_oac.loading")
#: the only packages that may import DGL (any import statement, anywhere in the file): everything else runs without
DGL_IMPORTERS = ("dgl_oac.dgl_frontend", "dgl_oac.app")
#: the loading layer (the epoch, the BatchSource interface, BatchLoader) knows no graph library and no application
LOADING_MUST_NOT_IMPORT = ("dgl_oac.dgl_frontend", "dgl_oac.app")
#: the optimizers are row kernels: committing a step is the engine's and the distributed committer's business
OPTIM_MUST_NOT_IMPORT = ("dgl_oac.distributed",)
#: all the optimizers may take from the step's module: its interfaces, not a committer
OPTIM_STEP_NAMES = {"RowKernel", "check_reduction", "duplicate_reduction"}
#: the only modules directly under dgl_oac/, each with why it is not in a subpackage (the rest of the package is
#: folders by concept: engine/, checkpoint/, optim/, nn/, sampling/, distributed/, ...)
TOP_LEVEL: Dict[str, str] = {
    "__main__": "python -m dgl_oac",
    "config": "the settings every layer resolves and checks, engine included",
    "embedding": "NodeEmbedding, the table every part of the package holds",
    "tables": "which tables a loader feeds: BatchLoader's, the DGL frontend's and the optimizers' one check",
    "needs_dgl": "the one ImportError without DGL, raised before anything imports dgl",
    "unpipelined": "warnings for reads that bypass the pipeline",
}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> Dict[str, Path]:
    return {_module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def _imports_dgl(path: Path) -> List[str]:
    """The lines of ``path`` with an import statement of ``dgl`` or ``dgl.*`` (anywhere: function level too)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names = [node.module or ""]
        else:
            continue
        if any(n == "dgl" or n.startswith("dgl.") for n in names):
            out.append(f"{path.name}:{node.lineno}")
    return out


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _target(name: str, modules: Dict[str, Path]) -> Optional[str]:
    """The dgl_oac module ``name`` refers to (a symbol's module when ``name`` is ``module.symbol``)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def import_graph() -> Dict[str, Set[str]]:
    """``{module: modules of dgl_oac it imports}``, from every import statement anywhere in each file."""
    modules = _modules()
    graph: Dict[str, Set[str]] = {}
    for name, path in modules.items():
        deps: Set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(name, path.name == "__init__.py", node)
                targets = [f"{base}.{a.name}" for a in node.names]  # `from pkg import module` imports the module
            else:
                continue
            for t in targets:
                if t.startswith("dgl_oac"):
                    dep = _target(t, modules)
                    if dep is not None and dep != name:
                        deps.add(dep)
        graph[name] = deps
    return graph


def _without_parent_packages(graph: Dict[str, Set[str]]) -> Dict[str, Set[str]]:
    """Importing ``a.b`` runs ``a/__init__``: an edge to a package's ``__init__`` from a module inside it is the
    package re-exporting its own parts, not a dependency of the part on its package (dropped)."""
    return {m: {d for d in deps if not m.startswith(d + ".")} for m, deps in graph.items()}


def find_cycle(graph: Dict[str, Set[str]]) -> Optional[List[str]]:
    """One cycle of ``graph`` as its modules in import order (first == last), or None."""
    state: Dict[str, int] = {}
    stack: List[str] = []

    def visit(m: str) -> Optional[List[str]]:
        state[m] = 1
        stack.append(m)
        for d in sorted(graph.get(m, ())):
            if state.get(d) == 1:
                return stack[stack.index(d):] + [d]
            if d not in state:
                found = visit(d)
                if found:
                    return found
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state:
            found = visit(m)
            if found:
                return found
    return None


def test_no_import_cycle():
    cycle = find_cycle(_without_parent_packages(import_graph()))
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_find_cycle_reports_the_modules():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def _violations(prefix: str, forbidden: tuple) -> List[str]:
    graph = import_graph()
    return [f"{m} imports {d}" for m in sorted(graph) if m == prefix or m.startswith(prefix + ".")
            for d in sorted(graph[m]) if any(d == f or d.startswith(f + ".") for f in forbidden)]


def test_engine_imports_no_layer_above_it():
    assert _violations("dgl_oac.engine", ENGINE_MUST_NOT_IMPORT) == []


def test_the_loading_layer_imports_no_frontend():
    assert _violations("dgl_oac.loading", LOADING_MUST_NOT_IMPORT) == []


def test_only_the_dgl_frontend_imports_dgl():
    """Everything outside dgl_oac.dgl_frontend and dgl_oac.app runs without DGL installed (tests/test_no_dgl.py
    runs it so): not one of its modules has an import statement of dgl."""
    found = {m: lines for m, path in _modules().items()
             if not any(m == p or m.startswith(p + ".") for p in DGL_IMPORTERS) and (lines := _imports_dgl(path))}
    assert found == {}
    assert _imports_dgl(ROOT / "dgl_frontend" / "loader.py")  # the check sees an import where there is one


def test_optimizers_import_no_committer():
    assert _violations("dgl_oac.optim", OPTIM_MUST_NOT_IMPORT) == []
    taken = {a.name for path in (ROOT / "optim").glob("*.py") for node in ast.walk(ast.parse(path.read_text()))
             if isinstance(node, ast.ImportFrom) and (node.module or "").endswith("engine.step") for a in node.names}
    assert taken and taken <= OPTIM_STEP_NAMES, taken - OPTIM_STEP_NAMES


def test_native_ops_are_a_leaf():
    """``dgl_oac.native`` (compiled row ops with torch fallbacks) sits below the engine: it imports no other part
    of dgl_oac, so the engine and the optimizers can both use it."""
    graph = import_graph()
    assert [f"{m} imports {d}" for m in sorted(graph) if m.startswith("dgl_oac.native") for d in sorted(graph[m])
            if d.startswith("dgl_oac") and not d.startswith("dgl_oac.native")] == []
    assert any(m.startswith("dgl_oac.native") for m in graph)  # the package is in the graph at all


def test_the_top_level_holds_only_the_listed_modules():
    """A new module goes into the subpackage of its concept, or into TOP_LEVEL with why it cannot."""
    flat = sorted(p.stem for p in ROOT.glob("*.py") if p.stem != "__init__")
    assert flat == sorted(TOP_LEVEL)


def test_engine_does_not_know_the_baselines_by_name():
    """The baselines plug in through engine/pipeline.py: no engine module names them or their package, not even in a
    docstring."""
    names = ("dgl_oac.baselines", "staleness", "GapAware", "LookAhead", "ShadowSync")
    found = [f"{m}: {n}" for m, path in _modules().items() if m.startswith("dgl_oac.engine")
             for n in names if n.lower() in path.read_text().lower()]
    assert found == []


def test_device_ops_are_a_leaf():
    """``dgl_oac.device`` (the device paths of row ops, with their CPU torch ops) sits below the engine beside
    ``dgl_oac.native``: it imports no other part of dgl_oac."""
    graph = import_graph()
    assert [f"{m} imports {d}" for m in sorted(graph) if m.startswith("dgl_oac.device") for d in sorted(graph[m])
            if d.startswith("dgl_oac") and not d.startswith("dgl_oac.device")] == []
    assert any(m.startswith("dgl_oac.device") for m in graph)
