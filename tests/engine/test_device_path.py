"""The per-batch path a CUDA device takes, run on the CPU through its seams (issue 35): the commit's sums planned
on the host (``dgl_oac.device.rows.on_device``), the write log's sync-free patch. Branches: gradient
accumulation, ``emb(ids)`` of ids outside the batch, a ``BatchLoader`` whose model reads its batch in part. In each,
oac trains the same bits as sync; an outside read during a pipelined epoch is patched from the write log instead of
waiting for the
write-back; rows repatched at commit are counted without reading a device tensor per step; ``num_workers``'s
default takes sampling off the caller's thread on a CUDA device."""
from __future__ import annotations

import sys
import time

import dgl
import pytest
import torch

import dgl_oac
from dgl_oac.device import rows as device_rows
from dgl_oac.engine.pipeline import TablePipeline
from dgl_oac.engine.table import RowStore, WriteLog
from dgl_oac.dgl_frontend.loader import resolve_num_workers

from conftest import power_law_graph, seeded_init

pytestmark = [pytest.mark.hang_timeout(120)]
N_GRAPH, N_TABLE, D = 120, 130, 4  # nodes N_GRAPH.. are isolated: in no sampled batch


@pytest.fixture
def device_path(monkeypatch):
    real = WriteLog.__init__
    monkeypatch.setattr(WriteLog, "__init__", lambda self, *a, **kw: real(self, *a, **{"sync_free": True, **kw}))
    monkeypatch.setattr(device_rows, "on_device", lambda device: True)


def _graph_run(mode: str, branch: str, steps: int = 10):
    g = dgl.add_nodes(power_law_graph(N_GRAPH, seed=3), N_TABLE - N_GRAPH)
    emb = dgl_oac.NodeEmbedding(N_TABLE, D, f"dp_{mode}_{branch}", init_func=seeded_init(1))
    opt = dgl_oac.SparseAdam([emb], lr=0.05)
    loader = dgl_oac.DataLoader(g, torch.arange(N_GRAPH), dgl.dataloading.NeighborSampler([3, 3]),
                                embeddings=[emb], batch_size=6, shuffle=True, seed=5, mode=mode, prefetch=3)
    gen = torch.Generator().manual_seed(7)
    it = iter(loader)
    for _ in range(steps):
        time.sleep(0.01)  # the gather thread reads ahead of the steps that follow
        loss = 0
        for _ in range(2 if branch == "accumulate" else 1):
            x = next(it)[-1][0].srcdata[emb.name]
            loss = loss + x.square().sum() + torch.sin(x).sum()
        if branch == "outside":  # few ids: each step rewrites rows the next step reads again
            out = emb(torch.randint(N_GRAPH, N_TABLE, (12,), generator=gen))
            loss = loss + out.square().sum() + torch.sin(out).sum()
        loss.backward()
        opt.step()
    it.close()
    out = emb.weight.clone(), emb.optm_state.clone()
    emb.close()
    return out


def _source_run(mode: str, steps: int = 15):
    emb = dgl_oac.NodeEmbedding(40, D, f"dp_src_{mode}", init_func=seeded_init(2))
    opt = dgl_oac.SparseAdam([emb], lr=0.05)

    def pairs():
        gen = torch.Generator().manual_seed(3)
        while True:
            yield torch.randint(0, 40, (2, 8), generator=gen)

    loader = dgl_oac.BatchLoader(pairs(), ids={emb: lambda b: b}, mode=mode, prefetch=3)
    for i, batch in enumerate(loader):
        h, t = emb(batch[0]), emb(batch[1])  # each reads the batch in part
        (h * t).sum().sigmoid().backward()
        opt.step()
        if i + 1 == steps:
            break
    loader.close()
    out = emb.weight.clone(), emb.optm_state.clone()
    emb.close()
    return out


@pytest.mark.parametrize("branch", ["accumulate", "outside", "batchloader"])
def test_on_the_device_path_oac_trains_the_bits_sync_trains(branch, device_path):
    run = _source_run if branch == "batchloader" else lambda mode: _graph_run(mode, branch)
    (w_sync, s_sync), (w_oac, s_oac) = run("sync"), run("oac")
    assert torch.equal(w_oac, w_sync) and torch.equal(s_oac, s_sync)


def test_an_outside_read_in_a_pipelined_epoch_is_patched_from_the_log_without_a_flush(device_path, monkeypatch):
    """emb(ids) of ids outside the batch does not wait for the write-back (which waits for the device) while a
    write log covers it: it reads at the applied version and the log patches the rows written since, exactly."""
    flushes, patched = [], []
    real_flush, real_patch, real_write = TablePipeline.flush, WriteLog.patch, RowStore.write
    monkeypatch.setattr(TablePipeline, "flush", lambda self: flushes.append(sys._getframe(1).f_code.co_name)
                        or real_flush(self))

    def patch(self, ids, rows, rv):
        n = real_patch(self, ids, rows, rv)
        if sys._getframe(1).f_code.co_name == "read_now":
            patched.append(int(n))
        return n

    monkeypatch.setattr(WriteLog, "patch", patch)
    # each write slower than a step (0.01 s apart): the write-back lags whatever its thread's priority
    monkeypatch.setattr(RowStore, "write", lambda self, *a, **kw: time.sleep(0.03) or real_write(self, *a, **kw))
    w_oac, s_oac = _graph_run("oac", "outside")
    assert "read_now" not in flushes and sum(patched) > 0  # the write-back lagged: the log supplied rows
    monkeypatch.setattr(RowStore, "write", real_write)
    w_sync, s_sync = _graph_run("sync", "outside")
    assert torch.equal(w_oac, w_sync) and torch.equal(s_oac, s_sync)


def test_rows_repatched_at_commit_stay_a_device_count_until_stats_are_read(device_path, make_emb):
    """A batch held across a step is patched from the log at commit: refresh() returns the count as a 0-d tensor
    (no host sync per step); loader.stats reads it as an int."""
    g = power_law_graph(60, seed=1)
    emb = make_emb(60, D, init=seeded_init(4))
    opt = dgl_oac.SparseAdam([emb], lr=0.1)
    loader = dgl_oac.DataLoader(g, torch.arange(60), dgl.dataloading.NeighborSampler([4, 4]), embeddings=[emb],
                                batch_size=8, seed=1, mode="oac", prefetch=2)
    counts = []
    real = type(emb.pipeline).refresh
    emb.pipeline.refresh = lambda b, leaf=False: counts.append(real(emb.pipeline, b, leaf)) or counts[-1]
    it = iter(loader)
    for _ in range(3):
        a, b = next(it), next(it)
        a[-1][0].srcdata[emb.name].sum().backward()
        opt.step()  # commits a; b has no gradient yet and stays pending across this step
        b[-1][0].srcdata[emb.name].square().sum().backward()
        opt.step()  # b is brought up to date from the log first
    it.close()
    assert any(isinstance(c, torch.Tensor) and c.dim() == 0 for c in counts)
    repatched = loader.stats.rows_repatched_at_commit
    assert type(repatched) is int and repatched == sum(int(c) for c in counts) > 0


def test_num_workers_defaults_to_the_callers_thread_and_workers_beside_cuda_warn():
    """Regression (H200, 2026-11-28): workers forked once the process held CUDA pinned memory crashed in DGL's
    sampler or sampled wrong batches, so the default is 0 on every device and workers on a CUDA device warn."""
    import warnings

    g = power_law_graph(30)
    cuda, cpu = torch.device("cuda", 0), torch.device("cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert resolve_num_workers(None, cpu, g) == 0 and resolve_num_workers(None, cuda, g) == 0
        assert resolve_num_workers(0, cuda, g) == 0 and resolve_num_workers(3, cpu, g) == 3
    with pytest.warns(RuntimeWarning, match=r"num_workers=2 on cuda:0: .*crash.*num_workers=0"):
        assert resolve_num_workers(2, cuda, g) == 2
    with pytest.raises(ValueError, match="num_workers"):
        resolve_num_workers(-1, cuda, g)
    loader = dgl_oac.DataLoader(g, torch.arange(30), dgl.dataloading.NeighborSampler([2]))
    assert loader.num_workers == 0
