"""The DGL frontend: everything of dgl_oac that imports ``dgl`` (the application aside).

:mod:`.loader` (:class:`dgl_oac.DataLoader` over DGL's samplers), :mod:`.inputs` and :mod:`.hetero` (what a
loader's indices and input nodes mean for its tables), :mod:`.handout` (the engine's hand-out, with each table's
rows attached where a DGL model reads them), :mod:`.structure` (a batch's graphs to the device), :mod:`.blocks`
(index-tensor blocks), :mod:`.sampling` (reproducible sampling, DGL-style samplers and their worker processes),
:mod:`.distgraph` (DGL's DistGraph). The engine below knows no graph library (``tests/test_layout.py``).

Importing any of it without DGL raises :func:`dgl_oac.needs_dgl.require_dgl`'s ``ImportError``.
"""
from ..needs_dgl import require_dgl

require_dgl("dgl_oac.dgl_frontend (dgl_oac.DataLoader, DGL's samplers, blocks and heterographs)")
