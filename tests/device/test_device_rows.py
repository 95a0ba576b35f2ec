"""dgl_oac.device: each device path returns None on CPU tensors (the engine then runs the CPU's torch op), and
run on the CPU through its seam it gives the CPU path's results (whole numbers: exact sums in any order)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from dgl_oac.device import rows as device_rows
from dgl_oac.device.rows import (gather_rows, occurrences, read_counts, segment_add_, segment_sums,
                                 sorted_segment_add_, sorted_segment_sums)


def _case(seed: int, n: int = 9, m: int = 50, d: int = 4):
    gen = torch.Generator().manual_seed(seed)
    pos = torch.randint(0, n, (m,), generator=gen)
    grad = torch.randn(m, d, generator=gen)
    return pos, grad, torch.argsort(pos, stable=True), torch.bincount(pos, minlength=n)


@pytest.fixture
def seam_on(monkeypatch):
    monkeypatch.setattr(device_rows, "on_device", lambda device: True)


def test_device_paths_do_not_apply_to_cpu_tensors() -> None:
    pos, grad, order, counts = _case(0)
    acc = torch.randn(9, 4)
    before = acc.clone()
    assert not device_rows.on_device(torch.device("cpu"))
    assert device_rows.on_device(torch.device("meta"))  # every device but the CPU
    assert sorted_segment_add_(acc, pos, grad) is None
    assert torch.equal(acc, before)  # touched nothing
    assert sorted_segment_sums(grad, order, counts) is None


@pytest.mark.parametrize("seed", range(3))
def test_cpu_paths_are_the_torch_ops_bitwise(seed: int) -> None:
    pos, grad, order, counts = _case(seed)
    acc = torch.randn(9, 4)
    assert torch.equal(segment_add_(acc.clone(), pos, grad), acc.clone().index_add_(0, pos, grad))
    offsets = torch.cumsum(counts, 0) - counts
    assert torch.equal(segment_sums(grad, order, counts), F.embedding_bag(order, grad, offsets, mode="sum"))
    assert torch.equal(segment_sums(grad, order, counts), torch.zeros(9, 4).index_add_(0, pos, grad))
    host = torch.bincount(pos, minlength=9)
    assert read_counts(pos, host, 9) is host  # the read's own host counts, not recounted


@pytest.mark.parametrize("seed", range(3))
def test_device_paths_on_the_cpu_equal_the_cpu_paths(seed: int, seam_on) -> None:
    pos, grad, order, counts = _case(seed)
    grad = grad.mul(8).round()  # whole numbers: exact sums in any order
    acc = torch.randn(9, 4).mul(8).round()
    assert torch.equal(sorted_segment_add_(acc.clone(), pos, grad), acc.clone().index_add_(0, pos, grad))
    assert torch.equal(sorted_segment_sums(grad, order, counts), torch.zeros(9, 4).index_add_(0, pos, grad))
    host = torch.bincount(pos, minlength=9)
    got = read_counts(pos, host, 9)
    assert got is not host and torch.equal(got, host)  # counted again, as on a device


def test_occurrences_are_bincount() -> None:
    pos = _case(1)[0]
    assert torch.equal(occurrences(pos, 12), torch.bincount(pos, minlength=12))
    assert torch.equal(occurrences(pos, 12, torch.float32), torch.bincount(pos, minlength=12).float())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_gather_rows_is_index_select_bitwise_on_the_cpu(dtype: torch.dtype) -> None:
    x = torch.randn(20, 5, generator=torch.Generator().manual_seed(2)).to(dtype)
    index = torch.randint(0, 20, (40,), generator=torch.Generator().manual_seed(3))
    assert torch.equal(gather_rows(x, index), x.index_select(0, index))
