"""Writes to a table go through a logged step, so oac stays equal to sync under them.

A raw write into the table's memory would bypass the clock and the write log (oac differed from sync by 0.21
after a mid-epoch max-norm renormalisation). ``emb.write_rows(ids, values)`` is a step of its own; and
``NodeEmbedding.weight`` and ``optm_state`` (DGL's drop-in) and ``dgl_oac.nn.Embedding.weight`` (torch's) take
torch's own writes, every ``torch.nn.init`` function and the ``.data`` and indexing idioms, each as such a step,
with the values those writes give on a plain tensor. Only reshaping in place is refused."""
import copy
import io
import itertools

import numpy as np
import pytest
import torch

import dgl_oac
import dgl_oac.nn as oac_nn

from conftest import power_law_graph
from helpers import assert_same, loss_of, node_loader, snapshot

pytestmark = pytest.mark.hang_timeout(120)
MAX_NORM = 1.0


def renorm_training(make_emb, mode, priority, every=1):
    """TransE-style: after each step, the rows just trained are renormalised to norm <= MAX_NORM (mid-epoch,
    while the gather thread reads the next batches ahead). Two epochs; returns the snapshot."""
    graph = power_law_graph(400, seed=2)
    emb = make_emb(graph.num_nodes(), 8, init=3)
    opt = dgl_oac.SparseAdagrad([emb], lr=0.3)
    loader = node_loader(graph, emb, mode, background_priority=priority)
    for _ in range(2):
        for i, (input_nodes, _, blocks) in enumerate(loader):
            loss_of(blocks[0].srcdata[emb.name] * 3).backward()
            opt.step()
            if i % every == 0:
                with torch.no_grad():
                    emb.write_rows(input_nodes, emb.weight[input_nodes].renorm(2, 0, MAX_NORM))
    return snapshot(emb)


@pytest.mark.parametrize("priority", ["normal", "idle"])
def test_mid_epoch_renormalisation_oac_equals_sync(make_emb, priority):
    sync = renorm_training(make_emb, "sync", priority)
    oac = renorm_training(make_emb, "oac", priority)
    assert_same(sync, oac)
    assert float(oac[0].norm(dim=1).max()) <= MAX_NORM * (1 + 1e-5)  # the constraint held where it was applied


def test_write_rows_sets_values_and_keeps_state(make_emb):
    emb = make_emb(50, 4)
    opt = dgl_oac.SparseAdagrad([emb], lr=0.1)
    ids = torch.arange(10)
    loss_of(emb(ids)).backward()
    opt.step()
    state = emb.optm_state.clone()
    ids2 = torch.tensor([7, 3, 40])
    new = torch.arange(12, dtype=torch.float32).view(3, 4)
    emb.write_rows(ids2, new)
    assert torch.equal(emb.weight[ids2], new)
    assert torch.equal(emb.optm_state, state)
    assert emb.pipeline.steps == 2  # a step of its own


@pytest.mark.parametrize("write", [
    lambda w: w.__setitem__(0, 1.0),
    lambda w: w[3:5].mul_(2.0),
    lambda w: w.data.zero_(),
    lambda w: w.detach().add_(1.0),
    lambda w: w.index_copy_(0, torch.tensor([1]), torch.ones(1, 4)),
    lambda w: torch.add(w, 1.0, out=w),
    lambda w: w.view(-1)[5:9].mul_(2.0),
    lambda w: torch.nn.init.uniform_(w, 0, 1.0),  # DGL's own tests initialise so (torch.nn.init: tensor=)
    lambda w: torch.nn.init.kaiming_uniform_(w),
    lambda w: setattr(w, "data", torch.zeros(20, 4)),
])
def test_writes_through_node_embedding_weight_give_a_plain_tensors_values_as_logged_steps(make_emb, write):
    """Regression: DGL 1.1.3's optimizer tests start with torch.nn.init.uniform_(dgl_emb.weight, 0, 1.0), and
    NodeEmbedding.weight refused it (21 of their 25 failed)."""
    emb = make_emb(20, 4)
    want = emb.weight.clone()
    torch.manual_seed(4)
    with torch.no_grad():
        write(want)
    torch.manual_seed(4)
    with torch.no_grad():
        write(emb.weight)
    assert torch.equal(emb.weight, want) and emb.pipeline.steps == 1


def test_node_embedding_optm_state_writes_are_logged_steps_that_keep_the_values(make_emb):
    emb = make_emb(20, 4)
    opt = dgl_oac.SparseAdagrad([emb], lr=0.1)
    loss_of(emb(torch.arange(8))).backward()
    opt.step()
    values, want = emb.weight.clone(), emb.optm_state.clone()
    want[2:5] = 0.0
    want[:, 1].fill_(3.0)
    emb.optm_state[2:5] = 0.0
    emb.optm_state[:, 1].fill_(3.0)
    assert torch.equal(emb.optm_state, want) and torch.equal(emb.weight, values)
    assert emb.pipeline.steps == 3


@pytest.mark.parametrize("write", [lambda w: w.t_(), lambda w: w.resize_(10, 4), lambda w: w.squeeze_(),
                                   lambda w: setattr(w, "data", torch.zeros(3, 4))])
def test_node_embedding_weight_refuses_reshaping_and_a_wrong_shape(make_emb, write):
    emb = make_emb(20, 4)
    before = emb.weight.clone()
    with pytest.raises(RuntimeError, match=r"read-only|must be a tensor of shape \(20, 4\)"):
        write(emb.weight)
    assert torch.equal(emb.weight, before) and emb.pipeline.steps == 0


def dgl_style_writes_training(make_emb, mode):
    """A DGL loop that writes emb.weight and emb.optm_state itself, mid-epoch with batches read ahead: the rows
    just trained renormalised, one table-wide torch.nn.init, a reset of some rows' Adagrad state."""
    graph = power_law_graph(400, seed=2)
    emb = make_emb(graph.num_nodes(), 8, init=3)
    torch.manual_seed(0)
    torch.nn.init.uniform_(emb.weight, -1.0, 1.0)
    opt = dgl_oac.SparseAdagrad([emb], lr=0.3)
    loader = node_loader(graph, emb, mode, background_priority="normal")
    for epoch in range(2):
        for i, (input_nodes, _, blocks) in enumerate(loader):
            loss_of(blocks[0].srcdata[emb.name] * 3).backward()
            opt.step()
            with torch.no_grad():
                emb.weight[input_nodes] = emb.weight[input_nodes].renorm(2, 0, MAX_NORM)
                if i == 3 and epoch == 1:
                    torch.nn.init.normal_(emb.weight, 0.0, 0.3)
                if i == 5:
                    emb.optm_state[input_nodes[:7]] = 0.0
    return snapshot(emb)


def test_dgl_style_weight_and_state_writes_mid_epoch_keep_oac_equal_to_sync(make_emb):
    torch.manual_seed(0)
    sync = dgl_style_writes_training(make_emb, "sync")
    oac = dgl_style_writes_training(make_emb, "oac")
    assert_same(sync, oac)


def test_reads_of_weight_are_plain_tensors(make_emb):
    emb = make_emb(20, 4)
    w = emb.weight
    picked = w[torch.tensor([1, 2])]
    assert type(picked) is torch.Tensor and type(w.clone()) is torch.Tensor and type(w * 2) is torch.Tensor
    picked.add_(1.0)  # a copy is the caller's to change
    assert torch.equal(w.norm(dim=1), emb.weight.clone().norm(dim=1)) and w.shape == (20, 4)
    arr = w.numpy()
    assert not arr.flags.writeable and not np.asarray(w).flags.writeable
    assert np.array_equal(arr, before := emb.weight.clone().numpy())
    best = copy.deepcopy(w)  # a copy is the caller's own
    assert type(best) is torch.Tensor and torch.equal(best, w)
    best.zero_()
    buf = io.BytesIO()
    torch.save(w, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=True)
    assert type(loaded) is torch.Tensor and torch.equal(loaded, torch.from_numpy(before))


@pytest.mark.parametrize("ids, values, msg", [
    (torch.tensor([1, 1]), torch.zeros(2, 4), "repeat a row"),
    (torch.tensor([1, 2]), torch.zeros(2, 3), r"shape \(2, 4\)"),
    (torch.tensor([99]), torch.zeros(1, 4), "out of range"),
])
def test_write_rows_bad_input(make_emb, ids, values, msg):
    emb = make_emb(20, 4)
    with pytest.raises((ValueError, IndexError), match=msg):
        emb.write_rows(ids, values)


# --- the torch drop-in's weight: torch.nn.init and .data writes, each a logged step (issue 38) ------------------
N, D = 40, 6
INIT = torch.nn.init
WRITES = {
    "uniform_": lambda w: INIT.uniform_(w, -0.3, 0.3), "normal_": lambda w: INIT.normal_(w, 0.1, 0.2),
    "constant_": lambda w: INIT.constant_(w, 0.5), "ones_": INIT.ones_, "zeros_": INIT.zeros_, "eye_": INIT.eye_,
    "xavier_uniform_": INIT.xavier_uniform_, "xavier_normal_": INIT.xavier_normal_,
    "kaiming_uniform_": INIT.kaiming_uniform_, "kaiming_normal_": INIT.kaiming_normal_,
    "trunc_normal_": INIT.trunc_normal_, "trunc_normal_ (rejection)": lambda w: INIT.trunc_normal_(w, a=-0.1, b=0.1),
    "orthogonal_": lambda w: INIT.orthogonal_(w, gain=2.0), "sparse_": lambda w: INIT.sparse_(w, 0.3),
    "data.uniform_()": lambda w: w.data.uniform_(),
    "data.copy_(t)": lambda w: w.data.copy_(torch.arange(N * D, dtype=torch.float32).view(N, D)),
    "fill_": lambda w: w.fill_(2.0), "data[idx] = x": lambda w: w.data.__setitem__(torch.tensor([3, 7]), 9.0),
    "data = t": lambda w: setattr(w, "data", torch.full((N, D), 4.0)),
    "slice mul_": lambda w: w[2:5].mul_(3.0), "column zero_": lambda w: w[:, 1].zero_(),
    "transposed row": lambda w: w.t()[1].fill_(7.0), "w[ids] += x": lambda w: w.__setitem__(
        torch.tensor([0, 39]), w[torch.tensor([0, 39])] + 1.0),
}
#: torch.nn.init functions that do not apply to a 2-D table (torch raises the same error on its own weight)
NOT_2D = {"dirac_": INIT.dirac_}
_names = itertools.count()


def _drop_in(seed: int = 0) -> "oac_nn.Embedding":
    torch.manual_seed(seed)
    return oac_nn.Embedding(N, D, name=f"weight_writes_{next(_names)}")


@pytest.mark.parametrize("name", list(WRITES))
def test_torch_writes_on_the_drop_in_give_torchs_values(name):
    """Before training: each write gives bitwise the values it gives on torch.nn.Embedding's weight after the
    same seed (the same random draws), returns what torch returns, and is a logged step of the table."""
    torch.manual_seed(0)
    ref = torch.nn.Embedding(N, D, sparse=True)
    with torch.no_grad():
        want = WRITES[name](ref.weight)
    emb = _drop_in(0)
    try:
        weight = emb.weight
        with torch.no_grad():
            got = WRITES[name](weight)
        assert torch.equal(emb.weight, ref.weight.detach())
        assert torch.equal(weight, ref.weight.detach())  # the object written holds the new values
        assert (got is weight) == (want is ref.weight) and (got is None) == (want is None)
        assert emb.node_embedding.pipeline.steps >= 1  # a logged step of the table, not a raw write
    finally:
        emb.node_embedding.close()


def test_init_functions_that_need_more_dimensions_fail_as_on_torch():
    emb = _drop_in()
    try:
        for init in NOT_2D.values():
            with pytest.raises(ValueError) as ours:
                init(emb.weight)
            with pytest.raises(ValueError) as torchs:
                init(torch.empty(N, D))
            assert str(ours.value) == str(torchs.value)
    finally:
        emb.node_embedding.close()


def _train_with_writes(mode: str) -> tuple:
    """The drop-in trained through a BatchLoader (oac: 3 batches read ahead) while torch.nn.init and .data write
    the table mid-epoch, between steps, with reads in flight; returns (values, optimizer state, max in flight)."""
    gen = torch.Generator().manual_seed(5)
    batches = [torch.randint(0, N, (16,), generator=gen) for _ in range(24)]  # overlapping, duplicated ids
    emb = _drop_in(1)
    INIT.xavier_uniform_(emb.weight)  # before training
    opt = oac_nn.Adagrad(emb.parameters(), lr=0.3)
    loader = dgl_oac.BatchLoader(batches, ids={emb: lambda b: b}, mode=mode, prefetch=3, seed=2)
    torch.manual_seed(9)  # the mid-training writes draw from torch's generator, as a user's would
    try:
        for epoch in range(2):
            for i, ids in enumerate(loader):
                (emb(ids) ** 2).sum().backward()
                opt.step()
                opt.zero_grad()
                with torch.no_grad():
                    if i == 5:
                        INIT.normal_(emb.weight, 0.0, 0.5)
                    elif i == 9:
                        emb.weight.data[ids] = emb.weight[ids].renorm(2, 0, 0.5)
                    elif i == 13:
                        emb.weight[::3].data.uniform_(-1.0, 1.0)
                    elif i == 17 and epoch == 1:
                        INIT.orthogonal_(emb.weight)
        return emb.weight.clone(), emb.node_embedding.optm_state.clone(), loader.stats.max_in_flight
    finally:
        emb.node_embedding.close()


def test_torch_writes_during_training_keep_oac_equal_to_sync():
    sync_values, sync_state, _ = _train_with_writes("sync")
    oac_values, oac_state, in_flight = _train_with_writes("oac")
    assert in_flight >= 1  # the writes met batches read ahead
    assert_same((sync_values, sync_state), (oac_values, oac_state))


def test_drop_in_refuses_reshaping_in_place_and_bad_data_assignment():
    emb = _drop_in()
    try:
        before = emb.weight.clone()
        with pytest.raises(RuntimeError, match="read-only"):
            emb.weight.t_()
        with pytest.raises(RuntimeError, match=r"x must be a tensor of shape \(40, 6\), got \(3, 6\)"):
            emb.weight.data = torch.zeros(3, 6)
        assert torch.equal(emb.weight, before) and emb.node_embedding.pipeline.steps == 0
    finally:
        emb.node_embedding.close()
