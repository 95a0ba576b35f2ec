"""The training application behind ``dgl-oac train``: tasks, CLI, datasets, models, metrics and plots."""
_LAZY = ("cli", "data", "metrics", "models", "plot", "tasks")


def __getattr__(name: str):  # noqa: ANN202 - PEP 562: ``dgl_oac.app.data`` after ``import dgl_oac``
    if name in _LAZY:
        import importlib
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'dgl_oac.app' has no attribute {name!r}")
