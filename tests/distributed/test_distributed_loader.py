"""``DataLoader(..., use_ddp=True)`` on 2 gloo ranks: DGL's split, and a sync epoch over distributed tables."""
from __future__ import annotations

import dgl
import pytest
import torch

import dgl_oac

from conftest import power_law_graph
from dist_helpers import RankPool, two_rank_pool  # noqa: F401 - the fixture "pool": the module's 2 ranks
from helpers import loss_of

N_IDS = 23  # odd: the second rank's block is padded



def _epochs(rank: int, world: int, drop_last: bool):
    g = power_law_graph(60)
    indices = torch.arange(100, 100 - N_IDS, -1) % 60  # not sorted: blocks are by position, not by value
    loader = dgl_oac.DataLoader(g, indices, dgl.dataloading.NeighborSampler([2]), batch_size=4, shuffle=True,
                                drop_last=drop_last, seed=3, use_ddp=True, mode="sync")
    return len(loader), [torch.cat([out for _, out, _ in loader]) for _ in range(2)], indices


@pytest.mark.parametrize("drop_last", [False, True])
def test_use_ddp_splits_like_dgl(pool: RankPool, drop_last: bool) -> None:
    (n0, e0, indices), (n1, e1, _) = pool.run(_epochs, drop_last)
    assert n0 == n1, "every rank takes the same number of steps"
    per_rank = N_IDS // 2 if drop_last else (N_IDS + 1) // 2
    blocks = [indices[:per_rank], indices[per_rank:2 * per_rank]]
    for epochs, block in ((e0, blocks[0]), (e1, blocks[1])):
        for seen in epochs:
            if drop_last:  # whole batches only: no padding, each index of the block at most once
                assert seen.numel() == per_rank // 4 * 4
                assert torch.isin(seen, block).all() and seen.unique().numel() == seen.numel()
            else:  # the block, each index once, then its own first indices as padding
                assert seen.numel() == per_rank
                real = seen[: block.numel()]
                assert torch.equal(real.sort().values, block.sort().values)
                assert torch.equal(seen[block.numel():], real[: per_rank - block.numel()])
        assert not torch.equal(epochs[0], epochs[1]), "reshuffled every epoch"
    if not drop_last:
        assert torch.equal(torch.cat([blocks[0], blocks[1]]).sort().values, indices.sort().values)
        assert torch.equal(e1[1][-1:], e1[1][:1]), "the short block is padded with its own first index"


def _train(rank: int, world: int):
    g = power_law_graph(80)
    emb = dgl_oac.NodeEmbedding(80, 4, "ddp", init_func=lambda t: t.fill_(0.1))
    opt = dgl_oac.optim.SparseAdagrad([emb], lr=0.1)
    loader = dgl_oac.DataLoader(g, torch.arange(80), dgl.dataloading.NeighborSampler([3, 3]), embeddings=[emb],
                                batch_size=8, shuffle=True, seed=1, use_ddp=True, mode="sync")
    losses = []
    for _, _, blocks in loader:
        loss = loss_of(blocks[0].srcdata["ddp"])
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return emb.weight.clone(), emb.optm_state.clone(), losses


def test_sync_epoch_over_ranks(pool: RankPool) -> None:
    first = pool.run(_train)
    again = pool.run(_train)
    assert torch.equal(first[0][0], first[1][0]) and torch.equal(first[0][1], first[1][1])
    assert len(first[0][2]) == len(first[1][2]) == 5
    assert first[0][2] != first[1][2], "the ranks trained on different batches"
    for (w, s, losses), (w2, s2, losses2) in zip(first, again):
        assert torch.equal(w, w2) and torch.equal(s, s2) and losses == losses2


def test_use_ddp_needs_a_process_group() -> None:
    with pytest.raises(RuntimeError, match="init_process_group"):
        dgl_oac.DataLoader(power_law_graph(20), torch.arange(20), dgl.dataloading.NeighborSampler([2]),
                           use_ddp=True)
