"""``dgl_oac.nn.Embedding`` through a ``dgl_oac.DataLoader``: oac equals sync bitwise, and both equal torch's own
``nn.Embedding(sparse=True)`` + optimizer fed the same batch stream.

The model reads the batch's rows the torch way, ``emb(input_nodes)`` (the loader's prefetched rows, found by
identity), plus ``emb(output_nodes[:, None].expand(-1, 2))``: a second read in the step, 2-D and of a
non-contiguous view, so every output row occurs three times (sums of three: torch's coalesce adds them in its
sort's order, dgl-oac in read order, which may differ in the last bit: the torch comparison is within float
rounding over 20 steps, 1e-6 for the table and 5e-6 for the losses, relative (measured: 1.2e-7 and 8e-7); sync
against oac is bitwise).
"""
from __future__ import annotations

import warnings
from typing import Dict, List, Tuple

import dgl
import pytest
import torch

import dgl_oac
import dgl_oac.nn as oac_nn

from conftest import power_law_graph
from helpers import loss_of

pytestmark = [pytest.mark.hang_timeout(90), pytest.mark.filterwarnings("ignore:Dataloader CPU affinity"),
              pytest.mark.filterwarnings("ignore:Sparse invariant checks")]  # torch's own, from its Adagrad

N, DIM = 150, 4
GRAPH = power_law_graph(N, seed=2)
OPTIMIZERS: Dict[str, Tuple[type, type, dict]] = {
    "adam": (oac_nn.SparseAdam, torch.optim.SparseAdam, {"lr": 0.05}),
    "adagrad": (oac_nn.Adagrad, torch.optim.Adagrad, {"lr": 0.1, "lr_decay": 0.01, "initial_accumulator_value": 0.1}),
    "sgd": (oac_nn.SGD, torch.optim.SGD, {"lr": 0.1}),
}


def forward(emb: torch.nn.Module, input_nodes: torch.Tensor, output_nodes: torch.Tensor) -> torch.Tensor:
    x = emb(input_nodes)
    y = emb(output_nodes[:, None].expand(-1, 2))  # 2-D, non-contiguous (stride 0): torch accepts it
    return loss_of(x) + loss_of(y.reshape(-1, DIM) * 0.5)


def train_oac(mode: str, opt_name: str, prefetch: int = 4) -> Tuple[List[float], torch.Tensor, torch.Tensor, list]:
    """Two epochs through a dgl_oac.DataLoader; (losses, table, optimizer state, the batches' (input, output))."""
    torch.manual_seed(0)
    emb = oac_nn.Embedding(N, DIM, sparse=True, name=f"nn_{mode}_{opt_name}_{prefetch}")
    cls, _, kw = OPTIMIZERS[opt_name]
    opt = cls(emb.parameters(), **kw)
    loader = dgl_oac.DataLoader(GRAPH, torch.arange(N), dgl.dataloading.NeighborSampler([3, 3]),
                                embeddings=[emb.node_embedding], mode=mode, prefetch=prefetch, batch_size=16,
                                shuffle=True, seed=4, background_priority="normal")
    losses, stream = [], []
    for _ in range(2):
        for input_nodes, output_nodes, _blocks in loader:
            loss = forward(emb, input_nodes, output_nodes)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
            stream.append((input_nodes.clone(), output_nodes.clone()))
    values, state = emb.weight.clone(), emb.node_embedding.optm_state.clone()
    emb.node_embedding.close()
    return losses, values, state, stream


def train_torch(opt_name: str, stream: list) -> Tuple[List[float], torch.Tensor]:
    torch.manual_seed(0)
    emb = torch.nn.Embedding(N, DIM, sparse=True)
    _, cls, kw = OPTIMIZERS[opt_name]
    opt = cls(emb.parameters(), **kw)
    losses = []
    for input_nodes, output_nodes in stream:
        loss = forward(emb, input_nodes, output_nodes)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, emb.weight.detach().clone()


@pytest.mark.parametrize("opt_name", list(OPTIMIZERS))
def test_oac_equals_sync_and_torch(opt_name: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no torch warning (searchsorted on a non-contiguous view) nor ours
        warnings.filterwarnings("ignore", "Dataloader CPU affinity")
        s_losses, s_values, s_state, stream = train_oac("sync", opt_name)
        o_losses, o_values, o_state, o_stream = train_oac("oac", opt_name)
    assert len(stream) == 20 and all(torch.equal(a[0], b[0]) for a, b in zip(stream, o_stream))
    assert o_losses == s_losses
    assert torch.equal(o_values, s_values) and torch.equal(o_state, s_state)
    t_losses, t_values = train_torch(opt_name, stream)
    assert float((t_values - s_values).abs().max()) <= 1e-6
    assert max(abs(a - b) / max(1.0, abs(b)) for a, b in zip(s_losses, t_losses)) <= 5e-6
    torch.manual_seed(0)
    initial = torch.nn.Embedding(N, DIM).weight.detach()
    assert float((s_values - initial).abs().max()) > 0.05  # it trained: the comparison is not of two initial tables


@pytest.mark.parametrize("mode", ["sync", "oac"])
def test_non_contiguous_ids_of_a_batch_give_no_warning(mode: str) -> None:
    """Regression (issue 25): a strided view of a batch's ids, ``emb(input_nodes[::2])``, made torch warn from
    ``searchsorted`` inside dgl_oac (its positions in the batch were looked up on the non-contiguous view)."""
    emb = oac_nn.Embedding(N, DIM, name=f"strided_{mode}")
    opt = oac_nn.SGD(emb.parameters(), lr=0.1)
    loader = dgl_oac.DataLoader(GRAPH, torch.arange(N), dgl.dataloading.NeighborSampler([3, 3]),
                                embeddings=[emb.node_embedding], mode=mode, prefetch=2, batch_size=32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warnings.filterwarnings("ignore", "Dataloader CPU affinity")
        for input_nodes, _output_nodes, _blocks in loader:
            strided = input_nodes[::2]
            assert not strided.is_contiguous()
            rows = emb(strided)
            assert torch.equal(rows.detach(), emb.weight[strided])
            loss_of(rows).backward()
            opt.step()
