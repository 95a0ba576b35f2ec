"""What DGL 1.1.3's own optimizer tests (``tests/python/pytorch/optim/test_optim.py``) do, in our words, on
dgl-oac's drop-in: a DGL user's first lines must keep working, and a change that breaks them fails CI.

Each test initialises the table as those tests do, ``torch.nn.init.uniform_(emb.weight, 0, 1.0)`` after the same
seed as a ``torch.nn.Embedding(sparse=True)``, takes one step of ``SparseAdam``/``SparseAdagrad`` on 4 random rows
(repeats allowed) under a cross-entropy loss, and compares the whole table with torch's sparse optimizer's, with
DGL's tolerance (``rtol = atol = 1e-4``): embedding widths 1, 4, 101 and 1024, Adam's state in float32 and
float16, ``use_uva`` given, a second table that gets no gradient, and two trainers (gloo) against torch's
DistributedDataParallel. (One step: torch's SparseAdam counts steps per optimizer, DGL's and ours per row.)
"""
from __future__ import annotations

import itertools
from typing import Any, Dict

import pytest
import torch

import dgl_oac
from dist_helpers import two_rank_pool  # noqa: F401 - the fixture "pool": the module's 2 ranks

NUM, DIMS = 10, (1, 4, 101, 1024)
TOL = dict(rtol=1e-4, atol=1e-4)  # DGL's tests' F.allclose
_names = itertools.count()


def one_step(emb_dim: int, make_opt: Any, make_torch_opt: Any, label: int = 0, zero_table: bool = False,
             device: torch.device = torch.device("cpu")) -> Dict[str, torch.Tensor]:
    """One step of dgl-oac and of torch on the same rows from the same initial table; both tables after it."""
    emb = dgl_oac.NodeEmbedding(NUM, emb_dim, f"dgl_port_{next(_names)}")
    ref = torch.nn.Embedding(NUM, emb_dim, sparse=True)
    tables = [emb]
    refs = [ref]
    if zero_table:  # a second table in the same optimizer that gets no gradient
        tables.append(dgl_oac.NodeEmbedding(NUM, emb_dim, f"dgl_port_{next(_names)}"))
        refs.append(torch.nn.Embedding(NUM, emb_dim, sparse=True))
    try:
        torch.manual_seed(0)
        for r in refs:
            torch.nn.init.uniform_(r.weight, 0, 1.0)
        torch.manual_seed(0)
        for t in tables:
            torch.nn.init.uniform_(t.weight, 0, 1.0)  # the line that has to work
        opt = make_opt(tables)
        torch_opt = make_torch_opt([p for r in refs for p in r.parameters()])
        ids = torch.randint(0, NUM, (4,))
        labels = torch.full((4,), label, dtype=torch.long)
        opt.zero_grad()
        torch_opt.zero_grad()
        torch.nn.functional.cross_entropy(emb(ids, device).cpu(), labels).backward()
        torch.nn.functional.cross_entropy(ref(ids), labels).backward()
        opt.step()
        torch_opt.step()
        return {"ours": emb.weight.clone(), "torch": ref.weight.detach().clone(),
                "ours_zero": tables[-1].weight.clone(), "torch_zero": refs[-1].weight.detach().clone()}
    finally:
        for t in tables:
            t.close()


def assert_close(got: Dict[str, torch.Tensor], zero_table: bool = False) -> None:
    assert torch.allclose(got["ours"], got["torch"], **TOL)
    if zero_table:
        assert torch.allclose(got["ours_zero"], got["torch_zero"], **TOL)


def adam(**kw: Any) -> Any:
    return lambda tables: dgl_oac.SparseAdam(params=tables, lr=0.01, **kw)


def torch_adam(params: Any) -> torch.optim.Optimizer:
    return torch.optim.SparseAdam(params, lr=0.01)


@pytest.mark.parametrize("emb_dim", DIMS)
def test_sparse_adam_after_torch_init_matches_torchs(emb_dim):
    assert_close(one_step(emb_dim, adam(), torch_adam))


@pytest.mark.parametrize("emb_dim", DIMS)
@pytest.mark.parametrize("use_uva", [False, None, True])
def test_sparse_adam_with_use_uva_given_matches_torchs(emb_dim, use_uva):
    if use_uva and not torch.cuda.is_available():
        pytest.skip("UVA needs a GPU (as in DGL's test)")
    device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    assert_close(one_step(emb_dim, adam(use_uva=use_uva), torch_adam, device=device))


@pytest.mark.parametrize("emb_dim", DIMS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_sparse_adam_state_dtype_matches_torchs(emb_dim, dtype):
    assert_close(one_step(emb_dim, adam(dtype=dtype), torch_adam))


def test_sparse_adam_leaves_a_table_without_gradient_as_torch_does():
    got = one_step(4, adam(), torch_adam, label=1, zero_table=True)
    assert_close(got, zero_table=True)


@pytest.mark.parametrize("emb_dim", DIMS)
def test_sparse_adagrad_after_torch_init_matches_torchs(emb_dim):
    got = one_step(emb_dim, lambda tables: dgl_oac.SparseAdagrad(params=tables, lr=0.01),
                   lambda params: torch.optim.Adagrad(params, lr=0.01))
    assert_close(got)


def _adam_rank(rank: int, world: int, which: str) -> torch.Tensor:
    """One rank of DGL's multiprocess CPU test: the table set from one seeded init on every rank, then one
    SparseAdam step on 4 rows of this rank's own block; the whole table after it."""
    num, dim = 128, 10
    init = torch.empty(num, dim)
    torch.manual_seed(0)
    torch.nn.init.uniform_(init, -1.0, 1.0)
    torch.manual_seed(rank)
    lo = num // world * rank
    ids = torch.randint(lo, lo + num // world, (4,))
    labels = torch.ones(4, dtype=torch.long)
    if which == "torch":
        ref = torch.nn.Embedding(num, dim, sparse=True)
        ref.weight.data.copy_(init)
        ddp = torch.nn.parallel.DistributedDataParallel(ref)
        opt = torch.optim.SparseAdam(list(ref.parameters()), lr=0.01)
        torch.nn.functional.cross_entropy(ddp(ids), labels).backward()
        opt.step()
        return ref.weight.detach().clone()
    emb = dgl_oac.NodeEmbedding(num, dim, "dgl_port_mp", init_func=lambda t: t.uniform_(-1.0, 1.0))
    emb.all_set_embedding(init)
    unused = dgl_oac.NodeEmbedding(num, dim, "dgl_port_mp_zero", init_func=lambda t: t.uniform_(-1.0, 1.0))
    opt = dgl_oac.SparseAdam(params=[emb, unused], lr=0.01)
    try:
        torch.nn.functional.cross_entropy(emb(ids, torch.device("cpu")), labels).backward()
        opt.step()
        return emb.all_get_embedding().clone()
    finally:
        emb.close()
        unused.close()


def test_two_trainers_match_torchs_distributed_sparse_adam(pool):
    ours = pool.run(_adam_rank, "ours")
    theirs = pool.run(_adam_rank, "torch")
    assert torch.allclose(ours[0], theirs[0], **TOL) and torch.equal(ours[0], ours[1])
