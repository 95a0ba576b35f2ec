"""DGL usage patterns a user copies, each done with dgl.nn.NodeEmbedding + dgl.optim and with dgl_oac:
reads outside a loader with and without grad, several tables in one model, exporting the whole table."""
import dgl
import pytest
import torch

import dgl_oac

from conftest import unique_name

N, D = 50, 6


def tables(backend, count, seed=0):
    gen = torch.Generator().manual_seed(seed)
    inits = [torch.randn(N, D, generator=gen) for _ in range(count)]
    make = dgl.nn.NodeEmbedding if backend == "dgl" else dgl_oac.NodeEmbedding
    return [make(N, D, unique_name(backend), init_func=lambda t, x=x: t.copy_(x)) for x in inits]


def train(backend, steps=12):
    """Two tables (say, one per relation type) in one model, one SparseAdam over both; each step reads a batch
    with grad (duplicates included), and an evaluation read under no_grad between steps."""
    embs = tables(backend, 2)
    opt = (dgl.optim.SparseAdam if backend == "dgl" else dgl_oac.SparseAdam)(embs, lr=0.05)
    gen = torch.Generator().manual_seed(1)
    evals = []
    for _ in range(steps):
        ids = [torch.randint(0, N, (15,), generator=gen) for _ in embs]
        loss = (embs[0](ids[0]) * embs[1](ids[1])).sum() + embs[0](ids[0]).square().sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        with torch.no_grad():
            read = embs[1](torch.arange(N))
            evals.append(read.clone())
            assert not read.requires_grad
    return [e.weight.clone() for e in embs], evals


def test_several_tables_and_no_grad_reads_match_dgl():
    (ref, ref_evals), (ours, our_evals) = train("dgl"), train("oac")
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
    for a, b in zip(our_evals, ref_evals):  # an evaluation read between steps sees the same table as DGL's
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)


@pytest.mark.parametrize("backend", ["dgl", "oac"])
def test_reads_outside_a_loader_with_and_without_grad(backend):
    (emb,) = tables(backend, 1)
    ids = torch.tensor([3, 1, 3])
    with torch.no_grad():
        plain = emb(ids)
    assert not plain.requires_grad and torch.equal(plain, emb.weight[ids])
    tracked = emb(ids)
    assert tracked.requires_grad and torch.equal(tracked.detach(), plain)


def test_exported_table_is_a_cpu_tensor_of_every_row_like_dgls():
    (ref,), (ours,) = tables("dgl", 1), tables("oac", 1)
    for emb in (ref, ours):
        w = emb.weight
        assert w.shape == (N, D) and w.device.type == "cpu" and w.dtype == torch.float32
    assert torch.equal(ref.weight, ours.weight)
    assert torch.equal(ours.state_dict()["weight"], ours.weight)
