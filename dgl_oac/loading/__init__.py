"""The loading layer: graph-agnostic, between a batch source and the engine.

:mod:`.epoch` (the one caller-side schedule every loader shares), :mod:`.batch_loader` (``dgl_oac.BatchLoader``:
any iterable of batches) and :mod:`.source_thread` (its opt-in background pull). A graph loader
(:mod:`dgl_oac.dgl_frontend.loader`) plugs into the same epoch. Nothing here imports a graph library.
"""
