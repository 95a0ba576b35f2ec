"""The named workloads of ``bench_modes.py``: together they cover node, link and KG tasks; SGD, Adagrad and Adam
rows; dims 32 to 256; and one workload whose step is dominated by the model rather than by the embedding rows.

Each is built by the training tasks of ``dgl_oac.app.tasks`` (the same task code in every mode) over a synthetic
power-law graph, and each has a plain-DGL equivalent (``mode="dgl"``: ``dgl.nn.NodeEmbedding`` + ``dgl.optim``
+ ``dgl.dataloading.DataLoader``). ``dgl.optim`` has no sparse SGD: the SGD workload's DGL baseline is
:class:`DGLSparseSGD`, an SGD row update written on DGL's own ``SparseGradOptimizer`` (DGL's gradient
collection and duplicate-id averaging, then ``weight[rows] -= lr * grad``), as a DGL user would write it.
"""
from __future__ import annotations

import argparse
import copy
from typing import Any, Dict, List

import torch
from dgl.optim.pytorch.sparse_optim import SparseGradOptimizer

#: name -> the task's settings (TrainConfig fields, plus the synthetic graph's size)
WORKLOADS: Dict[str, Dict[str, Any]] = {
    # the headline workload: rows (gather + Adam update of 385 floats each) and model comparable
    "node-adam-128": dict(task="node", optimizer="adam", dim=128, hidden=64, fanouts="10,5", batch_size=1024),
    # model-bound: 32-column SGD rows (the cheapest row work) under a 2-layer GraphSAGE with 256 hidden units
    "node-sgd-32-model": dict(task="node", optimizer="sgd", dim=32, hidden=256, fanouts="10,10", batch_size=1024),
    # link prediction: GraphSAGE over both endpoints and 64 shared negatives a batch, Adagrad rows
    "link-adagrad-64": dict(task="link", optimizer="adagrad", dim=64, hidden=64, fanouts="10,5", batch_size=1024,
                            negatives=64),
    # KG embedding: ComplEx (no GNN), 1024 shared negatives, Adagrad rows of 256 columns
    "kg-adagrad-256": dict(task="kg", model="complex", optimizer="adagrad", dim=256, batch_size=1024,
                           negatives=1024),
    # GPU-sized KG embedding: ComplEx over 10M entities (value ‖ Adagrad state: 512 floats a row, 20.5 GB a
    # table), batches of 8192 triples with 1024 shared negatives (~18k rows, ~37 MB each way a step), 10M
    # triples (average degree 2: an epoch of ~1100 batches, generated in seconds)
    "kg-complex-256-10m": dict(task="kg", model="complex", optimizer="adagrad", dim=256, batch_size=8192,
                               negatives=1024, num_nodes=10_000_000, avg_degree=2.0),
}
#: sized for a device: never in a CPU run's ``all``, and refused on the CPU at full size (``--quick`` runs it small)
GPU_ONLY = ("kg-complex-256-10m",)
DEFAULT = "node-adam-128"
QUICK = dict(num_nodes=5_000, batch_size=256)  # --quick: every workload on a small graph, small batches
AVG_DEGREE = 10.0  # the synthetic graphs' average degree, unless the workload or --avg-degree says otherwise


def names(text: str, device: str = "cpu", quick: bool = False) -> List[str]:
    """``--workload``: ``all`` (on the CPU: every workload but :data:`GPU_ONLY`) or comma-separated names; a
    GPU-only workload named for a full-size CPU run is refused."""
    on_cpu = str(device).split(":")[0] == "cpu"
    everything = [n for n in WORKLOADS if not (on_cpu and n in GPU_ONLY)]
    out = everything if text.strip() == "all" else [x.strip() for x in text.split(",") if x.strip()]
    unknown = [x for x in out if x not in WORKLOADS]
    if unknown or not out:
        raise ValueError(f"unknown workload(s) {unknown or text!r}: expected 'all' or some of {', '.join(WORKLOADS)}")
    big = [x for x in out if x in GPU_ONLY and on_cpu and not quick]
    if big:
        raise ValueError(f"workload(s) {', '.join(big)} are sized for a GPU (--device cuda); on the CPU only with "
                         f"--quick")
    return out


def settings(args: argparse.Namespace, name: str) -> argparse.Namespace:
    """``args`` with workload ``name``'s settings filled in (``--num-nodes`` overrides the graph size)."""
    w = copy.copy(args)
    spec = dict(WORKLOADS[name])
    if args.quick:
        spec.update(QUICK, hidden=min(spec.get("hidden", 64), 64), negatives=min(spec.get("negatives", 64), 64))
    w.name = name
    w.task = spec.pop("task")
    w.model = spec.pop("model", None)
    w.negatives = spec.pop("negatives", None)
    w.hidden = spec.pop("hidden", 64)
    w.fanouts = spec.pop("fanouts", "10,5")
    nodes = spec.pop("num_nodes", 300_000)
    w.num_nodes = args.num_nodes or nodes
    degree = spec.pop("avg_degree", AVG_DEGREE)
    w.avg_degree = getattr(args, "avg_degree", None) or degree
    w.dim, w.optimizer, w.batch_size = spec.pop("dim"), spec.pop("optimizer"), spec.pop("batch_size")
    if spec:
        raise ValueError(f"workload {name}: unused settings {sorted(spec)}")
    return w


def row_floats(optimizer: str, dim: int) -> int:
    """Floats a table row holds: the value and the optimizer's state (its ``state_width``, the code's layout)."""
    import dgl_oac

    cls = {"sgd": dgl_oac.SparseSGD, "adagrad": dgl_oac.SparseAdagrad, "adam": dgl_oac.SparseAdam}[optimizer]
    return dim + cls([dgl_oac.NodeEmbedding(1, 1, f"row_floats_{optimizer}")], lr=0.1).state_width(dim)


def dataset(w: argparse.Namespace) -> Any:
    from dgl_oac.app.data import load

    return load("synthetic", num_nodes=w.num_nodes, avg_degree=w.avg_degree, power=w.power, task=w.task,
                seed=w.seed)


def build_task(w: argparse.Namespace, ds: Any, mode: str, prefetch: Any, priority: str, workers: int) -> Any:
    """Workload ``w``'s task in ``mode`` (``async-gap``: mode async with staleness gap; ``resident``: sync's task
    with its table moved to the device, :mod:`_resident`; a fresh table, model and loader; the model seeded by
    ``w.seed``; ``workers`` sampling processes for a dgl-oac loader)."""
    from dgl_oac.app.tasks.common import TrainConfig

    if mode == "resident":  # sync's task, built the same way (same initialisation), then made resident
        from _resident import make_resident

        return make_resident(build_task(w, ds, "sync", prefetch, priority, workers))
    mode, _, staleness = mode.partition("-")
    dgl_sgd = mode == "dgl" and w.optimizer == "sgd"
    tc = TrainConfig(task=w.task, dataset="synthetic", model=w.model, mode=mode, staleness=staleness or None,
                     prefetch=prefetch, dim=w.dim,
                     hidden=w.hidden, fanouts=w.fanouts, batch_size=w.batch_size, negatives=w.negatives,
                     optimizer="adagrad" if dgl_sgd else w.optimizer, seed=w.seed, device=w.device,
                     progress=False, background_priority=priority,
                     num_workers=0 if mode == "dgl" else workers)
    if w.task == "node":
        from dgl_oac.app.tasks.node import NodeTask as Task
    elif w.task == "link":
        from dgl_oac.app.tasks.link import LinkTask as Task
    else:
        from dgl_oac.app.tasks.kg import KGTask as Task
    task = Task(tc, ds)
    if dgl_sgd:
        task.sparse = DGLSparseSGD([task.emb], lr=tc.lr)
    return task


class DGLSparseSGD(SparseGradOptimizer):
    """SGD rows over ``dgl.nn.NodeEmbedding`` s on DGL's sparse-optimizer base: duplicate ids averaged (DGL's
    rule), no state."""

    def setup(self, params: Any) -> None:
        pass

    @property
    def param_groups(self) -> List[Dict[str, float]]:
        return [{"lr": self._lr}]

    def _set_param_groups(self, groups: List[Dict[str, float]]) -> None:
        self._lr = groups[0]["lr"]

    def update(self, idx: torch.Tensor, grad: torch.Tensor, emb: Any) -> None:
        rows, inverse, count = torch.unique(idx, return_inverse=True, return_counts=True)
        g = torch.zeros((rows.shape[0], grad.shape[1]), device=grad.device).index_add_(0, inverse, grad)
        g /= count.unsqueeze(1)
        dev = emb.weight.device
        emb.weight[rows.to(dev)] -= (self._lr * g).to(dev)
