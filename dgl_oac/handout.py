"""Stage V + hand-out, on the caller's thread: validate a batch's rows, wrap them as leaves, attach them.

Runs inside ``next(loader)``, after the previous ``opt.step()`` (so the write log holds every committed step)
and before the caller's forward pass. Order per embedding: wait for the copy (device-side), patch stale rows
(oac), make the ``requires_grad`` leaf the model reads, register the batch for the next ``step()``.
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Callable, List, Optional

import dgl
import torch

from .embedding import Slot
from .gather import Rows, gather_rows
from .transfer import handoff

if TYPE_CHECKING:
    from .loader import DataLoader


def to_device(result: Any, device: torch.device) -> Any:
    """Move a sampler's output (tensors, graphs, blocks, nested lists/tuples) to ``device``, as DGL does."""
    if device.type == "cpu":
        return result
    if isinstance(result, (list, tuple)):
        return type(result)(to_device(x, device) for x in result)
    if isinstance(result, (torch.Tensor, dgl.DGLGraph)):
        return result.to(device)
    return result


def attach(result: Any, name: str, leaf: torch.Tensor) -> None:
    """Put ``leaf: float32[n, D]`` where a model looks for input-node rows: ``blocks[0].srcdata[name]``, or,
    with no blocks, the ``ndata[name]`` of every graph in the tuple whose nodes are the input nodes."""
    blocks = result[-1] if isinstance(result[-1], list) else []
    if blocks:
        blocks[0].srcdata[name] = leaf
        return
    graphs = [g for g in result[1:] if isinstance(g, dgl.DGLGraph) and g.num_nodes() == leaf.shape[0]]
    if not graphs:
        raise ValueError(f"cannot attach {name!r}: the sampler returned no blocks and no graph over its "
                         f"{leaf.shape[0]} input nodes")
    for g in graphs:
        g.ndata[name] = leaf


class HandOut:
    """Callable turning (sampler output, gathered rows) into the tuple the caller receives."""

    def __init__(self, loader: "DataLoader", on_commit: Callable[[Slot, float, int], None]) -> None:
        self.loader = loader
        self.on_commit = on_commit

    def __call__(self, result: Any, rows: Optional[List[Rows]]) -> Any:
        loader = self.loader
        st = loader._stats
        if rows is None and loader.embeddings:  # sync: read now, after every earlier step is in the table
            for emb in loader.embeddings:
                emb.flush()
            from .loader import input_nodes_of

            rows = gather_rows(loader.embeddings, input_nodes_of(result), open_read=False, seconds=st.seconds)
        result = to_device(result, loader.device)
        t0 = time.perf_counter()
        for r in rows or []:
            emb = r.emb
            emb.drop_pending_without_grad()
            if emb.writer is not None:
                emb.writer.check()
            handoff([r.rows, r.ids_dev], r.event)
            if loader.mode == "oac":
                st.add_patched(emb.log.patch(r.ids_dev, r.rows, r.rv))
            # sync read after every step was written through; oac's log holds every committed step
            seen = None if loader.mode == "async" else emb.step_count - 1
            d = emb.embedding_dim
            leaf = r.rows[:, :d].contiguous() if r.rows.shape[1] != d else r.rows.detach().clone()
            leaf.requires_grad_(True)
            slot = Slot(r.ids, r.ids_dev, r.rows, leaf, loader.mode, rv=r.rv, seen=seen, unique=True,
                        check_finite=loader.check_finite, on_commit=[self.on_commit])
            emb.pending.append(slot)
            emb.current = slot
            st.rows_read += r.ids.numel()
            attach(result, emb.name, leaf)
            if r.ids_dev is not r.ids and isinstance(result, tuple):
                # hand out the device ids the slot knows, so emb(input_nodes, device) is an identity hit
                result = (r.ids_dev,) + result[1:]
        st.seconds["validate"] += time.perf_counter() - t0
        return result
