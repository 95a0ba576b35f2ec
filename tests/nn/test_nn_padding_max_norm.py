"""dgl_oac.nn.Embedding's padding_idx and max_norm against torch.nn.Embedding(sparse=True): the same initial
table, the same forward values, the same table and optimizer behaviour after training, bit for bit, read
directly or through a BatchLoader in sync and oac."""
from __future__ import annotations

import pytest
import torch

import dgl_oac

N, D = 40, 6


def batches(n=10, pad=None):
    gen = torch.Generator().manual_seed(4)
    out = []
    for _ in range(n):
        b = torch.randint(0, N, (3, 5), generator=gen)
        if pad is not None:
            b[:, -1] = pad  # every batch pads its last column, as a padded sequence batch does
        out.append(b)
    return out


def train(backend, data, mode=None, lr=0.05, **kw):
    """``backend``: "torch" (torch.nn.Embedding + torch.optim.SparseAdam) or "ours" (dgl_oac.nn's; ``mode``: read
    through a BatchLoader in that mode, else directly). Returns the table and each step's forward output."""
    torch.manual_seed(0)
    nn_, optim = (torch.nn, torch.optim) if backend == "torch" else (dgl_oac.nn, dgl_oac.nn)
    emb = nn_.Embedding(N, D, sparse=True, **kw)
    opt = optim.SparseAdam(emb.parameters(), lr=lr)
    loader = data if mode is None else dgl_oac.BatchLoader(data, ids={emb: lambda b: b}, mode=mode, prefetch=3,
                                                           seed=0)
    outs = []
    for b in loader:
        h = emb(b)
        outs.append(h.detach().clone())
        (h * torch.arange(1, D + 1)).sum().backward()
        opt.step()
        opt.zero_grad()
    if mode is not None:
        loader.close()
    return emb.weight.detach().clone(), outs


def train_torch(data, **kw):
    return train("torch", data, **kw)


def train_ours(data, mode=None, **kw):
    return train("ours", data, mode, **kw)


def same(a, b):
    (wa, oa), (wb, ob) = a, b
    return torch.equal(wa, wb) and len(oa) == len(ob) and all(torch.equal(x, y) for x, y in zip(oa, ob))


@pytest.mark.parametrize("mode", [None, "sync", "oac"])
@pytest.mark.parametrize("padding_idx", [0, 7, -1])
def test_padding_idx_trains_as_torch(mode, padding_idx):
    data = batches(pad=padding_idx % N)
    ref = train_torch(data, padding_idx=padding_idx)
    assert torch.equal(ref[0][padding_idx], torch.zeros(D))  # never trained, still torch's zero
    assert same(train_ours(data, mode, padding_idx=padding_idx), ref)


@pytest.mark.parametrize("mode", [None, "sync", "oac"])
@pytest.mark.parametrize("norm_type", [2.0, 1.0])
def test_max_norm_trains_as_torch(mode, norm_type):
    data = batches()
    ref = train_torch(data, lr=0.3, max_norm=1.5, norm_type=norm_type)
    assert same(train_ours(data, mode, lr=0.3, max_norm=1.5, norm_type=norm_type), ref)


def test_max_norm_and_padding_together():
    data = batches(pad=3)
    ref = train_torch(data, lr=0.3, max_norm=1.2, padding_idx=3)
    assert same(train_ours(data, "oac", lr=0.3, max_norm=1.2, padding_idx=3), ref)


def test_max_norm_rescales_rows_in_the_table_as_torch_does_without_training():
    torch.manual_seed(1)
    ref = torch.nn.Embedding(N, D, max_norm=0.5)
    torch.manual_seed(1)
    ours = dgl_oac.nn.Embedding(N, D, max_norm=0.5)
    ids = torch.tensor([1, 2, 2, 9])
    with torch.no_grad():
        assert torch.equal(ref(ids), ours(ids))
    assert torch.equal(ref.weight.detach(), ours.weight)


def test_from_pretrained_keeps_the_padding_row_and_freezes():
    table = torch.randn(N, D)
    ref = torch.nn.Embedding.from_pretrained(table, padding_idx=2)
    ours = dgl_oac.nn.Embedding.from_pretrained(table, padding_idx=2)
    assert torch.equal(ours.weight, table) and torch.equal(ref.weight.detach(), table)
    assert torch.equal(ours(torch.tensor([2, 5])), ref(torch.tensor([2, 5])))
    assert "padding_idx=2" in repr(ours)


def test_bad_options_name_what_is_wrong():
    with pytest.raises(ValueError, match="padding_idx must be within num_embeddings"):
        dgl_oac.nn.Embedding(N, D, padding_idx=N)
    with pytest.raises(ValueError, match="max_norm must be > 0"):
        dgl_oac.nn.Embedding(N, D, max_norm=0.0)
    with pytest.raises(NotImplementedError, match="scale_grad_by_freq"):
        dgl_oac.nn.Embedding(N, D, scale_grad_by_freq=True)
    with pytest.raises(TypeError, match="padding_idx=0"):
        dgl_oac.nn.Embedding(N, D, 0)  # torch's third positional is padding_idx; ours is sparse
