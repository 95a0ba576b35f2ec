"""Models of the training application: GraphSAGE and R-GCN encoders, link predictors and KG embedding scorers.
They take DGL's blocks or, on a device without DGL's CUDA build, :mod:`dgl_oac.dgl_frontend.blocks`' index tensors;
the KG scorers (:mod:`.kg`) take rows and need no DGL.

Each name is imported on first use (PEP 562), so the KG task loads its scorers without DGL.
"""
import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # what type checkers and the API reference read
    from .kg import ComplEx, DistMult, KGScorer, TransE, kg_loss, kg_regularization
    from .link import LinkPredictor, link_bce_loss
    from .rgcn import RGCN
    from .sage import SAGE, NodeClassifier, sage_inference

_EXPORTS = {"RGCN": "rgcn", "SAGE": "sage", "sage_inference": "sage", "NodeClassifier": "sage",
            "LinkPredictor": "link", "link_bce_loss": "link", "KGScorer": "kg", "DistMult": "kg", "ComplEx": "kg",
            "TransE": "kg", "kg_loss": "kg", "kg_regularization": "kg"}


def __getattr__(name: str):  # noqa: ANN202 - module attribute hook
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    globals()[name] = value
    return value


def __dir__():  # noqa: ANN202
    return sorted(list(globals()) + list(_EXPORTS))


__all__ = list(_EXPORTS)
