"""Node classification: GraphSAGE over learnable embeddings (optionally concatenated with fixed features)."""
from __future__ import annotations

from typing import Any, Dict

import dgl
import torch
import torch.nn.functional as F

from ...config import resolve_device
from ..data import NodeDataset
from ..models.sage import NodeClassifier
from . import backend
from .base import Task, check_dataset
from .common import TrainConfig
from .defaults import resolve_defaults


class NodeTask(Task):
    def __init__(self, cfg: TrainConfig, ds: NodeDataset) -> None:
        check_dataset(ds, NodeDataset, "node", "a node-classification dataset")
        resolve_defaults(cfg)  # a task built directly (not by build_task) gets the per-task defaults too
        self.cfg, self.ds = cfg, ds
        self.device = resolve_device(cfg.device)
        fan = cfg.fanout_list()
        self.emb = backend.make_embedding(cfg.mode, ds.graph.num_nodes(), cfg.dim, "emb",
                                          lambda t: torch.nn.init.normal_(t, std=0.1), sharding=cfg.sharding)
        self.sparse = backend.make_sparse_optimizer(cfg.mode, cfg.optimizer, [self.emb], cfg.lr)
        feat_dim = 0 if ds.features is None else ds.features.shape[1]
        self.model = NodeClassifier(cfg.dim, feat_dim, cfg.hidden, ds.num_classes, len(fan),
                                    cfg.dropout).to(self.device)
        self.dense = torch.optim.Adam(self.model.parameters(), lr=cfg.dense_lr)
        self.labels = ds.labels.to(self.device)
        self.feats = ds.features
        sampler = dgl.dataloading.NeighborSampler(fan)
        self.loader = backend.make_loader(cfg, ds.graph, ds.train_idx, sampler, [self.emb], self.device)

    def step(self, batch: Any) -> torch.Tensor:
        input_nodes, output_nodes, blocks = batch
        self.model.train()
        x = self.emb(input_nodes, self.device)
        feats = None if self.feats is None else self.feats[input_nodes.cpu()].to(self.device)
        loss = F.cross_entropy(self.model(blocks, x, feats), self.labels[output_nodes])
        return self.optimize(loss)


    @torch.no_grad()
    def evaluate(self) -> Dict[str, float]:
        logits = self.model.inference(self.ds.graph, backend.table_of(self.emb), self.feats,
                                      self.cfg.eval_batch_size, self.device)
        pred = logits.argmax(1)
        labels = self.ds.labels
        return {f"{split}_acc": float((pred[idx] == labels[idx]).float().mean())
                for split, idx in (("valid", self.ds.valid_idx), ("test", self.ds.test_idx))}

    def dataset_info(self) -> Dict[str, Any]:
        g = self.ds.graph
        return {"name": self.ds.name, "nodes": g.num_nodes(), "edges": g.num_edges(),
                "classes": self.ds.num_classes, "train": int(self.ds.train_idx.numel()),
                "features": 0 if self.ds.features is None else int(self.ds.features.shape[1])}


