"""The public sparse step with and without segment sums, in one process (issue 27).

    python benchmarks/studies/segment_sums_ab.py                 # Zipf 1.1 and 0.8, Adagrad and Adam
    python benchmarks/studies/segment_sums_ab.py --quick

``emb(ids)`` of fresh ids sorts them (stably) to find the unique rows; the commit then sums each row's
gradients over that sort's segments with one ``embedding_bag`` (``dgl_oac.device.rows.segment_sums``).
Without the segments (``Read.segments`` left None, as before) it sums them with ``index_add_``. Both give the
same bits; this times the two side by side (``_ab.py``: two tables, the same batches, rounds alternating) and
checks that both tables end bitwise equal.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Dict, List, Optional

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the shared helpers

import _ab  # noqa: E402
import dgl_oac  # noqa: E402
from dgl_oac.engine.pipeline import TablePipeline  # noqa: E402

REAL_READ = TablePipeline._new_read


def _without_segments(self, batch, pos, whole, segments=None):  # the commit falls back to index_add_
    return REAL_READ(self, batch, pos, whole, None)


def _set(on: bool) -> None:
    TablePipeline._new_read = REAL_READ if on else _without_segments


SWITCH = _ab.Switch("segment_sums_ab", "segments", "index_add", _set,
                    {"adagrad": dgl_oac.SparseAdagrad, "adam": dgl_oac.SparseAdam},
                    "segment sums are not index_add_'s bits")


def main(argv: Optional[List[str]] = None) -> Dict[str, Any]:
    return _ab.main(__doc__, SWITCH, argv)


if __name__ == "__main__":
    main()
