"""benchmarks/pcie_bytes.py: the bytes-per-row table of RESULTS.md follows the optimizers' own row layout."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import pcie_bytes  # noqa: E402


def test_bytes_follow_state_width_and_results_quote_the_table() -> None:
    got = {r["optimizer"]: r for r in pcie_bytes.rows(128)}
    assert got["SparseSGD"]["h2d"] == 4 * 128 + 8 and got["SparseSGD"]["d2h"] == 512
    assert got["SparseAdam"]["state_floats"] == 2 * 128 + 1 and got["SparseAdam"]["d2h"] == 4 * (3 * 128 + 1)
    assert got["SparseRowWiseAdagrad"]["d2h"] == 4 * 129
    assert all(r["host_update_d2h"] == 512 for r in got.values())
    results = (Path(__file__).resolve().parents[2] / "benchmarks" / "RESULTS.md").read_text()
    assert pcie_bytes.table(128) in results, "RESULTS.md's PCIe table is stale: re-run benchmarks/pcie_bytes.py"
