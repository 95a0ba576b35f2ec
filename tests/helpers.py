"""Shared pieces of the training-loop tests: a loss, a train step, running a loader to the end, snapshots.

Only public API (``dgl_oac.NodeEmbedding``/``DataLoader``/optimizers), so tests built on these also run
against older versions of the library.

* ``loss_of(x)``: a loss whose gradient depends on the rows (``2x + sin'(x) + e0``), so an update computed from
  a wrong row changes every later step;
* ``rows_of(batch, emb)``: the rows the loader attached (``blocks[0].srcdata[emb.name]``);
* ``train_step(batch, emb, opt, lookup=False)``: forward, backward, ``opt.step()``; with ``lookup`` the rows
  are read with ``emb(input_nodes, device)`` at forward time instead (DGL's way);
* ``run_epoch(loader, emb, opt, ...)``: one pass over ``loader``, a step per batch (and a hook after each);
* ``node_loader(graph, emb, mode, ...)``: a 2-hop ``NeighborSampler`` loader over every node;
* ``snapshot(emb)``: ``(values, optimizer state)``, CPU copies.
"""
from __future__ import annotations

import time
from typing import Any, Callable, List, Optional, Sequence, Tuple

import dgl
import torch

import dgl_oac


def loss_of(x: torch.Tensor) -> torch.Tensor:
    """Scalar loss of rows ``x: float32[n, D]``; nonlinear, so gradients follow the rows' values."""
    return x.square().sum() + torch.sin(x).sum() + x[:, 0].sum()


def train_node_batches(loader: Any, opt: Any, name: str, epochs: int = 2) -> List[float]:
    """``epochs`` passes of :func:`loss_of` over each node batch's rows ``srcdata[name]``, one ``opt.step()`` a batch,
    pausing before each step so the gather thread reads the next batches before this step writes; the losses."""
    losses = []
    for _ in range(epochs):
        for batch in loader:
            time.sleep(0.02)
            loss = loss_of(batch[-1][0].srcdata[name])
            loss.backward()
            opt.step()
            losses.append(loss.item())
    return losses


def rows_of(batch: Any, emb: "dgl_oac.NodeEmbedding") -> torch.Tensor:
    """The leaf the loader attached for ``emb`` to a node batch ``(input_nodes, output_nodes, blocks)``."""
    return batch[-1][0].srcdata[emb.name]


def read_rows(batch: Any, emb: Any, lookup: bool = False) -> torch.Tensor:
    """A batch's rows: attached (default) or looked up with ``emb(input_nodes, device)`` (DGL's way)."""
    if lookup:
        ids = batch[0]
        return emb(ids, ids.device)
    return rows_of(batch, emb)


def train_step(batch: Any, emb: Any, opt: Any, lookup: bool = False) -> None:
    """Forward, backward and one sparse ``opt.step()`` for one batch."""
    loss_of(read_rows(batch, emb, lookup)).backward()
    opt.step()


def run_epoch(loader: Any, emb: Any, opt: Any, lookup: bool = False, limit: Optional[int] = None,
              after_step: Optional[Callable[[int], None]] = None) -> int:
    """Train over ``loader`` to its end (or ``limit`` batches, then ``loader.close()``), one step per batch;
    ``after_step(i)`` runs after batch i's step (before the next hand-out). Returns the batches trained."""
    steps = 0
    for batch in loader:
        train_step(batch, emb, opt, lookup)
        if after_step is not None:
            after_step(steps)
        steps += 1
        if limit is not None and steps >= limit:
            loader.close()
            break
    return steps


def node_loader(graph: dgl.DGLGraph, emb: "dgl_oac.NodeEmbedding", mode: str,
                embeddings: Optional[Sequence] = None, fanouts: Sequence[int] = (4, 4),
                **kw: Any) -> "dgl_oac.DataLoader":
    """A node-classification loader over every node: 2-hop sampling (overlapping batches on a power-law
    graph), shuffled with a fixed seed, background threads at normal priority (gathers run ahead for real)."""
    kw = {"batch_size": 16, "shuffle": True, "seed": 5, "prefetch": 4, "background_priority": "normal", **kw}
    sampler = dgl.dataloading.NeighborSampler(list(fanouts))
    return dgl_oac.DataLoader(graph, torch.arange(graph.num_nodes()), sampler,
                              embeddings=[emb] if embeddings is None else list(embeddings), mode=mode, **kw)


def snapshot(emb: Any) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(values float32[N, D], optimizer state float32[N, S])``, CPU copies after every committed step."""
    return emb.weight.detach().clone(), emb.optm_state.detach().clone()


def assert_same(a: Any, b: Any) -> None:
    """Bitwise equality of two snapshots, saying how far apart they are when not."""
    for what, x, y in (("values", a[0], b[0]), ("optimizer state", a[1], b[1])):
        assert x.shape == y.shape, (what, x.shape, y.shape)
        if not torch.equal(x, y):
            diff = (x - y).abs()
            rows = int((diff > 0).any(1).sum())
            raise AssertionError(f"{what} differ in {rows} rows, max abs {float(diff.max())}")
