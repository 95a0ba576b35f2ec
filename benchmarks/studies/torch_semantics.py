"""How far dgl-oac's optimizers end from torch's own on the same reads: issue 25's 30-step micro-test.

torch's ``nn.Embedding(sparse=True)`` + ``torch.optim.SparseAdam`` / ``Adagrad`` / ``SGD`` against, from the same
table and the same 2-D id batches (duplicates in every batch, some rows three times or more):
- ``dgl_oac.nn``'s drop-in (torch's semantics: duplicates summed, one step count per table);
- ``dgl_oac.NodeEmbedding`` + ``dgl_oac.SparseAdam`` / ``SparseAdagrad`` / ``SparseSGD`` (DGL's semantics:
  duplicates averaged, Adam's step count per row).
Reports the max absolute difference of the final tables and torch's total movement (max |W_30 - W_0|).

    python benchmarks/studies/torch_semantics.py --out benchmarks/results/torch_semantics.json
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Callable, Dict

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the shared helpers

import _common as C  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

import dgl_oac  # noqa: E402
import dgl_oac.nn as oac_nn  # noqa: E402

PAIRS = {  # name: (torch's optimizer, the drop-in's, DGL-semantics', hyperparameters)
    "adam": (torch.optim.SparseAdam, oac_nn.SparseAdam, dgl_oac.SparseAdam, {"lr": 0.01}),
    "adagrad": (torch.optim.Adagrad, oac_nn.Adagrad, dgl_oac.SparseAdagrad, {"lr": 0.05}),
    "sgd": (torch.optim.SGD, oac_nn.SGD, dgl_oac.SparseSGD, {"lr": 0.05}),
}


def batches(steps: int, num: int, seed: int) -> list:
    """``steps`` pairs ``(ids: int64[64, 5], target: float32[64])``: 320 reads of ``num`` rows (repeats)."""
    g = torch.Generator().manual_seed(seed)
    return [(torch.randint(0, num, (64, 5), generator=g), torch.randn(64, generator=g)) for _ in range(steps)]


def train(read: Callable[[torch.Tensor], torch.Tensor], opt: Any, stream: list) -> None:
    for ids, target in stream:
        opt.zero_grad()
        loss = (read(ids).sum(-1).sum(-1) - target).pow(2).mean()
        loss.backward()
        opt.step()


def measure(name: str, num: int, dim: int, steps: int, seed: int) -> Dict[str, float]:
    t_opt_cls, nn_opt_cls, dgl_opt_cls, kw = PAIRS[name]
    stream = batches(steps, num, seed)
    torch.manual_seed(seed)
    ref = nn.Embedding(num, dim, sparse=True)
    start = ref.weight.detach().clone()
    drop_in = oac_nn.Embedding.from_pretrained(start, freeze=False, name=f"drop_in_{name}")
    table = dgl_oac.NodeEmbedding(num, dim, f"dgl_{name}", init_func=lambda t: t.copy_(start))
    train(ref, t_opt_cls(ref.parameters(), **kw), stream)
    train(drop_in, nn_opt_cls(drop_in.parameters(), **kw), stream)
    train(lambda ids: table(ids.reshape(-1)).view(*ids.shape, dim), dgl_opt_cls([table], **kw), stream)
    torch_table = ref.weight.detach()
    return {"torch_movement": float((torch_table - start).abs().max()),
            "drop_in_vs_torch": float((drop_in.weight - torch_table).abs().max()),
            "dgl_semantics_vs_torch": float((table.weight - torch_table).abs().max())}


def main() -> None:
    p = C.base_parser(__doc__.split("\n")[0], "torch_semantics")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--num", type=int, default=200, help="table rows")
    p.add_argument("--dim", type=int, default=16)
    args = p.parse_args()
    if args.quick:
        args.steps = 5
    rows = {name: measure(name, args.num, args.dim, args.steps, args.seed) for name in PAIRS}
    C.print_table(f"{args.steps} steps, {args.num} x {args.dim}, ids [64, 5]: max |difference| of the tables",
                  ["optimizer", "torch's movement", "drop-in vs torch", "DGL semantics vs torch"],
                  [[n, f"{r['torch_movement']:.4g}", f"{r['drop_in_vs_torch']:.3g}",
                    f"{r['dgl_semantics_vs_torch']:.4g}"] for n, r in rows.items()])
    C.finish({"config": vars(args), "env": C.environment(), "results": rows}, C.out_path(args, "torch_semantics"))


if __name__ == "__main__":
    main()
