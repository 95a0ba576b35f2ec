"""torch-shaped modules and optimizers over dgl-oac's CPU tables: a drop-in for ``torch.nn.Embedding(sparse=True)``
with ``torch.optim.SparseAdam`` / ``SGD`` / ``Adagrad`` (torch's semantics: duplicate ids summed, one step count
per table). Changing the imports is the port:

    emb = dgl_oac.nn.Embedding(num, dim, sparse=True)
    opt = dgl_oac.nn.SparseAdam(emb.parameters(), lr=0.01)

``model.parameters()``: see :mod:`dgl_oac.nn.params`. A model that builds its own ``torch.nn.Embedding`` (PyG's
``Node2Vec``, ``MetaPath2Vec``): :func:`swap_embeddings` replaces them in one call (:mod:`dgl_oac.nn.swap`).
"""
from .embedding import Embedding, torch_init
from .optim import SGD, Adagrad, SparseAdam
from .params import TableHandle, dense_parameters, sparse_parameters
from .swap import swap_embeddings

__all__ = ["Embedding", "SparseAdam", "SGD", "Adagrad", "TableHandle", "sparse_parameters", "dense_parameters",
           "torch_init", "swap_embeddings"]
