"""Node classification on a heterograph (``--task hetero-node``, e.g. ``--dataset synthetic-mag``).

An R-GCN (:class:`~dgl_oac.app.models.rgcn.RGCN`) over sampled blocks; the node types with features use them,
every featureless type gets a learnable table (``emb_<ntype>``), all tables under one sparse optimizer and one
loader (``embeddings={ntype: table}``, see :mod:`dgl_oac.dgl_frontend.hetero`). Evaluation samples blocks with the
training fan-outs, reproducibly (the same neighbourhoods in every mode), and reads the tables without grad.
"""
from __future__ import annotations

from typing import Any, Dict

import dgl
import torch
import torch.nn.functional as F

from ...dgl_frontend.blocks import graph_to
from ...config import resolve_device
from ..data import HeteroNodeDataset
from ..models.rgcn import RGCN
from ...dgl_frontend.sampling import batch_seed, reproducible
from . import backend
from .base import Task, check_dataset
from .common import TrainConfig
from .defaults import resolve_defaults


class HeteroNodeTask(Task):
    def __init__(self, cfg: TrainConfig, ds: HeteroNodeDataset) -> None:
        check_dataset(ds, HeteroNodeDataset, "hetero-node", "a heterograph node-classification dataset",
                      "e.g. --dataset synthetic-mag")
        resolve_defaults(cfg)
        self.cfg, self.ds = cfg, ds
        self.device = resolve_device(cfg.device)
        g, fan = ds.graph, cfg.fanout_list()
        self.target = ds.target_ntype
        self.feats = ds.features
        self.embs = {nt: backend.make_embedding(cfg.mode, g.num_nodes(nt), cfg.dim, f"emb_{nt}",
                                                lambda t: torch.nn.init.normal_(t, std=0.1), sharding=cfg.sharding)
                     for nt in g.ntypes if nt not in ds.features}
        self.sparse = backend.make_sparse_optimizer(cfg.mode, cfg.optimizer, list(self.embs.values()), cfg.lr)
        in_dims = {**{nt: f.shape[1] for nt, f in ds.features.items()}, **{nt: cfg.dim for nt in self.embs}}
        self.model = RGCN(in_dims, cfg.hidden, ds.num_classes, g.etypes, len(fan), cfg.dropout).to(self.device)
        self.dense = torch.optim.Adam(self.model.parameters(), lr=cfg.dense_lr)
        self.labels = ds.labels.to(self.device)
        self.sampler = dgl.dataloading.NeighborSampler(fan)
        self.loader = backend.make_loader(cfg, g, {self.target: ds.train_idx}, self.sampler, self.embs,
                                          self.device)

    def _inputs(self, input_nodes: Dict[str, torch.Tensor], read: Any) -> Dict[str, torch.Tensor]:
        """``{ntype: float32[n_t, in_dim]}`` on the device: features, or ``read(ntype, ids)`` of the tables."""
        x = {nt: read(nt, ids) for nt, ids in input_nodes.items() if nt in self.embs and ids.numel()}
        x.update({nt: f[input_nodes[nt].cpu()].to(self.device) for nt, f in self.feats.items()
                  if nt in input_nodes})
        return x

    def step(self, batch: Any) -> torch.Tensor:
        input_nodes, output_nodes, blocks = batch
        self.model.train()
        x = self._inputs(input_nodes, lambda nt, ids: self.embs[nt](ids, self.device))
        logits = self.model(blocks, x)[self.target]
        return self.optimize(F.cross_entropy(logits, self.labels[output_nodes[self.target]]))

    @torch.no_grad()
    def evaluate(self) -> Dict[str, float]:
        self.model.eval()
        tables = {nt: backend.table_of(e) for nt, e in self.embs.items()}
        out: Dict[str, float] = {}
        for split, idx in (("valid", self.ds.valid_idx), ("test", self.ds.test_idx)):
            correct = 0
            for b, seeds in enumerate(torch.split(idx, self.cfg.eval_batch_size)):
                with reproducible(batch_seed(self.cfg.seed, -1, b)):
                    input_nodes, _, blocks = self.sampler.sample(self.ds.graph, {self.target: seeds})
                blocks = [graph_to(blk, self.device) for blk in blocks]
                x = self._inputs(input_nodes, lambda nt, ids: tables[nt].index_select(0, ids).to(self.device))
                pred = self.model(blocks, x)[self.target].argmax(1)
                correct += int((pred == self.labels[seeds.to(self.device)]).sum())
            out[f"{split}_acc"] = correct / max(1, idx.numel())
        self._evals += 1
        return out

    def dataset_info(self) -> Dict[str, Any]:
        g = self.ds.graph
        return {"name": self.ds.name, "nodes": {nt: g.num_nodes(nt) for nt in g.ntypes},
                "edges": int(g.num_edges()), "relations": len(g.canonical_etypes), "classes": self.ds.num_classes,
                "train": int(self.ds.train_idx.numel()), "target": self.target,
                "learned": list(self.embs), "features": {nt: int(f.shape[1]) for nt, f in self.feats.items()}}

    def checkpoint_parts(self) -> Dict[str, Any]:
        return {"embeddings": list(self.embs.values()), "sparse_opt": self.sparse,
                "dense_modules": {"model": self.model}, "dense_optimizers": {"dense": self.dense},
                "loader": self.loader}

    def close(self) -> None:
        backend.close(self.loader, list(self.embs.values()))
