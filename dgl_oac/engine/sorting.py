"""A stable sort of integer keys at radix-sort speed on CPU.

On CPU, ``torch.sort(stable=True)`` of integers uses a parallel radix sort (linear) only from ATen's grain size,
32,768 elements; below it, a comparison sort. For the 10k-32k ids of a typical batch the comparison sort is the
slower one (23k ids: 1.05-1.18 ms against 0.50-0.55 ms for the padded radix sort on this 2-core machine,
``python benchmarks/studies/row_ops.py``, piece ``sort``), so such inputs are padded to the grain size with copies of
their largest key, which a stable sort places after every real key: the first ``n`` results are exactly the
unpadded sort's. Where the padding would cost more than it saves (under 10,240 keys) or does not apply (CUDA),
it is ``torch.sort`` as is.
"""
from __future__ import annotations

from typing import Tuple

import torch

#: ATen's ``at::internal::GRAIN_SIZE``: from this many elements torch sorts integers by radix on CPU
RADIX_MIN = 32768
#: below this many keys the comparison sort is as cheap as padding to :data:`RADIX_MIN` (the crossover measured
#: here with the caches cold, as a step leaves them: 8k keys 0.40 vs 0.42 ms, 10k 0.50 vs 0.43)
PAD_FROM = 10_240


def stable_sort(keys: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(sorted, order)`` of ``keys: int64[n]`` (non-negative, any device): ``torch.sort(keys, stable=True)``,
    bitwise, with radix speed on CPU for ``PAD_FROM <= n < RADIX_MIN``."""
    n = keys.numel()
    if keys.device.type != "cpu" or not PAD_FROM <= n < RADIX_MIN or keys.dim() != 1:
        return torch.sort(keys, stable=True)
    padded = torch.cat([keys, keys.max().expand(RADIX_MIN - n)])
    ordered, order = torch.sort(padded, stable=True)
    return ordered[:n], order[:n]
