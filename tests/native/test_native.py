"""The native CPU row operations (``dgl_oac/native/rowops.c``): built here, bitwise the torch ops they replace
(gathers, scatters, the optimizers' row updates), bad ids refused before anything is written, the commit's
finite check, never in place of a replaced kernel, and a clean fallback where they cannot build."""
import os
import shutil
import subprocess
import sys

import pytest
import torch

import dgl_oac
from dgl_oac import native

HAVE_CC = shutil.which(os.environ.get("CC") or "cc") is not None


def make(cls, dim, **kw):
    return cls([dgl_oac.NodeEmbedding(1, dim, f"native_{cls.__name__}_{dim}_{len(kw)}")], lr=0.05, **kw)


def strided(n, width, gen, pad=3):
    """``float32[n, width]`` rows inside a wider buffer (row stride width + pad), as the write log's ring or a
    gather of value ‖ state may hand them."""
    return torch.randn(n, width + pad, generator=gen)[:, :width]


def rows_for(opt, n, dim, gen):
    rows = strided(n, dim + opt.state_width(dim), gen)
    rows[:, dim:] = rows[:, dim:].abs()  # sums of squares, second moments (and step counts) are >= 0
    if isinstance(opt, dgl_oac.SparseAdam):
        rows[:, -1] = torch.randint(0, 40, (n,), generator=gen).float()
    return rows


def test_builds_on_a_machine_with_a_compiler():
    if not HAVE_CC:
        pytest.skip("no C compiler on PATH: the torch path is used (see test_falls_back_without_a_compiler)")
    assert native.status() == "native"


@pytest.mark.skipif(not HAVE_CC, reason="no C compiler")
@pytest.mark.parametrize("n", [0, 1, 9, 5000])
def test_gather_and_scatter_are_index_select_and_index_copy(n):
    gen = torch.Generator().manual_seed(n)
    table = strided(20_000, 33, gen)  # rows of stride 36: a table's value columns, say
    ids = torch.randperm(20_000, generator=gen)[:n]
    got = native.gather(table, ids)
    assert got is not None and torch.equal(got, table.index_select(0, ids))
    out = torch.full((n + 4, 40), 7.0)[:n, 3:36]  # into a strided buffer, as a pinned staging slice
    assert native.gather(table, ids, out) is out and torch.equal(out, table.index_select(0, ids))
    rows = torch.randn(n, 33, generator=gen)
    want = table.clone().index_copy_(0, ids, rows)
    assert native.scatter(table, ids, rows) and torch.equal(table, want)


@pytest.mark.skipif(not HAVE_CC, reason="no C compiler")
@pytest.mark.parametrize("bad", [-1, 100])
def test_bad_ids_copy_nothing_and_the_store_raises_torchs_error(bad):
    table = torch.arange(400.0).reshape(100, 4)
    before = table.clone()
    ids = torch.tensor([3, bad, 5])
    assert native.gather(table, ids) is None
    assert not native.scatter(table, ids, torch.zeros(3, 4))
    assert torch.equal(table, before)  # checked before any row was written
    emb = dgl_oac.NodeEmbedding(100, 4, f"native_bad_{bad}")
    with pytest.raises(IndexError):
        emb.pipeline.store.gather(ids)
    with pytest.raises(IndexError):
        emb.pipeline.store.write(ids, torch.zeros(3, 4))
    emb.close()


def test_what_does_not_apply_is_left_to_torch():
    table = torch.randn(10, 4)
    assert native.gather(table.double(), torch.tensor([1])) is None  # not float32
    assert native.gather(table.t(), torch.tensor([1])) is None  # rows not of unit inner stride
    assert native.gather(table, torch.tensor([1, 2, 3])[::2]) is None  # ids not contiguous
    assert not native.scatter(table, torch.tensor([1, 2], dtype=torch.int32), torch.zeros(2, 4))


@pytest.mark.skipif(not HAVE_CC, reason="no C compiler")
@pytest.mark.parametrize("cls", [dgl_oac.SparseAdagrad, dgl_oac.SparseAdam])
@pytest.mark.parametrize("dim", [1, 7, 16, 128, 130])
def test_native_is_the_torch_path_bitwise(cls, dim, monkeypatch):
    gen = torch.Generator().manual_seed(dim)
    opt = make(cls, dim)
    for n in (1, 300, 5000):  # 5000: above the size where the loops run on several OpenMP threads
        rows, grad = rows_for(opt, n, dim, gen), strided(n, dim, gen)
        out = strided(n, rows.shape[1], gen)  # written in place, strided: the write log's ring
        fast = opt.update_rows(rows, grad, dim, out=out)
        assert fast.data_ptr() == out.data_ptr()
        with monkeypatch.context() as m:
            m.setattr(native, "update", lambda *a, **k: None)  # what a machine without a compiler runs
            slow = opt.update_rows(rows, grad, dim)
        assert torch.equal(fast.view(torch.int32), slow.view(torch.int32))


@pytest.mark.skipif(not HAVE_CC, reason="no C compiler")
@pytest.mark.parametrize("cls", [dgl_oac.SparseAdagrad, dgl_oac.SparseAdam])
def test_finite_flag_and_the_commit_rejects_nan(cls):
    gen = torch.Generator().manual_seed(2)
    opt = make(cls, 16)
    rows, grad = rows_for(opt, 50, 16, gen), torch.randn(50, 16, generator=gen)
    table = type("T", (), {"store": type("S", (), {"dim": 16})()})()
    assert opt.update_checked(table, rows, grad)[1] is True
    grad[7, 3] = float("nan")
    new, finite = opt.update_checked(table, rows, grad)
    assert finite is False and not bool(torch.isfinite(new[7]).all())
    emb = dgl_oac.NodeEmbedding(100, 16, f"native_nan_{cls.__name__}")
    opt = cls([emb], lr=0.05)
    before = emb.weight.clone(), emb.optm_state.clone()
    x = emb(torch.tensor([3, 5, 5]))
    (x * torch.tensor([[1.0], [float("inf")], [1.0]])).sum().backward()
    with pytest.raises(FloatingPointError, match="NaN or Inf"):
        opt.step()
    assert torch.equal(emb.weight, before[0]) and torch.equal(emb.optm_state, before[1])
    emb.close()


def test_a_replaced_kernel_is_still_the_one_that_runs():
    """A subclass that changes the math must not be bypassed by the native path."""
    class Halved(dgl_oac.SparseAdagrad):
        def update_rows(self, rows, grad, dim, out=None):
            return super().update_rows(rows, grad * 0.5, dim, out=out)

    def train(cls):
        emb = dgl_oac.NodeEmbedding(10, 4, f"native_sub_{cls.__name__}", init_func=lambda t: t.fill_(1.0))
        opt = cls([emb], lr=0.1)
        emb(torch.tensor([1, 2])).sum().backward()
        opt.step()
        state = emb.optm_state.clone()
        emb.close()
        return state

    plain, halved = train(dgl_oac.SparseAdagrad), train(Halved)
    assert torch.equal(plain[1], torch.ones(4)) and torch.equal(halved[1], torch.full((4,), 0.25))  # sum of g * g


@pytest.mark.parametrize("env", [{"CC": "/nonexistent/cc"}, {"DGL_OAC_NATIVE": "0"}])
def test_falls_back_without_a_compiler(env, tmp_path):
    code = ("import torch, dgl_oac\nfrom dgl_oac import native\n"
            "emb = dgl_oac.NodeEmbedding(10, 4, 'e', init_func=lambda t: t.fill_(1.0))\n"
            "opt = dgl_oac.SparseAdam([emb], lr=0.1)\n"
            "emb(torch.tensor([1, 2])).sum().backward(); opt.step()\n"
            "print(native.status()); print(float(emb.weight[1, 0]))\n")
    run_env = {**os.environ, "DGL_OAC_CACHE": str(tmp_path), **env}
    done = subprocess.run([sys.executable, "-c", code], env=run_env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    status, w = done.stdout.strip().splitlines()
    assert status.startswith("torch ops: ")
    assert ("/nonexistent/cc" in status) if "CC" in env else ("DGL_OAC_NATIVE=0" in status)
    assert abs(float(w) - 0.9) < 1e-6  # Adam's first step is lr * sign(g)
    assert not list(tmp_path.iterdir())  # nothing half-built left in the cache
