"""The public sparse step with and without the native row operations, in one process (issue 27).

    python benchmarks/studies/native_ab.py                 # Zipf 1.1 and 0.8; SGD, Adagrad, Adam
    python benchmarks/studies/native_ab.py --quick

``dgl_oac.native`` runs a table's row gather and scatter (``index_select`` / ``index_copy_`` with the next
rows prefetched) and Adagrad's and Adam's row update (two passes instead of one per op) in compiled code; with
it off, every one of them is torch's op. Both give the same bits; this times the two side by side
(``_ab.py``: two tables, the same batches, rounds alternating) and checks that both tables end bitwise equal.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Dict, List, Optional

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the shared helpers

import _ab  # noqa: E402
import dgl_oac  # noqa: E402
from dgl_oac.native import rows as native_rows  # noqa: E402

REAL_LOAD = native_rows.load


def _set(on: bool) -> None:
    native_rows.load = REAL_LOAD if on else (lambda: None)  # off: every native op declines, torch's runs


SWITCH = _ab.Switch("native_ab", "native row ops", "torch ops (DGL_OAC_NATIVE=0)", _set,
                    {"sgd": dgl_oac.SparseSGD, "adagrad": dgl_oac.SparseAdagrad, "adam": dgl_oac.SparseAdam},
                    "the native ops are not torch's bits")


def main(argv: Optional[List[str]] = None) -> Dict[str, Any]:
    if REAL_LOAD() is None:
        raise SystemExit(f"the native library is not available here: {dgl_oac.native.status()}")
    return _ab.main(__doc__, SWITCH, argv)


if __name__ == "__main__":
    main()
