"""``dgl_oac.nn.swap_embeddings(model)``: every ``torch.nn.Embedding`` inside a model (PyG's ``Node2Vec`` and
``MetaPath2Vec`` build theirs in their constructor) replaced by a :class:`~dgl_oac.nn.Embedding` holding the
same table, in one call.

    model = MetaPath2Vec(...)                                      # builds torch.nn.Embedding(sparse=True)
    swapped = dgl_oac.nn.swap_embeddings(model)                    # {"embedding": dgl_oac.nn.Embedding}
    opt = dgl_oac.nn.SparseAdam(list(swapped.values()), lr=0.01)   # was: torch.optim.SparseAdam(...)

Each replacement copies its table's values (no random draw, so the batches a model's sampler draws afterwards
are the ones it drew before), keeps ``padding_idx``, ``max_norm``, ``norm_type`` and a frozen weight
(``requires_grad=False``), returns rows on the device the weight was on, and is named by its path in the model
(its key in checkpoints). An embedding shared by several modules is replaced by one table, set at every place.
What cannot be carried over is refused before anything is replaced, with the reason.
"""
from __future__ import annotations

from typing import Dict, List, Tuple

import torch
from torch import nn

from .embedding import Embedding


def swap_embeddings(module: nn.Module) -> Dict[str, Embedding]:
    """Replace every ``torch.nn.Embedding`` in ``module`` (at any depth: attributes, ``ModuleDict``,
    ``ModuleList``) by a :class:`~dgl_oac.nn.Embedding` with its table; returns ``{path: new module}``, one entry
    per table (a shared one under its first path), for the sparse optimizer.

    Refused, naming the module, before anything is replaced: ``module`` itself an Embedding (hold it in a
    module, or use :meth:`Embedding.from_pretrained`); ``torch.nn.EmbeddingBag`` (dgl-oac has no bag reduction);
    a subclass of ``torch.nn.Embedding`` (its own ``forward`` would be lost); ``sparse=False`` (the model then
    trains it with a dense optimizer: leave it in torch, or make it ``sparse=True``); ``scale_grad_by_freq``; a
    dtype other than float32. Build the optimizer after the swap: one built before holds the old weights."""
    if isinstance(module, (nn.Embedding, nn.EmbeddingBag)):
        raise TypeError(f"swap_embeddings replaces the embeddings inside a module; got the {type(module).__name__} "
                        f"itself: hold it in a module, or build dgl_oac.nn.Embedding.from_pretrained(emb.weight, "
                        f"freeze=False) yourself")
    places: List[Tuple[str, nn.Module, str, nn.Embedding]] = []
    for path, parent in module.named_modules(remove_duplicate=False):
        for attr, child in parent.named_children():
            where = f"{path}.{attr}" if path else attr
            if isinstance(child, nn.EmbeddingBag):
                raise TypeError(f"{where} is a torch.nn.EmbeddingBag: dgl_oac.nn has no bag reduction; keep it in "
                                f"torch, or replace it by an Embedding and reduce its rows yourself")
            if isinstance(child, Embedding) or not isinstance(child, nn.Embedding):
                continue
            if type(child) is not nn.Embedding:
                raise TypeError(f"{where} is a {type(child).__name__}, a subclass of torch.nn.Embedding: its own "
                                f"forward would be lost in the swap; replace it yourself with dgl_oac.nn.Embedding")
            _check(where, child)
            places.append((where, parent, attr, child))
    swapped: Dict[str, Embedding] = {}
    new_of: Dict[int, Embedding] = {}
    for where, parent, attr, old in places:
        new = new_of.get(id(old))
        if new is None:
            new = new_of[id(old)] = _replacement(where, old)
            swapped[where] = new
        setattr(parent, attr, new)
    return swapped


def _check(where: str, emb: nn.Embedding) -> None:
    if not emb.sparse:
        raise ValueError(f"{where} has sparse=False: the model trains it with a dense optimizer, which a "
                         f"dgl_oac.nn.Embedding does not take; keep it in torch, or build it with sparse=True")
    if emb.scale_grad_by_freq:
        raise NotImplementedError(f"{where} has scale_grad_by_freq=True, which dgl_oac.nn.Embedding does not "
                                  f"support")
    if emb.weight.dtype != torch.float32:
        raise ValueError(f"{where} holds {emb.weight.dtype} rows; dgl_oac.nn.Embedding keeps float32 rows "
                         f"(emb.float() first)")


def _replacement(where: str, old: nn.Embedding) -> Embedding:
    device = old.weight.device
    return Embedding.from_pretrained(old.weight.detach(), freeze=not old.weight.requires_grad, name=where,
                                     padding_idx=old.padding_idx, max_norm=old.max_norm,
                                     norm_type=old.norm_type, device=None if device.type == "cpu" else device)
