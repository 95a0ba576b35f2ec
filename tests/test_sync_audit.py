"""The host syncs of the per-batch path at steady state (``next(loader)`` + ``opt.step()``), pinned: every one
is named and justified in EXPECTED below, and the audit (dgl_oac.engine.syncaudit) must find exactly those.

EXPECTED is the one place to update when the per-batch path changes (issue 23, item 1: the commit path on
branch ``step``). ``"host"``: the call is on CPU tensors on a GPU too (not a device sync); ``"device"``: on a
GPU it waits for the device. The CUDA test below runs the same steps under ``set_sync_debug_mode("error")``;
it is expected to fail while any ``"device"`` entry remains (strict: it tells when the list can shrink).

On the CPU the write logs take their CUDA path (``sync_free=True``: the patch makes no ``nonzero``) and the
loader takes a CUDA device's ``check_finite`` default (off: on a device the check is a host sync per step), so
the audit follows the calls a GPU run makes. With ``check_finite=True`` the check is the one sync it adds.
"""
from __future__ import annotations

import os
from typing import Dict, Set, Tuple

import dgl
import pytest
import torch

import dgl_oac
from dgl_oac.config import resolve_check_finite
from dgl_oac.engine.oac import WriteLog
from dgl_oac.sampling.edge import EdgeBatchSampler
from dgl_oac.engine.syncaudit import SyncAudit, sync_debug

from conftest import power_law_graph

_SAMPLER = ("host", "sampling on the caller's thread (num_workers=0) works on the CPU graph: no device involved")
_SEED = ("host", "the batch's seed for reproducible sampling, drawn from dgl.random on the CPU")
_FINITE = ("device", "check_finite=True: bool(isfinite(new.sum())) per table per step, before anything is written "
                     "(off by default on a CUDA device: dgl_oac.config.resolve_check_finite)")
_SYNC_WRITE = ("device", "mode='sync' writes the step's rows to the table before the next gather (its semantics: "
                         "the next batch reads them); a device->host copy")
_CHECK_IDS = ("host", "mode='sync' checks the next batch's ids (CPU, from the sampler) on the caller's thread")

# {(mode, task): {site: (kinds, (where, why))}}
EXPECTED: Dict[Tuple[str, str], Dict[str, Tuple[Set[str], Tuple[str, str]]]] = {
    ("oac", "node"): {
        "dgl_oac/sampling/__init__.py:reproducible": ({"int"}, _SEED),
    },
    ("oac", "edge"): {
        "dgl_oac/sampling/__init__.py:reproducible": ({"int"}, _SEED),
        "dgl_oac/sampling/edge.py:EdgeBatchSampler.sample": ({"blocking to(device)", "cpu", "item", "unique"},
                                                             _SAMPLER),
    },
    ("sync", "node"): {
        "dgl_oac/engine/write_path.py:StepWriter.write": ({"cpu"}, _SYNC_WRITE),
        "dgl_oac/sampling/__init__.py:reproducible": ({"int"}, _SEED),
        "dgl_oac/engine/store.py:check_ids": ({"int"}, _CHECK_IDS),
    },
}
FINITE_SITE = {"dgl_oac/engine/commit.py:_plan": ({"bool"}, _FINITE)}  # what check_finite=True adds


def device_syncs(mode: str, task: str):
    return sorted(site for site, (_, (where, _)) in EXPECTED[(mode, task)].items() if where == "device")


def _steps(mode: str, task: str, device: str, audit, warm: int = 4, steps: int = 4,
           check_finite=resolve_check_finite(None, torch.device("cuda"))) -> None:
    """``warm`` steps, then ``steps`` steps whose ``next(loader)`` and ``opt.step()`` run inside ``audit`` (a
    context manager); the model's forward/backward (the user's code) outside it."""
    g = power_law_graph(300, seed=1)
    emb = dgl_oac.NodeEmbedding(300, 8, "x", init_func=lambda t: t.fill_(0.1))
    opt = dgl_oac.optim.SparseAdam([emb], lr=0.1)
    sampler = dgl.dataloading.NeighborSampler([4, 4]) if task == "node" else EdgeBatchSampler(num_negatives=2)
    loader = dgl_oac.DataLoader(g, torch.arange(300), sampler, embeddings=[emb], batch_size=20, shuffle=True,
                                seed=1, mode=mode, prefetch=2, device=device, check_finite=check_finite)
    it = iter(loader)
    try:
        for i in range(warm + steps):
            if i < warm:
                batch = next(it)
            else:
                with audit():
                    batch = next(it)
            x = batch[-1][0].srcdata["x"] if batch[-1] else batch[1].ndata["x"]
            x.square().sum().backward()
            if i < warm:
                opt.step()
            else:
                with audit():
                    opt.step()
    finally:
        it.close()
        emb.close()


@pytest.mark.parametrize("check_finite", [False, True], ids=["device-default", "check_finite"])
@pytest.mark.parametrize("mode,task", sorted(EXPECTED))
def test_the_per_batch_paths_host_syncs_are_the_named_ones(mode: str, task: str, check_finite: bool,
                                                          monkeypatch) -> None:
    real = WriteLog.__init__
    monkeypatch.setattr(WriteLog, "__init__", lambda self, *a, **kw: real(self, *a, **{"sync_free": True, **kw}))
    audit = SyncAudit()
    _steps(mode, task, "cpu", lambda: audit, check_finite=check_finite)
    expected = {**EXPECTED[(mode, task)], **(FINITE_SITE if check_finite else {})}
    assert audit.sites() == {site: kinds for site, (kinds, _) in expected.items()}


def test_check_finite_defaults_to_on_for_the_cpu_and_off_on_a_device() -> None:
    assert resolve_check_finite(None, torch.device("cpu")) is True
    assert resolve_check_finite(None, torch.device("cuda", 0)) is False
    assert resolve_check_finite(True, torch.device("cuda", 0)) is True
    assert resolve_check_finite(False, torch.device("cpu")) is False
    g = power_law_graph(30)
    loader = dgl_oac.DataLoader(g, torch.arange(30), dgl.dataloading.NeighborSampler([2]))
    assert loader.check_finite is True


def test_the_audit_records_each_kind_at_its_dgl_oac_site() -> None:
    """Calls made from a dgl_oac file count, at that function; the same calls from elsewhere do not."""
    path = os.path.join(os.path.dirname(dgl_oac.__file__), "_audit_probe.py")  # a code object named as if there
    code = compile("def probe(t, m):\n"
                   "    t.item(); bool(t); t.tolist(); t.cpu(); t.nonzero(); torch.unique(t); t[m]\n"
                   "    t.to('cpu'); t.to('cpu', non_blocking=True); t.to(torch.float64); t + 1\n", path, "exec")
    scope = {"torch": torch}
    exec(code, scope)
    t, m = torch.tensor([3]), torch.tensor([True])
    with SyncAudit() as audit:
        scope["probe"](t, m)
        t.item()  # this test's own call: not dgl_oac's
    assert [k for k, _ in audit.records] == ["item", "bool", "tolist", "cpu", "nonzero", "unique",
                                             "bool-mask index", "blocking to(device)"]
    assert {s for _, s in audit.records} == {"dgl_oac/_audit_probe.py:probe"}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("task", [
    pytest.param(t, marks=pytest.mark.xfail(strict=True, reason=f"device syncs remain: {device_syncs('oac', t)}"))
    if device_syncs("oac", t) else t for t in ("node", "edge")])
def test_steady_state_oac_steps_make_no_device_sync(task: str) -> None:
    _steps("oac", task, "cuda", lambda: sync_debug("error"))
