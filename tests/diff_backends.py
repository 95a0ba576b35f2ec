"""The three ways a differential-test program runs: dgl-oac (``sync`` / ``oac``) and DGL's own classes.

Both present the same small surface to the interpreter (:mod:`diff_runner`): tables, an optimizer, epochs of
:class:`Batch`, the rows attached to a batch, checkpoint save/load and row writes. DGL's side replays the batch
stream the dgl-oac sync run recorded (``stream[(loader, epoch)]``: per batch, the input node ids of each
table), so all three see the same batches.
"""
from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Set, Tuple

import dgl
import torch

import dgl_oac
# DGL 1.1.3 has no sparse SGD: the benchmarks' one on DGL's own SparseGradOptimizer (duplicates averaged)
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from _workloads import DGLSparseSGD  # noqa: E402
from conftest import oac_threads, power_law_graph, seeded_init, unique_name
from dgl_oac.checkpoint import load_checkpoint, save_checkpoint

DIM = 3
HOMO = power_law_graph(40, seed=1, edges_per_node=2)
EDGE_IDS = torch.arange(64)


def _bipartite(users: int = 20, items: int = 15, m: int = 60) -> dgl.DGLGraph:
    gen = torch.Generator().manual_seed(0)
    u = torch.randint(0, users, (m,), generator=gen)
    i = (torch.rand(m, generator=gen) ** 2 * items).long()  # popular items: in most batches
    return dgl.heterograph({("user", "clicks", "item"): (u, i), ("item", "clicked_by", "user"): (i, u)},
                           num_nodes_dict={"user": users, "item": items})


HETERO = _bipartite()
NTYPES = ("user", "item")
HYPER = {"sgd": {"lr": 0.2}, "adagrad": {"lr": 0.1}, "adam": {"lr": 0.05}}
Stream = Dict[Tuple[int, int], List[List[torch.Tensor]]]


def table_sizes(graph: str) -> List[int]:
    return [HETERO.num_nodes(nt) for nt in NTYPES] if graph == "hetero-node" else [HOMO.num_nodes()]


class Batch:
    """One handed-out batch: ``ids[t]: int64[n_t]`` (the loader's own tensors), ``raw`` (the loader's tuple)."""

    def __init__(self, ids: List[torch.Tensor], raw: Any) -> None:
        self.ids, self.raw = ids, raw
        self.rows: Dict[int, torch.Tensor] = {}  # DGL: the one emb(input_nodes) read standing for srcdata
        self.claimed: Set[int] = set()  # tables whose first emb(input_nodes) call was made
        self.committed: Set[int] = set()  # tables whose rows of this batch a step has committed


class OacBackend:
    """dgl-oac in ``mode`` (``"sync"`` or ``"oac"``) at ``depth``; records the batch stream."""

    def __init__(self, program: Any, mode: str) -> None:
        self.program, self.mode = program, mode
        self.threads_before = oac_threads()
        self.embs = [dgl_oac.NodeEmbedding(n, DIM, unique_name("diff"), init_func=seeded_init(t))
                     for t, n in enumerate(table_sizes(program.graph))]
        cls = {"sgd": dgl_oac.SparseSGD, "adagrad": dgl_oac.SparseAdagrad, "adam": dgl_oac.SparseAdam}[program.opt]
        self.opt = cls(self.embs, **HYPER[program.opt])
        self.loaders = [self._loader(seed) for seed in (11, 12)]
        self.epochs = [0, 0]
        self.stream: Stream = {}
        self._dir = tempfile.TemporaryDirectory(prefix="dgl-oac-diff-")
        self.ckpt = Path(self._dir.name) / "ckpt.bin"

    def _loader(self, seed: int) -> "dgl_oac.DataLoader":
        g = self.program.graph
        kw = dict(mode=self.mode, prefetch=self.program.depth, batch_size=4 if g == "homo-node" else 8,
                  shuffle=True, seed=seed, background_priority="normal")
        if g == "homo-node":
            return dgl_oac.DataLoader(HOMO, torch.arange(HOMO.num_nodes()), dgl.dataloading.NeighborSampler([2, 2]),
                                      embeddings=self.embs, **kw)
        if g == "homo-edge":
            sampler = dgl.dataloading.as_edge_prediction_sampler(
                dgl.dataloading.NeighborSampler([2]), negative_sampler=dgl.dataloading.negative_sampler.Uniform(1))
            return dgl_oac.DataLoader(HOMO, EDGE_IDS, sampler, embeddings=self.embs, **kw)
        return dgl_oac.DataLoader(HETERO, {"user": torch.arange(HETERO.num_nodes("user"))},
                                  dgl.dataloading.NeighborSampler([2, 2]),
                                  embeddings=dict(zip(NTYPES, self.embs)), **{**kw, "batch_size": 5})

    def epoch(self, li: int) -> Iterator[Batch]:
        key = (li, self.epochs[li])
        self.epochs[li] += 1
        self.stream[key] = []
        for raw in self.loaders[li]:
            ids = [raw[0][nt] for nt in NTYPES] if isinstance(raw[0], dict) else [raw[0]]
            self.stream[key].append([i.clone() for i in ids])
            yield Batch(ids, raw)

    def attached(self, batch: Batch, t: int) -> torch.Tensor:
        data = batch.raw[-1][0].srcdata[self.embs[t].name]
        return data[NTYPES[t]] if isinstance(data, dict) else data

    def own(self, batch: Batch, t: int) -> torch.Tensor:
        """``emb(input_nodes)`` of ``batch`` (the loader's own ids tensor)."""
        return self.embs[t](batch.ids[t])

    def write_rows(self, t: int, ids: torch.Tensor, values: torch.Tensor) -> None:
        self.embs[t].write_rows(ids, values)

    def save(self) -> None:
        save_checkpoint(self.ckpt, self.embs, self.opt, loader=self.loaders[0])

    def load(self) -> None:
        for loader in self.loaders:
            loader.close()
        load_checkpoint(self.ckpt, self.embs, self.opt, loader=self.loaders[0])

    def log_entries(self) -> int:
        """The most steps any table's write log holds now (0 without a log)."""
        return max(len(e.pipeline.log.entries) if e.pipeline.log is not None else 0 for e in self.embs)

    def log_bound(self) -> int:
        """Steps an in-flight read can miss: the depth, the write-back queue and two (``loader.py``'s hint)."""
        return self.loaders[0].prefetch + self.loaders[0].writeback_depth + 2

    def snapshot(self) -> List[Tuple[torch.Tensor, torch.Tensor]]:
        return [(e.weight.clone(), e.optm_state.clone()) for e in self.embs]

    def rows_patched(self) -> int:
        """Rows oac's validation replaced (0 in sync): whether a program exercised the patching at all."""
        return sum(loader.stats.rows_patched for loader in self.loaders)

    def wait_threads(self, timeout: float = 5.0) -> List[str]:
        """The dgl-oac threads beyond the baseline still running once the program's loops are gone and they
        had ``timeout`` seconds to end (no ``gc.collect()``: a dropped epoch must end by reference counting,
        as a loop left with ``break`` does)."""
        deadline = time.monotonic() + timeout
        while oac_threads() != self.threads_before and time.monotonic() < deadline:
            time.sleep(0.01)
        return [t for t in oac_threads() if t not in self.threads_before]

    def close(self) -> None:
        for loader in self.loaders:
            loader.close()
        for e in self.embs:
            e.close()
        self._dir.cleanup()

class DglBackend:
    """``dgl.nn.NodeEmbedding`` + ``dgl.optim`` replaying ``stream``; a batch's attached rows are one
    ``emb(input_nodes)`` read at first use (what a DGL model does in its forward)."""

    def __init__(self, program: Any, stream: Stream) -> None:
        self.program, self.stream = program, stream
        self.embs = [dgl.nn.NodeEmbedding(n, DIM, unique_name("dgl"), init_func=seeded_init(t))
                     for t, n in enumerate(table_sizes(program.graph))]
        cls = {"sgd": DGLSparseSGD, "adagrad": dgl.optim.SparseAdagrad, "adam": dgl.optim.SparseAdam}[program.opt]
        self.opt = cls(self.embs, **HYPER[program.opt])
        self.epochs = [0, 0]
        self.saved: Optional[List[List[torch.Tensor]]] = None

    def epoch(self, li: int) -> Iterator[Batch]:
        key = (li, self.epochs[li])
        self.epochs[li] += 1
        for ids in self.stream[key]:
            yield Batch(ids, None)

    def attached(self, batch: Batch, t: int) -> torch.Tensor:
        if t not in batch.rows:
            batch.rows[t] = self.embs[t](batch.ids[t])
        return batch.rows[t]

    def own(self, batch: Batch, t: int) -> torch.Tensor:
        """``emb(input_nodes)`` of ``batch``: the first call is the read the attached rows stand for (dgl-oac
        returns the hand-out leaf to it, docs/concepts/semantics.md), as a DGL model that attaches
        ``x = emb(input_nodes)`` and uses ``x`` twice; later calls are traces of their own."""
        if t in batch.claimed:
            return self.embs[t](batch.ids[t])
        batch.claimed.add(t)
        return self.attached(batch, t)

    def write_rows(self, t: int, ids: torch.Tensor, values: torch.Tensor) -> None:
        self.embs[t].weight[ids] = values

    def _state(self, e: Any) -> List[torch.Tensor]:
        return [e.weight] + ([] if e.optm_state is None else list(e.optm_state))

    def save(self) -> None:
        self.saved = [[x.clone() for x in self._state(e)] for e in self.embs]

    def load(self) -> None:
        for e, saved in zip(self.embs, self.saved):
            for x, y in zip(self._state(e), saved):
                x.copy_(y)

    def snapshot(self) -> List[Tuple[torch.Tensor, torch.Tensor]]:
        """In dgl-oac's layout: Adagrad ``[sum]``, Adam ``[exp_avg | exp_avg_sq | step]``, SGD none."""
        out = []
        for e in self.embs:
            st = () if e.optm_state is None else e.optm_state
            if self.program.opt == "adam":
                step, mem, power = st
                state = torch.cat([mem, power, step.reshape(-1, 1).float()], 1)
            elif self.program.opt == "adagrad":
                state = st[0]
            else:
                state = torch.zeros(e.weight.shape[0], 0)
            out.append((e.weight.clone(), state.clone()))
        return out

    def wait_threads(self) -> List[str]:
        return []

    def rows_patched(self) -> int:
        return 0

    def close(self) -> None:
        pass
