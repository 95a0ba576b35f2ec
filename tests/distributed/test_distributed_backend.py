"""The table protocol runs on a gloo group of its own, whatever the default group's backend (2 ranks on CPU).

The default group here is ``"cuda:gloo"``: it refuses CPU tensors exactly as ``init_process_group("nccl")``
does ("No backend type associated with device type cpu"), so it stands in for DGL's multi-GPU scripts on a
machine without a GPU. Training (tables, dense gradients averaged across ranks) must give what it gives over a
plain gloo default group, bit for bit; and a collective this rank cannot run names its cause, not a peer.
"""
from __future__ import annotations

import dgl
import pytest
import torch
import torch.distributed as dist

import dgl_oac
from dgl_oac.distributed import current_group
from dgl_oac.distributed.dense import average_gradients, broadcast_module
from dgl_oac.distributed.group import Group, PeerFailure

from conftest import power_law_graph
from dist_helpers import RankPool, two_rank_pool  # noqa: F401 - the fixture "pool": the module's 2 ranks

NODES, DIM = 60, 4


def _init(t: torch.Tensor) -> torch.Tensor:
    return t.copy_(torch.rand(t.shape, generator=torch.Generator().manual_seed(3)) - 0.5)


def _train(rank: int, world: int, mode: str):
    torch.manual_seed(rank)  # different dense initial values: broadcast_module must make them equal
    g = power_law_graph(NODES, seed=1)
    emb = dgl_oac.NodeEmbedding(NODES, DIM, "t", init_func=_init)
    opt = dgl_oac.optim.SparseAdagrad([emb], lr=0.05)
    lin = torch.nn.Linear(DIM, 1)
    group = current_group()
    broadcast_module(lin, group)
    dense = torch.optim.SGD(lin.parameters(), lr=0.1)
    loader = dgl_oac.DataLoader(g, torch.arange(NODES), dgl.dataloading.NeighborSampler([3]), embeddings=[emb],
                                batch_size=8, shuffle=True, seed=2, use_ddp=True, mode=mode, prefetch=2)
    for step, (_, _, blocks) in enumerate(loader):
        loss = lin(blocks[0].srcdata["t"]).square().mean()
        loss.backward()
        average_gradients(lin.parameters(), group, step)
        dense.step()
        dense.zero_grad()
        opt.step()
    return (dist.get_backend(), dist.get_backend(group.group), emb.weight.clone(), emb.optm_state.clone(),
            lin.weight.detach().clone())


@pytest.mark.parametrize("mode", ["sync", "oac"])
def test_trains_when_the_default_group_refuses_cpu_tensors(pool: RankPool, mode: str) -> None:
    plain = pool.run(_train, mode)
    refusing = pool.run(_train, mode, backend="cuda:gloo")
    for rank, (p, r) in enumerate(zip(plain, refusing)):
        assert r[:2] == ("cuda:gloo", "gloo"), f"rank {rank}: the table's group is gloo of its own: {r[:2]}"
        assert all(torch.equal(a, b) for a, b in zip(p[2:], r[2:])), f"rank {rank}: same training either way"
    assert torch.equal(refusing[0][4], refusing[1][4]), "dense parameters stayed equal across the ranks"


def _default_group_collective(rank: int, world: int):
    group = Group(dist.new_group(backend="gloo"))
    group._group = None  # the table protocol on the default ("cuda:gloo") group, as before it had its own
    try:
        group.all_reduce(torch.ones(2), what="a CPU tensor on a CUDA-only group")
    except PeerFailure as exc:
        return "PeerFailure", str(exc)
    except RuntimeError as exc:
        return type(exc).__name__, str(exc)
    return "none", ""


def test_a_collective_this_rank_cannot_run_names_its_cause_not_a_peer(pool: RankPool) -> None:
    for kind, msg in pool.run(_default_group_collective, backend="cuda:gloo"):
        assert kind == "RuntimeError", msg
        assert "No backend type associated with device type cpu" in msg and "'cuda:gloo'" in msg, msg
        assert "could not run on this rank's process group" in msg and "exited" not in msg, msg
