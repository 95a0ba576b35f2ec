"""Exact on CUDA by construction, checked on the CPU.

* The built-in models' backward passes (SAGE and RGCN over index blocks, LinkPredictor, the KG task's scorers)
  run no atomic accumulation (``index_add_``, ``index_put_(accumulate=True)``, ``scatter_add_``): recorded with a
  dispatch mode, op by op, while autograd runs a backward node. On CUDA those add in a racing order.
* On the CPU they give the bits of the form they replaced (``index_select``), in the same test.
* A row reduction in an optimizer step reads only rows at 16-byte boundaries, in sync and in oac, and the write
  log's slices start at one; CUDA's vectorised reduction orders a row by its alignment.
* ``scripts/device_equality.py`` covers every row optimizer and dims 257 and 128, and keeps a killed run's cases.
"""
from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path
from typing import Any, Callable, Dict, List, Set, Tuple

import dgl
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import dgl_oac
from dgl_oac.app.models import RGCN, SAGE, LinkPredictor
from dgl_oac.app.tasks import TrainConfig, build_task
from dgl_oac.app.tasks.common import run
from dgl_oac.dgl_frontend.blocks import HeteroIndexBlock, IndexBlock, IndexGraph, gather_rows
from dgl_oac.engine.table import ROW_ALIGN
from dgl_oac.engine.table import WriteLog
from dgl_oac.optim.kernels import aligned_rows

from conftest import power_law_graph

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import device_equality  # noqa: E402

ATOMIC = {"index_add", "index_add_", "scatter_add", "scatter_add_", "put_", "index_reduce", "index_reduce_"}
PUTS = {"index_put", "index_put_", "_index_put_impl_"}  # atomic with accumulate=True
OLD_GATHER = ("dgl_oac.dgl_frontend.blocks", "dgl_oac.app.models.link", "dgl_oac.app.tasks.kg")


class BackwardOps(TorchDispatchMode):
    """The aten ops run for autograd's backward nodes (``ops``), and the atomic ones among them (``atomic``)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: Set[str] = set()
        self.atomic: List[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if torch._C._current_autograd_node() is not None:
            name = func.overloadpacket.__name__
            self.ops.add(name)
            accumulate = name in PUTS and (args[3] if len(args) > 3 else kwargs.get("accumulate", False))
            if name in ATOMIC or accumulate:
                self.atomic.append(str(func))
        return func(*args, **kwargs)


def old_gathers(monkeypatch: pytest.MonkeyPatch) -> None:
    """The form ``gather_rows`` replaced, in every module that gathers with it (all imported first: a module
    imported after ``dgl_oac.dgl_frontend.blocks`` is patched would bind the patch for good)."""
    for module in [importlib.import_module(m) for m in OLD_GATHER]:
        monkeypatch.setattr(module, "gather_rows", lambda x, index: x.index_select(0, index))


def grads(fn: Callable[[], Tuple[torch.Tensor, List[torch.Tensor]]]) -> Tuple[List[torch.Tensor], BackwardOps]:
    """``fn() -> (loss, tensors)``: the tensors' gradients, and what the backward ran."""
    loss, tensors = fn()
    with BackwardOps() as rec:
        got = torch.autograd.grad(loss, tensors)
    return list(got), rec


def test_the_recorder_sees_the_atomic_forms() -> None:
    """The check can fail: ``index_select``'s and ``x[index]``'s backward are flagged, ``gather_rows``' is not."""
    x = torch.randn(6, 3, requires_grad=True)
    index = torch.tensor([0, 2, 2, 5, 0])
    for form, flagged in ((lambda: x.index_select(0, index), "index_add"), (lambda: x[index], "index_put")):
        _, rec = grads(lambda: (form().square().sum(), [x]))
        assert any(flagged in op for op in rec.atomic), rec.ops
    _, rec = grads(lambda: (gather_rows(x, index).square().sum(), [x]))
    assert rec.atomic == [] and "embedding_dense_backward" in rec.ops


@pytest.mark.parametrize("n,m,d", [(5, 7, 1), (300, 2000, 129), (4000, 70_000, 16), (50, 3000, 257)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_gather_rows_gradient_is_index_selects_bitwise(n: int, m: int, d: int, dtype: torch.dtype) -> None:
    """Repeated indices (a power law: hubs hundreds of times), enough of them for the parallel CPU paths."""
    gen = torch.Generator().manual_seed(n + m)
    x = torch.randn(n, d, generator=gen).to(dtype).requires_grad_(True)
    index = (torch.rand(m, generator=gen) ** 4 * n).long()
    g = torch.randn(m, d, generator=gen).to(dtype)
    assert torch.equal(gather_rows(x, index), x.index_select(0, index))
    (new,), (old,) = (torch.autograd.grad(f(x, index), x, g) for f in (gather_rows, lambda a, i: a.index_select(0, i)))
    assert torch.equal(new, old)


def _link_batch():
    g = power_law_graph(150, seed=2)
    sampler = dgl.dataloading.as_edge_prediction_sampler(
        dgl.dataloading.NeighborSampler([3, 3]), negative_sampler=dgl.dataloading.negative_sampler.Uniform(2))
    dgl.seed(0)
    return sampler.sample(g, torch.arange(0, g.num_edges(), 5))


def _hetero_blocks() -> List[HeteroIndexBlock]:
    gen = torch.Generator().manual_seed(4)
    hg = dgl.heterograph({(s, r, t): (torch.randint(0, 40 if s == "a" else 30, (k,), generator=gen),
                                      torch.randint(0, 40 if t == "a" else 30, (k,), generator=gen))
                          for (s, r, t), k in ((("a", "r", "b"), 200), (("b", "s", "a"), 150), (("a", "t", "a"), 90))})
    block = HeteroIndexBlock.from_dgl(dgl.to_block(hg, {"a": torch.arange(40), "b": torch.arange(30)}))
    return [block, block]


def model_cases() -> Dict[str, Callable[[], Tuple[torch.Tensor, List[torch.Tensor]]]]:
    """Each built-in model over index structure (and LinkPredictor over DGL's CPU graphs): ``() -> (loss,
    [input rows, parameters...])``, the same numbers on every call."""
    input_nodes, pair, neg, blocks = _link_batch()
    ipair, ineg, iblocks = IndexGraph.from_dgl(pair), IndexGraph.from_dgl(neg), [IndexBlock.from_dgl(b) for b in blocks]

    def build(make: Callable[[], torch.nn.Module], rows: int, loss: Callable[[torch.nn.Module, torch.Tensor], Any]):
        def case():
            torch.manual_seed(1)
            model = make()
            x = torch.randn(rows, 6, requires_grad=True)
            return loss(model, x), [x, *model.parameters()]
        return case

    def pairs(p, n, bl):
        return lambda model, x: sum(s.square().sum() for s in model(p, n, bl, x))

    def rgcn(model, x):
        return sum(v.square().sum() for v in model(_hetero_blocks(), {"a": x[:40], "b": x[40:]}).values())

    return {
        "sage-index": build(lambda: SAGE(6, 8, 4, num_layers=2), input_nodes.numel(),
                            lambda model, x: model(iblocks, x).square().sum()),
        "link-sage-index": build(lambda: LinkPredictor(SAGE(6, 8, 4)), input_nodes.numel(),
                                 pairs(ipair, ineg, iblocks)),
        "link-shallow-index": build(lambda: LinkPredictor(None), pair.num_nodes(), pairs(ipair, ineg, [])),
        "link-mlp-dgl": build(lambda: LinkPredictor(None, "mlp", emb_dim=6), pair.num_nodes(), pairs(pair, neg, [])),
        "rgcn-index": build(lambda: RGCN({"a": 6, "b": 6}, 8, 3, ["r", "s", "t"]), 70, rgcn),
    }


@pytest.mark.parametrize("name", list(model_cases()))
def test_model_backward_has_no_atomics_and_the_old_cpu_bits(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    case = model_cases()[name]
    new, rec = grads(case)
    assert rec.atomic == [], f"{name}: atomic accumulation in backward: {rec.atomic}"
    assert "embedding_dense_backward" in rec.ops
    old_gathers(monkeypatch)
    old, old_rec = grads(case)
    assert old_rec.atomic, "the old form's index_add_ (the recorder's control)"
    assert len(new) == len(old) and all(torch.equal(a, b) for a, b in zip(new, old))


@pytest.mark.hang_timeout(120)
@pytest.mark.parametrize("model", ["distmult", "complex", "transe"])
def test_kg_task_backward_has_no_atomics_and_the_old_cpu_bits(model: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """``KGTask`` trained a few steps: no atomic op in any backward; the entity and relation tables are the bits
    of the index_select form."""
    def train() -> Tuple[torch.Tensor, torch.Tensor, BackwardOps]:
        cfg = TrainConfig(task="kg", mode="sync", num_nodes=200, epochs=1, max_steps=3, batch_size=64, dim=8,
                          negatives=16, model=model, optimizer="adagrad", reg_weight=0.05, eval_limit=5, seed=1,
                          progress=False)
        task = build_task(cfg)
        with BackwardOps() as rec:
            run(cfg, task)
        return task.emb.weight.clone(), task.model.relation.weight.detach().clone(), rec

    ent, rel, rec = train()
    assert rec.atomic == [] and "embedding_dense_backward" in rec.ops, rec.atomic
    old_gathers(monkeypatch)
    old_ent, old_rel, _ = train()
    assert torch.equal(ent, old_ent) and torch.equal(rel, old_rel)


@pytest.mark.parametrize("width", [1, 3, 129, 257, 258, 514, 772])
@pytest.mark.parametrize("sync_free", [False, True])
def test_write_log_slices_start_aligned(width: int, sync_free: bool) -> None:
    """Every slice :meth:`WriteLog.reserve` hands the kernel starts at a ROW_ALIGN boundary (as a fresh allocation
    does), across wrap-around and growth, and patching still gives the newest rows."""
    gen = torch.Generator().manual_seed(width)
    n_rows = 40
    log = WriteLog(n_rows, width, torch.device("cpu"), capacity=5, sync_free=sync_free)
    table = torch.zeros(n_rows, width)
    for step in range(30):
        ids = torch.randperm(n_rows, generator=gen)[: int(torch.randint(1, 12, (), generator=gen))]
        out = log.reserve(ids.numel())
        assert out.data_ptr() % ROW_ALIGN == 0, f"step {step}: slice at {out.data_ptr() % ROW_ALIGN} bytes past"
        out.copy_(torch.randn(ids.numel(), width, generator=gen))
        log.append(step, ids, out)
        table[ids] = out
        log.drop_through(step - 4)
    read = torch.full((n_rows, width), float("nan"))
    log.patch(torch.arange(n_rows), read, 25)
    written = torch.isfinite(read).all(1)
    assert written.any() and torch.equal(read[written], table[written])


def test_aligned_rows_pads_every_row_to_a_boundary() -> None:
    for n, d in ((1, 1), (7, 257), (300, 128), (5, 3)):
        rows = aligned_rows(n, d, torch.device("cpu"))
        assert rows.shape == (n, d) and rows.data_ptr() % ROW_ALIGN == 0 and rows.stride(0) * 4 % ROW_ALIGN == 0


class RowReductions(TorchDispatchMode):
    """``(data_ptr, row stride in bytes, rows)`` of every tensor a row reduction (``mean``/``sum`` over dim 1)
    reads. (The commit's whole-tensor ``sum`` only decides whether the rows are finite.)"""

    def __init__(self) -> None:
        super().__init__()
        self.seen: List[Tuple[int, int, int]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.overloadpacket in (torch.ops.aten.mean, torch.ops.aten.sum) and len(args) > 1 and args[0].dim() == 2:
            x = args[0]
            self.seen.append((x.data_ptr(), x.stride(0) * x.element_size(), x.shape[0]))
        return func(*args, **kwargs)


@pytest.mark.hang_timeout(120)
@pytest.mark.parametrize("dim", [128, 257])
def test_rowwise_adagrad_reduces_aligned_rows_in_sync_and_oac(dim: int, make_emb) -> None:
    """``SparseRowWiseAdagrad``'s row mean, in real steps: every row it reads starts at a 16-byte boundary in sync
    and in oac (whose kernel writes into the write log's ring), and the tables end bitwise equal. Its output
    rows of ``W = dim + 1`` floats do not (W * 4 bytes is 4 or 8 mod 16), which is why the mean does not read
    them."""
    assert (dim + 1) * 4 % ROW_ALIGN != 0
    g = power_law_graph(300, seed=5)
    tables = {}
    for mode in ("sync", "oac"):
        emb = make_emb(300, dim, init=0)  # the same seeded rows in both modes
        opt = dgl_oac.optim.SparseRowWiseAdagrad([emb], lr=0.1)
        loader = dgl_oac.DataLoader(g, torch.arange(300), dgl.dataloading.NeighborSampler([4]), embeddings=[emb],
                                    batch_size=32, shuffle=True, seed=1, mode=mode, prefetch=3,
                                    background_priority="normal")
        rec = RowReductions()
        for _, _, blocks in loader:
            blocks[0].srcdata[emb.name].square().sum().backward()
            with rec:
                opt.step()
        loader.close()
        assert len(rec.seen) == len(loader), f"{mode}: one row mean a step"
        bad = [(ptr % ROW_ALIGN, stride) for ptr, stride, _ in rec.seen if ptr % ROW_ALIGN or stride % ROW_ALIGN]
        assert bad == [], f"{mode}: rows reduced off a {ROW_ALIGN}-byte boundary: {bad[:3]}"
        tables[mode] = (emb.weight.clone(), emb.optm_state.clone())
    assert torch.equal(tables["sync"][0], tables["oac"][0]) and torch.equal(tables["sync"][1], tables["oac"][1])


@pytest.fixture
def restore_torch_state():
    """``device_equality.main`` sets torch's threads (and, with --deterministic, the global mode)."""
    threads, det = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    yield
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(det)


@pytest.mark.hang_timeout(120)
def test_device_equality_over_index_blocks(tmp_path, restore_torch_state) -> None:
    """Node and link tasks over index blocks (the device path without DGL's CUDA build), RowWiseAdagrad at dim 257."""
    out = tmp_path / "eq.json"
    assert device_equality.main(["--device", "cpu", "--tasks", "node,link", "--optimizers", "rowwise_adagrad",
                                 "--dims", "257", "--structure", "index", "--nodes", "200", "--steps", "4",
                                 "--prefetch", "3", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["structure"] == "index" and report["all_equal"] and len(report["cases"]) == 2


@pytest.mark.hang_timeout(120)
def test_device_equality_tiny_covers_every_optimizer_and_dim(tmp_path, restore_torch_state) -> None:
    """The KG task (the quickest), every row optimizer at dims 257 and 128, without the deterministic mode."""
    out = tmp_path / "eq.json"
    rc = device_equality.main(["--device", "cpu", "--tasks", "kg", "--nodes", "200", "--steps", "4",
                               "--prefetch", "3", "--out", str(out)])
    report = json.loads(out.read_text())
    assert rc == 0 and report["all_equal"] and not report["deterministic_algorithms"]
    assert {(c["optimizer"], c["dim"]) for c in report["cases"]} == {
        (o, d) for o in ("sgd", "adagrad", "rowwise_adagrad", "adam") for d in (128, 257)}
    assert {c["kg_model"] for c in report["cases"]} == {"complex", "transe"}
    assert sum(r["rows_patched"] for c in report["cases"] for r in c["runs"].values()) > 0, "no staleness tested"


def test_device_equality_report_survives_a_failed_case_and_a_kill(tmp_path, monkeypatch, restore_torch_state) -> None:
    """The JSON is rewritten after each case: a case that raises is recorded and the next runs; a run killed mid-way
    (KeyboardInterrupt here) leaves the cases it finished. ``--deterministic`` is recorded."""
    calls = []

    def fake_check(task, optimizer, dim, *rest):
        calls.append((task, optimizer, dim))
        if len(calls) == 2:
            raise RuntimeError("boom")
        if len(calls) == 4:
            raise KeyboardInterrupt
        return {"oac@1": {"table_equal": True, "state_equal": True, "dense_equal": True}}

    monkeypatch.setattr(device_equality, "check", fake_check)
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    out = tmp_path / "eq.json"
    with pytest.raises(KeyboardInterrupt):
        device_equality.main(["--device", "cpu", "--tasks", "node", "--deterministic", "--out", str(out)])
    report = json.loads(out.read_text())
    assert [c["equal"] for c in report["cases"]] == [True, False, True] and "boom" in report["cases"][1]["error"]
    assert report["planned"] == 8 and report["all_equal"] is False
    assert report["deterministic_algorithms"] is True and report["cublas_workspace_config"] == ":4096:8"
