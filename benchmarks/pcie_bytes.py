"""Bytes per trained row that cross PCIe in each direction, per optimizer: dgl-oac's choice against the
alternative of running the row update on the host (issue 23, item 5). Computed from the optimizers'
``state_width`` (the code's own row layout), not measured: PCIe traffic is these bytes times rows per second.

dgl-oac's choice: a row travels whole (value and optimizer state) to the device, the row kernel runs there next
to the gradient, and the new row (value and state) travels back to the write-back. The alternative: only the
value goes to the device, the gradient comes back, and the write-back thread runs the optimizer on the host.

    python benchmarks/pcie_bytes.py --dim 128
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Dict, List

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

import dgl_oac  # noqa: E402

ID_BYTES = 8  # int64 id of each row, host -> device (the batch's ids, for validation and the commit)


def optimizers() -> Dict[str, dgl_oac.SparseOptimizer]:
    """One instance of each built-in optimizer (on a 1-row table: only its row layout is read)."""
    make = [("SparseSGD", dgl_oac.SparseSGD, {}), ("SparseRowWiseAdagrad", dgl_oac.SparseRowWiseAdagrad, {}),
            ("SparseAdagrad", dgl_oac.SparseAdagrad, {}), ("SparseAdam", dgl_oac.SparseAdam, {}),
            ("SparseAdam(dtype=float16)", dgl_oac.SparseAdam, {"dtype": torch.float16})]
    return {name: cls([dgl_oac.NodeEmbedding(1, 1, f"pcie_{i}")], lr=0.1, **kw)
            for i, (name, cls, kw) in enumerate(make)}


def rows(dim: int) -> List[Dict[str, object]]:
    """Per optimizer: state floats S, and bytes per trained row each way for both designs."""
    out = []
    for name, opt in optimizers().items():
        s = opt.state_width(dim)
        out.append({"optimizer": name, "state_floats": s,
                    "h2d": 4 * (dim + s) + ID_BYTES, "d2h": 4 * (dim + s),
                    "host_update_h2d": 4 * dim + ID_BYTES, "host_update_d2h": 4 * dim})
    return out


def table(dim: int) -> str:
    head = ("| optimizer | state floats S | host -> device (dgl-oac) | device -> host (dgl-oac) | "
            "host -> device (update on host) | device -> host (update on host) |\n|---|---:|---:|---:|---:|---:|")
    body = [f"| `{r['optimizer']}` | {r['state_floats']} | {r['h2d']:,} B | {r['d2h']:,} B | "
            f"{r['host_update_h2d']:,} B | {r['host_update_d2h']:,} B |" for r in rows(dim)]
    return "\n".join([head, *body])


def main(argv: List[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dim", type=int, default=128, help="embedding dimension D")
    args = p.parse_args(argv)
    print(f"bytes per trained row, D = {args.dim} (4 bytes a float; ids are int64)\n")
    print(table(args.dim))


if __name__ == "__main__":
    main()
