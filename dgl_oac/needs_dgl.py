"""The one error every DGL entry point raises when DGL does not import (:func:`require_dgl`).

The engine, the tables, the optimizers, ``dgl_oac.nn``, :class:`dgl_oac.BatchLoader`, checkpoints and the KG
task need no graph library; DGL's loader, samplers, blocks and the node, link and hetero-node tasks live in
:mod:`dgl_oac.dgl_frontend`, which calls :func:`require_dgl` before anything of it runs. This module imports no
DGL: :func:`require_dgl` asks for it by name (``importlib``), which is how it can turn the failure into advice.
"""
from __future__ import annotations

import importlib

#: what to run to get DGL, and why Python >= 3.12 is different (PyPI's newest working DGL is 1.1.3: cp311 at most)
INSTALL_HINT = ('install it with `pip install "dgl-oac[dgl]"` (or `pip install dgl==1.1.3`). PyPI has no '
                "working DGL build for Python >= 3.12: use Python 3.11, or unzip DGL 1.1.3's cp311 wheel onto "
                "3.12 and import it with DGL_FFI=ctypes")


def dgl_missing_message(what: str, cause: BaseException) -> str:
    """The message of :func:`require_dgl`'s error: what needs DGL, why the import failed, how to install it."""
    return f"{what} needs DGL, which did not import ({type(cause).__name__}: {cause}); {INSTALL_HINT}"


def require_dgl(what: str) -> None:
    """Import DGL, or raise ``ImportError`` naming ``what`` needs it and how to install it (the cause chained)."""
    try:
        importlib.import_module("dgl")
    except ImportError as err:
        raise ImportError(dgl_missing_message(what, err), name="dgl") from err


__all__ = ["require_dgl", "dgl_missing_message", "INSTALL_HINT"]
