"""Hole 2 of issue 22: writes to a table go through a logged step, so oac stays equal to sync under them.

``emb.weight`` is a read-only view (a write there would bypass the clock and the write log: oac differed from
sync by 0.21 after a mid-epoch max-norm renormalisation); ``emb.write_rows(ids, values)`` is the supported
write, a step of its own."""
import copy
import io

import numpy as np
import pytest
import torch

import dgl_oac

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
    lambda w: w.view(-1).renorm_(2, 0, 1.0),
])
def test_writes_through_weight_are_refused_with_the_supported_way(make_emb, write):
    emb = make_emb(20, 4)
    before = emb.weight.clone()
    with pytest.raises(RuntimeError, match=r"read-only.*emb\.write_rows\(ids, values\)"):
        write(emb.weight)
    assert torch.equal(emb.weight, before)


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
