"""dgl-oac: learnable node embeddings in CPU memory, trained through an async pipeline that Optimistic
Asynchrony Control keeps exactly equal to synchronous training.

    emb = dgl_oac.NodeEmbedding(g.num_nodes(), 128, "emb")
    opt = dgl_oac.SparseAdam([emb], lr=0.01)
    loader = dgl_oac.DataLoader(g, train_ids, sampler, embeddings=[emb], mode="oac", batch_size=1024)
"""
from .config import MODES
from .embedding import NodeEmbedding
from .loader import DataLoader
from .optim import SparseAdagrad, SparseAdam, SparseOptimizer, SparseRowWiseAdagrad, SparseSGD

__version__ = "0.1.0"
__all__ = ["NodeEmbedding", "DataLoader", "SparseSGD", "SparseAdagrad", "SparseAdam", "SparseRowWiseAdagrad", "SparseOptimizer", "MODES"]
