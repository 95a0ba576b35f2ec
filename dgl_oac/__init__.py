"""dgl-oac: learnable node embeddings in CPU memory, trained through an async pipeline that Optimistic
Asynchrony Control keeps exactly equal to synchronous training.

    emb = dgl_oac.NodeEmbedding(g.num_nodes(), 128, "emb")
    opt = dgl_oac.SparseAdam([emb], lr=0.01)
    loader = dgl_oac.DataLoader(g, train_ids, sampler, embeddings=[emb], mode="oac", batch_size=1024)
"""
from .config import MODES
from .embedding import NodeEmbedding
from .loader import DataLoader
from .sources import BatchLoader
from .optim import SparseAdagrad, SparseAdam, SparseOptimizer, SparseRowWiseAdagrad, SparseSGD

__version__ = "0.1.0"

# Subpackages a user reaches as attributes (``dgl_oac.app.data.load(...)`` after ``import dgl_oac``), imported on
# first use: the application's datasets and models are not loaded by code that only trains embeddings (PEP 562).
_LAZY = ("app", "sampling", "distributed", "checkpoint", "blocks", "nn")
_MOVED = {"data": "dgl_oac.app.data", "models": "dgl_oac.app.models"}  # names a user may try: where they live


def __getattr__(name: str):  # noqa: ANN202 - module attribute hook
    if name in _LAZY:
        import importlib
        return importlib.import_module(f".{name}", __name__)
    hint = f" (did you mean {_MOVED[name]}?)" if name in _MOVED else ""
    raise AttributeError(f"module 'dgl_oac' has no attribute {name!r}{hint}")
__all__ = ["NodeEmbedding", "DataLoader", "BatchLoader", "SparseSGD", "SparseAdagrad", "SparseAdam", "SparseRowWiseAdagrad", "SparseOptimizer", "MODES"]
