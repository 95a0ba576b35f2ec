"""DGL 1.1.3's multi-process optimizer tests, as behaviours, against dgl_oac (2 and 4 spawned gloo ranks).

What ``dgl/tests/python/pytorch/optim/test_optim.py::test_multiprocess_cpu_sparse_adam`` (and its zero-step
variant) relies on: every rank builds ``NodeEmbedding(n, dim, name, init_func)`` after ``init_process_group``;
``all_set_embedding``/``all_get_embedding``; two tables under one ``SparseAdam``, one never read; each rank
reads its own rows with ``emb(idx, device)``, ``zero_grad``, ``backward``, ``step``; the table then equals
``torch.optim.SparseAdam`` over DDP-averaged gradients, and rows read after the step differ from before it.
Plus: a rank with an empty batch still calls ``step()``; every rank sees the whole table.
"""
from __future__ import annotations

import pytest
import torch

import dgl_oac

from dist_helpers import RankPool

NUM, DIM = 128, 10


def _init(t: torch.Tensor) -> torch.Tensor:
    torch.manual_seed(0)
    return t.uniform_(-1.0, 1.0)


def _ids(rank: int, world: int, empty_rank: int) -> torch.Tensor:
    if rank == empty_rank:
        return torch.empty(0, dtype=torch.int64)
    g = torch.Generator().manual_seed(rank)
    lo = NUM // world * rank
    return torch.randint(lo, lo + NUM // world, (4,), generator=g)


def _dgl_program(rank: int, world: int, empty_rank: int):
    start = torch.empty(NUM, DIM)
    _init(start)
    emb = dgl_oac.NodeEmbedding(NUM, DIM, "test", init_func=_init, device="cpu")
    emb.all_set_embedding(start)
    zero = dgl_oac.NodeEmbedding(NUM, DIM, "zero", init_func=_init, device="cpu")
    opt = dgl_oac.optim.SparseAdam([emb, zero], lr=0.01)
    assert (emb.rank, emb.world_size) == (rank, world)
    idx = _ids(rank, world, empty_rank)
    value = emb(idx, torch.device("cpu"))
    loss = torch.nn.functional.cross_entropy(value, torch.ones(idx.numel(), dtype=torch.int64)) \
        if idx.numel() else value.sum()
    opt.zero_grad()
    loss.backward()
    opt.step()
    torch.distributed.barrier()
    after = emb(idx, torch.device("cpu")).detach()
    changed = bool((after != value.detach()).any(1).all()) if idx.numel() else None
    return emb.all_get_embedding().clone(), zero.weight.clone(), changed


def _torch_reference(world: int, empty_rank: int) -> torch.Tensor:
    """torch.optim.SparseAdam with DDP's gradient (the mean over ranks of each rank's gradient)."""
    ref = torch.nn.Embedding(NUM, DIM, sparse=True)
    torch.manual_seed(0)
    torch.nn.init.uniform_(ref.weight, -1.0, 1.0)
    opt = torch.optim.SparseAdam(list(ref.parameters()), lr=0.01)
    loss = 0
    for r in range(world):
        idx = _ids(r, world, empty_rank)
        if idx.numel():
            loss = loss + torch.nn.functional.cross_entropy(ref(idx), torch.ones(4, dtype=torch.int64)) / world
    loss.backward()
    opt.step()
    return ref.weight.detach()


@pytest.fixture(scope="module", params=[2, 4])
def pool(request):
    p = RankPool(request.param)
    yield p
    p.close(grace=5.0)


@pytest.mark.parametrize("empty", [False, True])
def test_multiprocess_sparse_adam_matches_torch(pool: RankPool, empty: bool) -> None:
    world = pool.world
    empty_rank = world - 1 if empty else -1
    results = pool.run(_dgl_program, empty_rank)
    start = _init(torch.empty(NUM, DIM))
    expected = _torch_reference(world, empty_rank)
    for weight, zero, changed in results:
        assert torch.equal(weight, results[0][0]), "every rank sees the same whole table"
        assert torch.allclose(weight, expected, atol=1e-6)
        assert not torch.equal(weight, start)
        assert torch.equal(zero, start), "a table no rank read is untouched by step()"
        assert changed in (True, None), "rows read after the step differ from the rows read before it"
