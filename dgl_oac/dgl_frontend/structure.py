"""The sampled structure on the copy stream: a batch's graphs, seeds and input nodes, to the device.

On a CUDA device, the gather thread (:func:`dgl_oac.loading.epoch.gather_batch`; sync: at hand-out) calls
:meth:`StructureCopy.start` on each sampler output: its graphs become index tensors (``structure="index"``:
:class:`~dgl_oac.dgl_frontend.blocks.IndexBlock` for blocks, :class:`~dgl_oac.dgl_frontend.blocks.IndexGraph` for pair
graphs) or stay DGL graphs (``structure="dgl"``: a CUDA build of DGL moves them itself), the host tensors are
pinned, and everything is copied on the side stream (``non_blocking``), behind one event. At hand-out
:meth:`StructureCopy.finish` makes the compute stream wait for that event (device-side) and records the copied
tensors on it (:meth:`~dgl_oac.engine.transfer.Transfer.wait_for_copy`, the one handoff helper). On the CPU both are
the identity.

``input_nodes`` (a tensor, the first item) is not copied when the loader has tables: hand-out gives out the
tables' device ids, already copied with the rows (one copy, not two).

DGL's own graphs (``structure="dgl"``, a CUDA build of DGL) are moved at :meth:`StructureCopy.finish`, on the
compute stream, not on the side stream: their structure lives in DGL's arrays, which cannot be recorded on the
compute stream, so memory allocated on the side stream could be reused by a later copy while a kernel still
reads it. Tensors (seeds, index structure) take the side stream and are recorded.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List, Optional

import dgl
import torch

from .blocks import dgl_has_cuda, index_structure
from ..engine.transfer import CudaStreams, Transfer

STRUCTURES = ("auto", "dgl", "index")


def resolve_structure(structure: str, device: torch.device, has_cuda_dgl: bool) -> str:
    """``"auto"``: DGL's own graphs where DGL can hold them on ``device`` (CPU, or a CUDA build of DGL), else
    index tensors. ``"dgl"`` on a CUDA device without a CUDA build of DGL is refused."""
    if structure not in STRUCTURES:
        raise ValueError(f"structure must be one of {', '.join(map(repr, STRUCTURES))}, got {structure!r}")
    on_device = device.type != "cpu"
    if structure == "auto":
        return "index" if on_device and not has_cuda_dgl else "dgl"
    if structure == "dgl" and on_device and not has_cuda_dgl:
        raise ValueError(f"structure='dgl' on {device} needs a CUDA build of DGL (PyPI's wheels are CPU builds): "
                         f"use structure='index' (dgl_oac.dgl_frontend.blocks) or install DGL's CUDA wheel")
    return structure


def dgl_stream_options(pin: Any, kwargs: dict) -> Any:
    """Honour DGL's ``pin_prefetcher`` and ``use_alternate_streams`` (popped from ``kwargs``); returns ``pin``.

    ``use_alternate_streams=True`` is what dgl-oac always does on CUDA (rows and structure are copied on side
    streams), ``False`` is refused; ``pin_prefetcher`` is ``pin`` by DGL's name (both given must agree)."""
    if "use_alternate_streams" in kwargs and not kwargs.pop("use_alternate_streams"):
        raise ValueError("use_alternate_streams=False: dgl_oac always copies a batch to a CUDA device on a side "
                         "stream (that is what overlaps the copy with compute); drop the option")
    pin_prefetcher = kwargs.pop("pin_prefetcher", None)
    if pin_prefetcher is None:
        return pin
    if pin not in ("auto", None) and bool(pin) != bool(pin_prefetcher):
        raise ValueError(f"pin_prefetcher={pin_prefetcher!r} contradicts pin={pin!r} (the same option by DGL's "
                         f"name and by dgl_oac's): give one")
    return bool(pin_prefetcher)


@dataclass
class Carried:
    """A sampler output whose structure is being copied: ``result`` (device graphs and tensors), the copied
    ``tensors`` and the copy's ``event``."""

    result: Any
    tensors: List[torch.Tensor]
    event: Any


class StructureCopy:
    """Moves sampler outputs to ``device`` as ``structure`` says ("dgl" or "index", resolved), on its own
    side stream. ``skip_input_nodes``: leave a tensor ``input_nodes`` (the first item) on the host."""

    def __init__(self, device: torch.device, structure: str, pin: bool, skip_input_nodes: bool,
                 streams: Optional[CudaStreams] = None) -> None:
        self.structure, self.skip_input_nodes = structure, skip_input_nodes
        self.transfer = Transfer(device, pin, streams)
        self.active = self.transfer.streams is not None

    def start(self, result: Any) -> Any:
        """Gather thread (or hand-out in sync): start the copy; returns a :class:`Carried`. Without streams (the
        CPU) nothing is copied: the result as is, its graphs as index tensors where ``structure`` is "index"."""
        if not self.active:
            return result if self.structure == "dgl" else self._index_in_place(result)
        tensors: List[torch.Tensor] = []
        tr = self.transfer
        with tr.streams.use(tr.h2d_stream):
            items = list(result) if isinstance(result, (tuple, list)) else [result]
            moved = [x if i == 0 and self.skip_input_nodes and isinstance(x, torch.Tensor)
                     else self._move(x, tensors) for i, x in enumerate(items)]
            event = tr.streams.new_event()
            event.record(tr.h2d_stream)
        out = type(result)(moved) if isinstance(result, (tuple, list)) else moved[0]
        return Carried(out, tensors, event)

    def finish(self, carried: Any) -> Any:
        """Hand-out, caller's thread: the copy stream -> compute stream handoff; returns the device result."""
        if not isinstance(carried, Carried):
            carried = self.start(carried)
            if not isinstance(carried, Carried):
                return carried
        self.transfer.wait_for_copy(carried.tensors, carried.event)
        if self.structure == "dgl":  # DGL's graphs, on the compute stream (module docstring)
            return self._graphs_to_device(carried.result)
        return carried.result

    def _copy(self, t: torch.Tensor, tensors: List[torch.Tensor]) -> torch.Tensor:
        out = self.transfer.device_copy(t)
        tensors.append(out)
        return out

    def _graphs_to_device(self, x: Any) -> Any:
        if isinstance(x, (list, tuple)):
            return type(x)(self._graphs_to_device(y) for y in x)
        return x.to(self.transfer.device, non_blocking=True) if isinstance(x, dgl.DGLGraph) else x

    def _index_in_place(self, x: Any) -> Any:
        """``x`` with every DGL graph as its index structure, on the graph's own device (no copy)."""
        if isinstance(x, (list, tuple)):
            return type(x)(self._index_in_place(y) for y in x)
        return index_structure(x) if isinstance(x, dgl.DGLGraph) else x

    def _move(self, x: Any, tensors: List[torch.Tensor]) -> Any:
        if isinstance(x, (list, tuple)):
            return type(x)(self._move(y, tensors) for y in x)
        if isinstance(x, dict):  # heterogeneous seeds or input nodes: {ntype: ids}
            return {k: self._move(y, tensors) for k, y in x.items()}
        if isinstance(x, torch.Tensor):
            return self._copy(x, tensors)
        if isinstance(x, dgl.DGLGraph):
            if self.structure == "dgl":  # moved at finish(), on the compute stream (module docstring)
                return x
            ib = index_structure(x)
            return ib.with_tensors([self._copy(t, tensors) for t in ib.tensors()])
        return x


__all__ = ["STRUCTURES", "StructureCopy", "Carried", "resolve_structure", "dgl_has_cuda", "dgl_stream_options"]
