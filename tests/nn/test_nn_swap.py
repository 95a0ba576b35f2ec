"""dgl_oac.nn.swap_embeddings on PyG-shaped models: an embedding as an attribute, in a ModuleDict, shared
between two modules; the tables kept (values, padding_idx, max_norm, a frozen weight), no random draw, what
cannot be carried refused before anything changes, and training after the swap equal to torch's."""
from __future__ import annotations

import pytest
import torch
from torch import nn

import dgl_oac
from dgl_oac.nn import swap_embeddings

N, D = 50, 8


class Walker(nn.Module):
    """Node2Vec's shape: one sparse embedding as an attribute, read by index and through .weight."""

    def __init__(self):
        super().__init__()
        self.embedding = nn.Embedding(N, D, sparse=True)
        self.proj = nn.Linear(D, 1)

    def forward(self, ids):
        return self.proj(self.embedding(ids)).sum()


class Typed(nn.Module):
    """A heterogeneous model: embeddings in a ModuleDict, one shared with a second module."""

    def __init__(self):
        super().__init__()
        self.tables = nn.ModuleDict({"user": nn.Embedding(N, D, sparse=True, padding_idx=0),
                                     "item": nn.Embedding(N + 5, D, sparse=True, max_norm=1.0)})
        self.tower = nn.Sequential(nn.Linear(D, D))
        self.tower.add_module("shared", self.tables["user"])
        self.frozen = nn.Embedding(7, D, sparse=True)
        self.frozen.weight.requires_grad_(False)


def test_an_attribute_is_swapped_with_its_values():
    torch.manual_seed(0)
    model = Walker()
    before = model.embedding.weight.detach().clone()
    state = torch.get_rng_state()
    swapped = swap_embeddings(model)
    assert torch.equal(torch.get_rng_state(), state)  # no random draw
    assert list(swapped) == ["embedding"] and model.embedding is swapped["embedding"]
    assert isinstance(model.embedding, dgl_oac.nn.Embedding) and model.embedding.name == "embedding"
    assert torch.equal(model.embedding.weight, before) and not model.embedding.freeze


def test_a_module_dict_and_a_shared_table():
    torch.manual_seed(0)
    model = Typed()
    user = model.tables["user"].weight.detach().clone()
    swapped = swap_embeddings(model)
    assert sorted(swapped) == ["frozen", "tables.item", "tables.user"]
    assert model.tower.shared is model.tables["user"] is swapped["tables.user"]  # one table, both places
    assert torch.equal(model.tables["user"].weight, user)
    assert model.tables["user"].padding_idx == 0 and model.tables["item"].max_norm == 1.0
    assert model.frozen.freeze and not model.tables["item"].freeze
    assert swap_embeddings(model) == {}  # nothing left to swap


def test_training_after_the_swap_equals_torchs():
    """Unique ids per step (a row read once: the bits are torch's; rows read 4+ times in a step may differ in the
    last bits, the order torch sums their gradients in)."""
    def run(swap):
        torch.manual_seed(0)
        model = Walker()
        if swap:
            tables = swap_embeddings(model)
            sparse = dgl_oac.nn.SparseAdam(list(tables.values()), lr=0.05)
            dense = torch.optim.Adam(dgl_oac.nn.dense_parameters(model), lr=0.01)
        else:
            sparse = torch.optim.SparseAdam([model.embedding.weight], lr=0.05)
            dense = torch.optim.Adam(model.proj.parameters(), lr=0.01)
        gen = torch.Generator().manual_seed(1)
        for _ in range(15):
            model(torch.randperm(N, generator=gen)[:12]).backward()
            sparse.step()
            dense.step()
            sparse.zero_grad()
            dense.zero_grad()
        return model.embedding.weight.detach().clone(), model.proj.weight.detach().clone()

    (a, pa), (b, pb) = run(False), run(True)
    assert torch.equal(a, b) and torch.equal(pa, pb)


@pytest.mark.parametrize("bad, error, match", [
    (lambda: nn.Sequential(nn.EmbeddingBag(N, D)), TypeError, "0 is a torch.nn.EmbeddingBag"),
    (lambda: nn.Sequential(nn.Embedding(N, D)), ValueError, "0 has sparse=False"),
    (lambda: nn.Sequential(nn.Embedding(N, D, sparse=True, scale_grad_by_freq=True)), NotImplementedError,
     "scale_grad_by_freq"),
    (lambda: nn.Sequential(nn.Embedding(N, D, sparse=True).double()), ValueError, "torch.float64 rows"),
    (lambda: nn.Embedding(N, D, sparse=True), TypeError, "got the Embedding itself"),
])
def test_refusals_name_the_module_and_change_nothing(bad, error, match):
    model = bad()
    kept = list(model.modules())
    with pytest.raises(error, match=match):
        swap_embeddings(model)
    assert list(model.modules()) == kept


def test_a_subclass_is_refused_before_anything_is_swapped():
    class Scaled(nn.Embedding):
        def forward(self, ids):
            return 2 * super().forward(ids)

    model = nn.ModuleDict({"a": nn.Embedding(N, D, sparse=True), "b": Scaled(N, D, sparse=True)})
    with pytest.raises(TypeError, match="b is a Scaled, a subclass of torch.nn.Embedding"):
        swap_embeddings(model)
    assert type(model["a"]) is nn.Embedding  # the valid one was not swapped either
