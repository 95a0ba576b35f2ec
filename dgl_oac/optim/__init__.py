"""Sparse row optimizers for :class:`dgl_oac.NodeEmbedding` (drop-ins for ``dgl.optim.Sparse*``)."""
from .base import SparseOptimizer
from .kernels import SparseAdagrad, SparseAdam, SparseRowWiseAdagrad, SparseSGD

__all__ = ["SparseOptimizer", "SparseSGD", "SparseAdagrad", "SparseAdam", "SparseRowWiseAdagrad"]
