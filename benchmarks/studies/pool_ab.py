"""The public sparse step with and without the table's own row-buffer pool, in one process (issue 27).

    python benchmarks/studies/pool_ab.py                 # Zipf 1.1 and 0.8; Adagrad, Adam
    python benchmarks/studies/pool_ab.py --quick

Outside a loader, ``emb(ids)`` gathers its rows, and the step's kernel writes its new rows, into buffers of the
table's own ``BufferPool`` (``TablePipeline.host_rows``), given back once the step is written; without it (as
before) each is a fresh tensor of 8-17 MB here, which glibc maps and the step then page-faults in. Both give
the same bits; this times the two side by side (``_ab.py``: two tables, the same batches, rounds alternating)
and checks that both tables end bitwise equal.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Dict, List, Optional

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the shared helpers

import _ab  # noqa: E402
import torch  # noqa: E402

import dgl_oac  # noqa: E402
from dgl_oac.engine.transfer import BufferPool  # noqa: E402

REAL_TAKE = BufferPool.take


def _fresh(self: BufferPool, rows: int, width: int) -> torch.Tensor:  # what the step allocated before the pool
    return torch.empty(rows, width)


def _set(on: bool) -> None:
    BufferPool.take = REAL_TAKE if on else _fresh  # off: every pool hands out a fresh tensor (none comes back)


SWITCH = _ab.Switch("pool_ab", "pooled buffers", "fresh tensors", _set,
                    {"adagrad": dgl_oac.SparseAdagrad, "adam": dgl_oac.SparseAdam},
                    "pooled buffers changed what was trained")


def main(argv: Optional[List[str]] = None) -> Dict[str, Any]:
    return _ab.main(__doc__, SWITCH, argv)


if __name__ == "__main__":
    main()
