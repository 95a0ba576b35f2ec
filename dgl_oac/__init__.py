"""dgl-oac: learnable node embeddings in CPU memory, trained through an async pipeline that Optimistic
Asynchrony Control keeps exactly equal to synchronous training.

    emb = dgl_oac.NodeEmbedding(g.num_nodes(), 128, "emb")
    opt = dgl_oac.SparseAdam([emb], lr=0.01)
    loader = dgl_oac.DataLoader(g, train_ids, sampler, embeddings=[emb], mode="oac", batch_size=1024)
"""
import importlib
import importlib.util
from typing import TYPE_CHECKING

from .needs_dgl import require_dgl

if TYPE_CHECKING:  # what type checkers and the API reference read; at run time each loads on first use
    from .config import MODES
    from .embedding import NodeEmbedding
    from .dgl_frontend.loader import DataLoader
    from .optim import SparseAdagrad, SparseAdam, SparseOptimizer, SparseRowWiseAdagrad, SparseSGD
    from .loading.batch_loader import BatchLoader

__version__ = "0.1.0"

# Every name and subpackage is imported on first use (PEP 562): `dgl-oac --help` (dgl_oac.app.cli) parses
# without importing torch or DGL, and code that only trains embeddings loads neither the application nor DGL
# (only the names of dgl_frontend need it: without DGL they raise dgl_oac.needs_dgl's ImportError).
_EXPORTS = {"MODES": "config", "NodeEmbedding": "embedding", "DataLoader": "dgl_frontend.loader",
            "BatchLoader": "loading.batch_loader",
            "SparseSGD": "optim", "SparseAdagrad": "optim", "SparseAdam": "optim", "SparseOptimizer": "optim",
            "SparseRowWiseAdagrad": "optim"}
_MOVED = {"data": "dgl_oac.app.data", "models": "dgl_oac.app.models", "loader": "dgl_oac.dgl_frontend.loader",
          "blocks": "dgl_oac.dgl_frontend.blocks", "hetero": "dgl_oac.dgl_frontend.hetero"}  # names a user may try


def __getattr__(name: str):  # noqa: ANN202 - module attribute hook
    if name in _EXPORTS:
        if _EXPORTS[name].startswith("dgl_frontend."):
            require_dgl(f"dgl_oac.{name}")
        value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
        globals()[name] = value  # once
        return value
    if not name.startswith("_") and importlib.util.find_spec(f"{__name__}.{name}") is not None:
        return importlib.import_module(f".{name}", __name__)  # a subpackage or module: dgl_oac.app, ...
    hint = f" (did you mean {_MOVED[name]}?)" if name in _MOVED else ""
    raise AttributeError(f"module 'dgl_oac' has no attribute {name!r}{hint}")


def __dir__():  # noqa: ANN202
    return sorted(list(globals()) + list(_EXPORTS))


__all__ = list(_EXPORTS)
