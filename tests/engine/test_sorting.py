"""``engine.table.stable_sort``: bitwise ``torch.sort(stable=True)`` at every size, padded or not."""
import pytest
import torch

from dgl_oac.engine.table import PAD_FROM, RADIX_MIN, stable_sort


@pytest.mark.parametrize("n", [0, 1, 100, PAD_FROM - 1, PAD_FROM, 23_000, RADIX_MIN - 1, RADIX_MIN, 40_000])
@pytest.mark.parametrize("high", [3, 300_000, 2 ** 40])
def test_matches_torch_stable_sort(n: int, high: int) -> None:
    gen = torch.Generator().manual_seed(n + high)
    keys = torch.randint(0, high, (n,), generator=gen)  # high=3: long runs of equal keys (stability)
    want_v, want_o = torch.sort(keys, stable=True)
    got_v, got_o = stable_sort(keys)
    assert torch.equal(got_v, want_v) and torch.equal(got_o, want_o)
    assert got_v.is_contiguous() and got_o.is_contiguous()


def test_largest_key_repeated_stays_in_order() -> None:
    """The padding copies the largest key: the real copies of it must still come first, in input order."""
    keys = torch.full((PAD_FROM + 5,), 7, dtype=torch.int64)
    keys[::3] = 2
    _, order = stable_sort(keys)
    assert torch.equal(order, torch.sort(keys, stable=True)[1])
    assert int(order.max()) == keys.numel() - 1
