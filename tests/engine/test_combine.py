"""dgl_oac.engine.step: a step's reads of one table become one gradient per row, DGL's per-occurrence mean."""
from __future__ import annotations

import weakref

import pytest
import torch

from dgl_oac.device import rows as device_rows
from dgl_oac.device.rows import occurrences, segment_add_
from dgl_oac.engine.pipeline import BatchState, HandedOut, Read, TableRows
from dgl_oac.engine.step import combine, mean_


def batch(ids, width=3, seed=0):
    ids = torch.tensor(ids)
    rows = torch.randn(ids.numel(), width, generator=torch.Generator().manual_seed(seed))
    return HandedOut(TableRows(ids, ids, rows, None), "sync", True, BatchState(None))


def with_grad(t):
    leaf = t.clone().requires_grad_(True)
    leaf.grad = torch.randint(-8, 8, t.shape, generator=torch.Generator().manual_seed(t.numel())).float()
    return leaf  # small integers: every sum below is exact


def add_read(b, pos, whole=False, dim=2):
    leaf = with_grad(torch.zeros(len(pos), dim))
    b.state.reads.append(Read(torch.tensor(pos), whole, weakref.ref(leaf), leaf))
    return leaf.grad


@pytest.mark.parametrize("seed", range(4))
def test_segment_add_against_a_loop(seed):
    gen = torch.Generator().manual_seed(seed)
    pos = torch.randint(0, 9, (50,), generator=gen)
    grad = torch.randn(50, 4, generator=gen)
    acc = torch.randn(9, 4, generator=gen)
    expect = acc.clone()
    for i, p in enumerate(pos.tolist()):  # occurrence order, float32: the exact sums DGL's index_add_ makes
        expect[p] += grad[i]
    assert torch.equal(segment_add_(acc, pos, grad), expect)


def test_segment_add_is_deterministic_and_allowed_in_deterministic_mode():
    gen = torch.Generator().manual_seed(0)
    pos = torch.randint(0, 300, (20_000,), generator=gen)
    grad = torch.randn(20_000, 16, generator=gen)
    first = segment_add_(torch.zeros(300, 16), pos, grad)
    torch.use_deterministic_algorithms(True)
    try:
        again = [segment_add_(torch.zeros(300, 16), pos, grad) for _ in range(3)]
    finally:
        torch.use_deterministic_algorithms(False)
    assert all(torch.equal(first, a) for a in again)


def test_one_leaf_over_the_batch_is_passed_through_without_a_copy():
    b = batch([4, 0, 7])
    b.state.leaf = with_grad(torch.zeros(3, 2))
    ids, ids_dev, rows, sums, counts = combine([b], 2)
    assert ids is b.ids and rows is b.rows and sums is b.state.leaf.grad and counts is None
    assert mean_(sums, counts) is sums


def test_reads_in_part_average_over_every_occurrence_and_touch_only_their_rows():
    b = batch([10, 11, 12, 13])
    g1 = add_read(b, [1, 3, 3])   # e.g. heads, with a repeat
    g2 = add_read(b, [3, 0])      # tails
    ids, _, rows, sums, counts = combine([b], 2)
    assert ids.tolist() == [10, 11, 13]  # row 12 was read by no call: not updated
    assert torch.equal(rows, b.rows[[0, 1, 3]])
    assert counts.tolist() == [1.0, 1.0, 3.0]
    mean = mean_(sums, counts)
    assert torch.equal(mean[0], g2[1]) and torch.equal(mean[1], g1[0])
    assert torch.equal(mean[2], (g1[1] + g1[2] + g2[0]) / 3)


def test_hand_out_leaf_and_a_subset_read_count_twice():
    b = batch([5, 6, 7])
    b.state.leaf = with_grad(torch.zeros(3, 2))
    g = add_read(b, [2])  # emb(output_nodes) of a skip connection
    ids, _, rows, sums, counts = combine([b], 2)
    assert ids.tolist() == [5, 6, 7] and rows is b.rows
    mean = mean_(sums, counts)
    assert torch.equal(mean[:2], b.state.leaf.grad[:2])
    assert torch.equal(mean[2], (b.state.leaf.grad[2] + g[0]) / 2)


def test_batches_of_one_step_merge_by_id_with_the_first_batchs_rows():
    a, b = batch([3, 1, 8], seed=1), batch([8, 2], seed=2)
    a.state.leaf = with_grad(torch.zeros(3, 2))
    gb = add_read(b, [0, 0, 1], whole=True)
    ids, ids_dev, rows, sums, counts = combine([a, b], 2)
    assert ids.tolist() == [1, 2, 3, 8] and torch.equal(ids_dev, ids)
    assert torch.equal(rows, torch.stack([a.rows[1], b.rows[1], a.rows[0], a.rows[2]]))
    assert counts.tolist() == [1.0, 1.0, 1.0, 3.0]
    mean = mean_(sums, counts)
    assert torch.equal(mean[3], (a.state.leaf.grad[2] + (gb[0] + gb[1])) / 3)
    assert torch.equal(mean[1], gb[2])


# --- the device path (sorted segment sums, planned on the host), run on the CPU through device.rows.on_device ---
def planned_read(b, pos, whole=False, dim=2):
    """A read as TablePipeline.read makes it on a device: its occurrence counts kept on the host."""
    pos = torch.tensor(pos)
    leaf = with_grad(torch.zeros(len(pos), dim))
    order = torch.argsort(pos, stable=True)
    counts = torch.bincount(pos, minlength=b.ids.numel())
    b.state.reads.append(Read(pos, whole, weakref.ref(leaf), leaf, segments=(order, counts)))


SCENARIOS = {
    "in part, planned": lambda: [_with(batch([10, 11, 12, 13]), planned=[([1, 3, 3], False), ([3, 0], False)])],
    "in part, unplanned": lambda: [_with(batch([10, 11, 12, 13]), planned=[], plain=[([1, 3, 3], False)])],
    "leaf and a part": lambda: [_with(batch([5, 6, 7]), leaf=True, planned=[([2, 2], False)])],
    "one whole read": lambda: [_with(batch([4, 9]), planned=[([1, 0, 1], True)])],
    "accumulated": lambda: [_with(batch([3, 1, 8], seed=1), leaf=True),
                            _with(batch([8, 2, 5], seed=2), planned=[([0, 0, 1], False)]),
                            _with(batch([5, 3], seed=3), planned=[([1, 0, 1], True)])],
}


def _with(b, leaf=False, planned=(), plain=()):
    if leaf:
        b.state.leaf = with_grad(torch.zeros(b.ids.numel(), 2))
    for pos, whole in planned:
        planned_read(b, pos, whole)
    for pos, whole in plain:
        add_read(b, pos, whole)
    return b


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_the_device_path_combines_as_the_cpu_path(scenario, monkeypatch):
    """Whole-number gradients (exact sums in any order): the device path's ids, rows, sums and counts are the CPU
    path's, for batches read in part (planned on the host, or not), merged, or read whole."""
    cpu = combine(SCENARIOS[scenario](), 2)
    monkeypatch.setattr(device_rows, "on_device", lambda device: True)
    dev = combine(SCENARIOS[scenario](), 2)
    for a, b in zip(cpu, dev):
        assert (a is None and b is None) or torch.equal(a, b)


def test_device_path_sums_are_sorted_segment_sums_without_checked_reductions(monkeypatch):
    """segment_add_ on the device path: every segment_reduce is unsafe (its checks are host syncs), no bincount
    (its length is a sync), and the result is the serial loop's on whole numbers."""
    from dgl_oac.engine.syncaudit import SyncAudit

    monkeypatch.setattr(device_rows, "on_device", lambda device: True)
    gen = torch.Generator().manual_seed(0)
    pos = torch.randint(0, 9, (50,), generator=gen)
    grad = torch.randint(-8, 8, (50, 4), generator=gen).float()
    with SyncAudit() as audit:
        out = segment_add_(torch.zeros(9, 4), pos, grad)
    assert audit.records == []
    assert torch.equal(out, torch.zeros(9, 4).index_add_(0, pos, grad))
    assert torch.equal(occurrences(pos, 9), torch.bincount(pos, minlength=9))
