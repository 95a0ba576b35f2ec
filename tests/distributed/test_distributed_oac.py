"""OAC with N trainers (2 gloo ranks) against N-trainer sync: bitwise-equal tables, optimizer state and every
rank's losses, for node and edge batches, SGD/Adagrad/Adam, prefetch 1 and 4, with more than 10% of rows patched
on each rank. Controls: with forwarding off the result differs; a step missing from a write log fails loudly."""
from __future__ import annotations

import time

import dgl
import pytest
import torch

import dgl_oac
from dgl_oac.distributed import committer as dist_step_module
from dgl_oac.dgl_frontend.sampling.edge import EdgeBatchSampler

from conftest import power_law_graph
from dist_helpers import RankPool, two_rank_pool  # noqa: F401 - the fixture "pool": the module's 2 ranks
from helpers import loss_of

NODES, DIM = 100, 4



def _init(t: torch.Tensor) -> torch.Tensor:
    g = torch.Generator().manual_seed(5)
    return t.copy_(torch.rand(t.shape, generator=g) - 0.5)


def _train(rank: int, world: int, task: str, opt_name: str, mode: str, prefetch: int, control: str = ""):
    if control == "no-forwarding":
        dist_step_module.forward_parts = lambda table, owned, new, group: [
            torch.cat([dgl_oac.distributed.exchange.pack_ids(owned), new], 1)[:0] for _ in range(group.world)]
    g = power_law_graph(NODES, seed=1)
    emb = dgl_oac.NodeEmbedding(NODES, DIM, "table", init_func=_init)
    opt = getattr(dgl_oac.optim, opt_name)([emb], lr=0.05)
    if task == "node":
        sampler, indices = dgl.dataloading.NeighborSampler([4, 4]), torch.arange(NODES)
    else:
        sampler, indices = EdgeBatchSampler(num_negatives=3), torch.arange(g.num_edges())
    loader = dgl_oac.DataLoader(g, indices, sampler, embeddings=[emb], batch_size=8 if task == "node" else 40,
                                shuffle=True, seed=2, use_ddp=True, mode=mode, prefetch=prefetch,
                                background_priority="normal")
    losses = []
    for epoch in range(2):
        for i, batch in enumerate(loader):
            if control == "drop-log" and epoch == 1 and i == 3 and emb.pipeline.log.entries:
                emb.pipeline.log.entries.popleft()  # a step the next validations need, lost
            time.sleep(0.02)  # let the gather thread read the next batches now, before this step writes
            x = batch[-1][0].srcdata["table"] if task == "node" else batch[1].ndata["table"]
            loss = loss_of(x)
            loss.backward()
            opt.step()
            losses.append(loss.item())
    s = loader.stats
    return emb.weight.clone(), emb.optm_state.clone(), losses, s.rows_patched, s.rows_read


@pytest.mark.parametrize("task,opt_name", [("node", "SparseSGD"), ("node", "SparseAdagrad"), ("node", "SparseAdam"),
                                           ("edge", "SparseAdagrad")])
def test_oac_equals_sync(pool: RankPool, task: str, opt_name: str) -> None:
    sync = pool.run(_train, task, opt_name, "sync", 1)
    for prefetch in (1, 4):
        oac = pool.run(_train, task, opt_name, "oac", prefetch)
        for rank, (s, o) in enumerate(zip(sync, oac)):
            assert torch.equal(s[0], o[0]) and torch.equal(s[1], o[1]), f"rank {rank}, prefetch {prefetch}"
            assert s[2] == o[2], f"rank {rank}'s losses, prefetch {prefetch}"
            assert o[3] > 0.1 * o[4], f"rank {rank}: {o[3]} of {o[4]} rows patched at prefetch {prefetch}"


def test_without_forwarding_oac_differs(pool: RankPool) -> None:
    sync = pool.run(_train, "node", "SparseAdagrad", "sync", 1)
    broken = pool.run(_train, "node", "SparseAdagrad", "oac", 4, "no-forwarding")
    assert not torch.equal(sync[0][0], broken[0][0])


def test_a_missing_step_fails_validation_loudly(pool: RankPool) -> None:
    out = pool.run(_train, "node", "SparseAdagrad", "oac", 4, "drop-log", outcomes=True)
    assert not any(ok for ok, _ in out)
    assert any("OAC invariant broken" in why or "misses step" in why for _, why in out), out
