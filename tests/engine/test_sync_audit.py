"""The host syncs of the per-batch path at steady state, pinned: every one is named and justified in EXPECTED
below, and the audit (dgl_oac.engine.syncaudit) must find exactly those, branch by branch.

Branches (``(mode, branch)``): a loader step (``next(loader)`` + ``opt.step()``) of node and edge batches; the
same with gradient accumulation (two batches read, one backward, one step: ``"accumulate"``); with an ``emb(ids)``
of ids outside the batch in every step (``"outside"``); and a :class:`dgl_oac.BatchLoader` whose model reads
its batch in part with ``emb(x)`` calls (``"batchloader"``). The audit is entered around every dgl_oac call of
the loop (``next``, ``emb(ids)``, ``step``), never around the model's own forward/backward.

EXPECTED is the one place to update when the per-batch path changes. ``"host"``: the call is on CPU tensors on
a GPU too (not a device sync); ``"device"``: on a GPU it waits for the device. The CUDA test below runs the same
steps under ``set_sync_debug_mode("error")``; it is expected to fail while any ``"device"`` entry remains
(strict: it tells when the list can shrink).

On the CPU the device-only branches run through their seams: the write logs take their CUDA path
(``sync_free=True``: the patch makes no ``nonzero``), the commit's sums theirs
(:func:`dgl_oac.device.rows.on_device`: sorted segment sums planned on the host), and the loader takes a CUDA
device's ``check_finite`` default (off: on a device the check is a host sync per step), so the audit follows the
calls a GPU run makes. With ``check_finite=True`` the check is the one sync it adds.
"""
from __future__ import annotations

import contextlib
import os
from typing import Callable, Dict, Set, Tuple

import dgl
import pytest
import torch

import dgl_oac
from dgl_oac.config import resolve_check_finite
from dgl_oac.device import rows as device_rows
from dgl_oac.engine.table import WriteLog
from dgl_oac.dgl_frontend.sampling.edge import EdgeBatchSampler
from dgl_oac.engine.syncaudit import SyncAudit, sync_debug
from dgl_oac.engine.transfer import wait_host

from conftest import power_law_graph

Why = Tuple[str, str]
_SAMPLER = ("host", "sampling on the caller's thread (num_workers=0) works on the CPU graph: no device involved")
_SEED = ("host", "the batch's seed for reproducible sampling, drawn from dgl.random on the CPU")
_FINITE = ("device", "check_finite=True: bool(isfinite(new.sum())) per table per step, before anything is written "
                     "(off by default on a CUDA device: dgl_oac.config.resolve_check_finite)")
_SYNC_WRITE = ("device", "mode='sync' writes the step's rows to the table before the next gather (its semantics: "
                         "the next batch reads them); a device->host copy, waited for")
_CHECK_IDS = ("host", "checks ids from the sampler, the source's fn or the caller (CPU) on the caller's thread")
_STEP_PLAN = ("host", "the step's rows planned from the CPU ids of its batches (combine: their unique ids; "
                      "the rows a batch read in part touched, from the reads' host counts)")
_READ_PLAN = ("host", "emb(ids): unique ids, segments and occurrence counts of CPU ids, before the copy")
_EMB_IDS = ("host", "emb(ids) of CPU ids: positions among the batch's CPU ids, whether they cover it, .cpu() of "
                    "CPU ids (a no-op)")
_POS_WHOLE = ("host", "emb(ids) of a batch's ids: whether the CPU positions cover the batch (bincount of CPU "
                       "positions), which TablePipeline.read then copies from pinned memory without a wait")

_ACCUMULATE = {"dgl_oac/engine/step.py:combine": ({"unique"}, _STEP_PLAN)}
# {(mode, branch): {site: (kinds, (where, why))}}
EXPECTED: Dict[Tuple[str, str], Dict[str, Tuple[Set[str], Why]]] = {
    ("oac", "node"): {
        "dgl_oac/dgl_frontend/sampling/__init__.py:reproducible": ({"int"}, _SEED),
    },
    ("oac", "edge"): {
        "dgl_oac/dgl_frontend/sampling/__init__.py:reproducible": ({"int"}, _SEED),
        "dgl_oac/sampling/edge_batch.py:EdgeBatchMaker.make": ({"blocking to(device)", "cpu", "item", "unique"},
                                                               _SAMPLER),
        "dgl_oac/dgl_frontend/sampling/edge.py:EdgeBatchSampler.sample": ({"item"}, _SAMPLER),  # dgl.graph's
    },
    ("sync", "node"): {
        "dgl_oac/engine/table.py:_host_copy": ({"wait"}, _SYNC_WRITE),
        "dgl_oac/dgl_frontend/sampling/__init__.py:reproducible": ({"int"}, _SEED),
        "dgl_oac/engine/table.py:check_ids": ({"int"}, _CHECK_IDS),
    },
    ("oac", "accumulate"): {
        "dgl_oac/dgl_frontend/sampling/__init__.py:reproducible": ({"int"}, _SEED),
        **_ACCUMULATE,
    },
    ("oac", "outside"): {
        "dgl_oac/dgl_frontend/sampling/__init__.py:reproducible": ({"int"}, _SEED),
        "dgl_oac/engine/table.py:check_ids": ({"int"}, _CHECK_IDS),
        "dgl_oac/engine/pipeline.py:TableRows.positions": ({"bool"}, _EMB_IDS),
        "dgl_oac/embedding.py:NodeEmbedding.__call__": ({"cpu"}, _EMB_IDS),
        "dgl_oac/engine/pipeline.py:TablePipeline.read_now": ({"unique"}, _READ_PLAN),
        **_ACCUMULATE,  # the loader's batch and the outside read meet in one step
    },
    ("oac", "batchloader"): {
        "dgl_oac/engine/table.py:check_ids": ({"int"}, _CHECK_IDS),
        "dgl_oac/engine/pipeline.py:TableRows.positions": ({"bool"}, _EMB_IDS),
        "dgl_oac/embedding.py:NodeEmbedding.__call__": ({"bincount", "bool", "cpu"}, _POS_WHOLE),
        "dgl_oac/engine/pipeline.py:TablePipeline.read": ({"bincount"}, _READ_PLAN),
        "dgl_oac/engine/step.py:_touched": ({"nonzero"}, _STEP_PLAN),
    },
}
FINITE_SITE = {"dgl_oac/engine/step.py:StepPlan.kernel": ({"bool"}, _FINITE)}  # what check_finite=True adds
N_GRAPH, N_TABLE = 300, 400  # nodes N_GRAPH.. are isolated, in no sampled batch: "outside" reads them


def device_syncs(mode: str, branch: str):
    return sorted(site for site, (_, (where, _)) in EXPECTED[(mode, branch)].items() if where == "device")


def _graph_steps(mode: str, branch: str, device: str, audit: Callable, warm: int, steps: int,
                 check_finite: bool) -> None:
    g = dgl.add_nodes(power_law_graph(N_GRAPH, seed=1), N_TABLE - N_GRAPH)  # isolated: never sampled
    emb = dgl_oac.NodeEmbedding(N_TABLE, 8, "x", init_func=lambda t: t.fill_(0.1))
    opt = dgl_oac.optim.SparseAdam([emb], lr=0.1)
    sampler = dgl.dataloading.NeighborSampler([4, 4]) if branch != "edge" else EdgeBatchSampler(num_negatives=2)
    loader = dgl_oac.DataLoader(g, torch.arange(N_GRAPH), sampler, embeddings=[emb], batch_size=10, shuffle=True,
                                seed=1, mode=mode, prefetch=2, device=device, check_finite=check_finite)
    gen = torch.Generator().manual_seed(2)
    it = iter(loader)
    try:
        for i in range(warm + steps):
            ctx = audit if i >= warm else contextlib.nullcontext
            loss = torch.zeros((), device=device)
            for _ in range(2 if branch == "accumulate" else 1):
                with ctx():
                    batch = next(it)
                x = batch[-1][0].srcdata["x"] if batch[-1] else batch[1].ndata["x"]
                loss = loss + x.square().sum()
            if branch == "outside":
                ids = torch.randint(N_GRAPH, N_TABLE, (16,), generator=gen)
                with ctx():
                    out = emb(ids, device)
                loss = loss + out.square().sum()
            loss.backward()
            with ctx():
                opt.step()
    finally:
        it.close()
        emb.close()


def _source_steps(mode: str, device: str, audit: Callable, warm: int, steps: int, check_finite: bool) -> None:
    emb = dgl_oac.NodeEmbedding(60, 8, "x", init_func=lambda t: t.fill_(0.1))
    opt = dgl_oac.optim.SparseAdam([emb], lr=0.1)

    def pairs():  # (heads, tails) from a generator of its own: each an emb(x) of part of the batch
        gen = torch.Generator().manual_seed(3)
        while True:
            yield torch.randint(0, 60, (2, 12), generator=gen)

    loader = dgl_oac.BatchLoader(pairs(), ids={emb: lambda b: b}, mode=mode, prefetch=2, device=device,
                                 check_finite=check_finite)
    it = iter(loader)
    try:
        for i in range(warm + steps):
            ctx = audit if i >= warm else contextlib.nullcontext
            with ctx():
                batch = next(it)
                heads, tails = emb(batch[0], device), emb(batch[1], device)
            (heads * tails).sum().backward()
            with ctx():
                opt.step()
    finally:
        loader.close()
        emb.close()


def _steps(mode: str, branch: str, device: str, audit: Callable, warm: int = 4, steps: int = 4,
           check_finite: bool = resolve_check_finite(None, torch.device("cuda"))) -> None:
    """``warm`` steps, then ``steps`` steps whose dgl_oac calls run inside ``audit`` (a context manager)."""
    if branch == "batchloader":
        _source_steps(mode, device, audit, warm, steps, check_finite)
    else:
        _graph_steps(mode, branch, device, audit, warm, steps, check_finite)


@pytest.mark.parametrize("check_finite", [False, True], ids=["device-default", "check_finite"])
@pytest.mark.parametrize("mode,branch", sorted(EXPECTED))
def test_the_per_batch_paths_host_syncs_are_the_named_ones(mode: str, branch: str, check_finite: bool,
                                                          monkeypatch) -> None:
    real = WriteLog.__init__
    monkeypatch.setattr(WriteLog, "__init__", lambda self, *a, **kw: real(self, *a, **{"sync_free": True, **kw}))
    monkeypatch.setattr(device_rows, "on_device", lambda device: True)
    audit = SyncAudit()
    _steps(mode, branch, "cpu", lambda: audit, check_finite=check_finite)
    expected = {**EXPECTED[(mode, branch)], **(FINITE_SITE if check_finite else {})}
    assert audit.sites() == {site: kinds for site, (kinds, _) in expected.items()}


def test_check_finite_defaults_to_on_for_the_cpu_and_off_on_a_device() -> None:
    assert resolve_check_finite(None, torch.device("cpu")) is True
    assert resolve_check_finite(None, torch.device("cuda", 0)) is False
    assert resolve_check_finite(True, torch.device("cuda", 0)) is True
    assert resolve_check_finite(False, torch.device("cpu")) is False
    g = power_law_graph(30)
    loader = dgl_oac.DataLoader(g, torch.arange(30), dgl.dataloading.NeighborSampler([2]))
    assert loader.check_finite is True


def _probe(source: str):
    """``probe(...)`` compiled as if it were a function of a dgl_oac file."""
    path = os.path.join(os.path.dirname(dgl_oac.__file__), "_audit_probe.py")  # a code object named as if there
    scope = {"torch": torch, "wait_host": wait_host, "operator": __import__("operator")}
    exec(compile(source, path, "exec"), scope)
    return scope["probe"]


def test_the_audit_records_each_kind_at_its_dgl_oac_site() -> None:
    """Calls made from a dgl_oac file count, at that function; the same calls from elsewhere do not."""
    probe = _probe("def probe(t, m, f):\n"
                   "    t.item(); bool(t); t.tolist(); t.cpu(); t.nonzero(); torch.unique(t); t[m]\n"
                   "    t.to('cpu'); t.to('cpu', non_blocking=True); t.to(torch.float64); t + 1\n"
                   "    torch.bincount(t); torch.equal(t, t); operator.index(t); f'{t}'\n"
                   "    torch.segment_reduce(f, 'sum', lengths=t); torch.segment_reduce(f, 'sum', lengths=t, unsafe=True)\n"
                   "    f.copy_(f); wait_host(None)\n")
    t, m, f = torch.tensor([3]), torch.tensor([True]), torch.ones(3, 2)
    with SyncAudit() as audit:
        probe(t, m, f)
        t.item()  # this test's own call: not dgl_oac's
    assert [k for k, _ in audit.records] == ["item", "bool", "tolist", "cpu", "nonzero", "unique",
                                             "bool-mask index", "blocking to(device)", "bincount", "equal", "int",
                                             "format", "segment_reduce", "wait"]
    assert {s for _, s in audit.records} == {"dgl_oac/_audit_probe.py:probe"}


def test_host_waits_are_recorded_only_by_an_audit_on_the_waiting_thread() -> None:
    """transfer.wait_host (event.synchronize(), no torch function) is recorded at its caller, by the innermost
    audit entered on the waiting thread; another thread's wait (the write-back's) is not."""
    import threading

    probe = _probe("def probe():\n    wait_host(None)\n")
    with SyncAudit() as audit:
        thread = threading.Thread(target=probe)
        thread.start()
        thread.join()
    assert audit.records == []
    with SyncAudit() as outer:
        with SyncAudit() as inner:
            probe()
    assert inner.records == [("wait", "dgl_oac/_audit_probe.py:probe")] and outer.records == []


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_the_audit_sees_copies_between_devices_only_where_they_block() -> None:
    probe = _probe("def probe(h, d, p):\n"
                   "    d.copy_(h); d.copy_(h, non_blocking=True); d.copy_(d)\n"
                   "    h.to('cuda', non_blocking=True); p.to('cuda', non_blocking=True); h.cuda()\n")
    h = torch.ones(4)
    with SyncAudit() as audit:
        probe(h, h.cuda(), h.pin_memory())
    assert [k for k, _ in audit.records] == ["blocking copy_", "pageable copy", "blocking to(device)"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("branch", [
    pytest.param(b, marks=pytest.mark.xfail(strict=True, reason=f"device syncs remain: {device_syncs('oac', b)}"))
    if device_syncs("oac", b) else b for b in ("node", "edge", "accumulate", "outside", "batchloader")])
def test_steady_state_oac_steps_make_no_device_sync(branch: str) -> None:
    _steps("oac", branch, "cuda", lambda: sync_debug("error"))
