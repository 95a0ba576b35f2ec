"""dgl_oac.optim against dgl.optim and against hand-written references, over many steps with duplicated ids.

DGL's optimizer tests stop after one step, where Adam cannot tell a summed duplicate gradient from an averaged
one; these run >= 20 steps. Usage on both sides is DGL-style: direct ``emb(ids)`` lookups outside a loader.

DGL's sparse optimizers keep every lookup in ``emb._trace`` and only clear it in a ``step()`` that follows a
``zero_grad()`` (the flag is read after the trace is collected). The correct DGL loop therefore calls
``opt.zero_grad()`` *before* ``step()`` in every iteration; calling it after ``step()`` re-applies the previous
batch once more at the next step. dgl_oac consumes each lookup's gradient exactly once and needs neither.
"""
import math

import dgl
import pytest
import torch

import dgl_oac

from conftest import unique_name, with_devices

N, D = 40, 5


def make_stream(steps=25, kind="dup", seed=1):
    """[(list of id tensors looked up in that step, list of coefficient tensors)] per step.

    kind: "dup" (one lookup with repeated ids), "unique" (one lookup, distinct ids), "multi" (two lookups
    per step that overlap with each other and repeat ids).
    """
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(steps):
        if kind == "unique":
            lookups = [torch.randperm(N, generator=gen)[:17]]
        elif kind == "dup":
            lookups = [torch.randint(0, N, (30,), generator=gen)]
        else:
            lookups = [torch.randint(0, N // 2, (12,), generator=gen), torch.randint(0, N, (9,), generator=gen)]
        coefs = [torch.randn(ids.numel(), D, generator=gen) for ids in lookups]
        out.append((lookups, coefs))
    return out


def init_table(seed=0):
    return torch.randn(N, D, generator=torch.Generator().manual_seed(seed))


def loss_of(rows, coef):
    # nonlinear in the rows, so gradients change with the table and errors compound over steps
    return (rows * coef).sum() + 0.5 * (rows ** 2).sum() + torch.sin(rows).sum()


def run_dgl(opt_name, stream, zero_grad=True, **hyper):
    init = init_table()
    emb = dgl.nn.NodeEmbedding(N, D, unique_name("dgl"), init_func=lambda t: t.copy_(init))
    opt = getattr(dgl.optim, opt_name)([emb], **hyper)
    for lookups, coefs in stream:
        if zero_grad:
            opt.zero_grad()  # before step(): see module docstring
        loss = sum(loss_of(emb(ids), c) for ids, c in zip(lookups, coefs))
        loss.backward()
        opt.step()
    return emb.weight.clone(), emb


def run_ours(opt_name, stream, zero_grad=True, device="cpu", **hyper):
    init = init_table()
    emb = dgl_oac.NodeEmbedding(N, D, unique_name(), init_func=lambda t: t.copy_(init))
    opt = getattr(dgl_oac, opt_name)([emb], **hyper)
    for lookups, coefs in stream:
        loss = sum(loss_of(emb(ids.to(device), device), c.to(device)) for ids, c in zip(lookups, coefs))
        loss.backward()
        opt.step()
        if zero_grad:
            opt.zero_grad()
    return emb.weight.clone(), emb, opt


# --- against dgl.optim -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["dup", "unique", "multi"])
@pytest.mark.parametrize("opt_name,hyper", [("SparseAdagrad", {"lr": 0.05}), ("SparseAdagrad", {"lr": 0.3, "eps": 1e-3}),
                                            ("SparseAdam", {"lr": 0.05}),
                                            ("SparseAdam", {"lr": 0.02, "betas": (0.5, 0.9), "eps": 1e-4})])
def test_matches_dgl_over_many_steps(opt_name, hyper, kind):
    stream = make_stream(steps=25, kind=kind)
    ref, dgl_emb = run_dgl(opt_name, stream, **hyper)
    ours, emb, opt = run_ours(opt_name, stream, **hyper)
    assert (ours - init_table()).abs().max() > 0.1  # the test moved the table
    torch.testing.assert_close(ours, ref, rtol=0, atol=1e-6)
    # optimizer state agrees too (DGL keeps (sum,) / (step, mem, power); ours value ‖ state per row)
    state = opt.state_dict()["state"][emb.name]
    if opt_name == "SparseAdagrad":
        torch.testing.assert_close(state, dgl_emb.optm_state[0], rtol=0, atol=1e-6)
    else:
        step, mem, power = dgl_emb.optm_state
        torch.testing.assert_close(state[:, :D], mem, rtol=0, atol=1e-6)
        torch.testing.assert_close(state[:, D:2 * D], power, rtol=0, atol=1e-6)
        assert torch.equal(state[:, 2 * D], step.float())


def test_dgl_without_zero_grad_reapplies_old_batches_but_ours_does_not():
    stream = make_stream(steps=6, kind="dup")
    ref, _ = run_dgl("SparseAdagrad", stream, lr=0.05)
    dgl_forgot, _ = run_dgl("SparseAdagrad", stream, zero_grad=False, lr=0.05)
    assert (dgl_forgot - ref).abs().max() > 1e-3  # the trap in dgl.optim
    with_zg, _, _ = run_ours("SparseAdagrad", stream, lr=0.05)
    without, _, _ = run_ours("SparseAdagrad", stream, zero_grad=False, lr=0.05)
    assert torch.equal(with_zg, without)
    torch.testing.assert_close(with_zg, ref, rtol=0, atol=1e-6)


@pytest.mark.parametrize("opt_name,hyper", [("SparseSGD", {"lr": 0.1}), ("SparseAdagrad", {"lr": 0.1}),
                                            ("SparseAdam", {"lr": 0.1})])
def test_forgotten_zero_grad_changes_nothing(opt_name, hyper):
    stream = make_stream(steps=8, kind="multi")
    a, _, _ = run_ours(opt_name, stream, zero_grad=True, **hyper)
    b, _, _ = run_ours(opt_name, stream, zero_grad=False, **hyper)
    assert torch.equal(a, b)


def test_step_without_backward_or_lookup_is_a_noop():
    emb = dgl_oac.NodeEmbedding(N, D, unique_name(), init_func=lambda t: t.copy_(init_table()))
    opt = dgl_oac.SparseAdam([emb], lr=0.1)
    with pytest.warns(UserWarning, match="found nothing to commit"):
        opt.step()
    emb(torch.tensor([1, 2]))  # looked up, no backward: nothing to commit
    with pytest.warns(UserWarning, match="found nothing to commit"):
        opt.step()
    assert torch.equal(emb.weight, init_table())
    assert emb.pipeline.steps == 0


# --- hand-written references -----------------------------------------------------------------------------------
@with_devices
def test_sgd_is_w_minus_lr_mean_of_duplicate_grads(device):
    stream = make_stream(steps=20, kind="multi")
    lr = 0.07
    ours, _, _ = run_ours("SparseSGD", stream, device=device, lr=lr)
    w = init_table()
    for lookups, coefs in stream:
        leaves = [w[ids].clone().requires_grad_(True) for ids in lookups]
        sum(loss_of(x, c) for x, c in zip(leaves, coefs)).backward()
        ids = torch.cat(lookups)
        grads = torch.cat([x.grad for x in leaves])
        for row in ids.unique().tolist():
            w[row] -= lr * grads[ids == row].mean(0)
    torch.testing.assert_close(ours, w, rtol=0, atol=1e-6)


def adam_reference(stream_ids, stream_grads, lr, betas, eps, reduce):
    """Per-row Adam (per-row step counts, as DGL), duplicates reduced by ``reduce`` ("mean" or "sum")."""
    w = init_table()
    m, v, t = torch.zeros(N, D), torch.zeros(N, D), torch.zeros(N)
    b1, b2 = betas
    for ids, g in zip(stream_ids, stream_grads):
        for row in ids.unique().tolist():
            gr = g[ids == row]
            gr = gr.mean(0) if reduce == "mean" else gr.sum(0)
            t[row] += 1
            m[row] = b1 * m[row] + (1 - b1) * gr
            v[row] = b2 * v[row] + (1 - b2) * gr * gr
            m_hat = m[row] / (1 - b1 ** t[row])
            v_hat = v[row] / (1 - b2 ** t[row])
            w[row] -= lr * m_hat / (v_hat.sqrt() + eps)
    return w


def test_adam_averages_duplicates_not_sums():
    """Row 0 appears 3x in step 0, 1x in step 1, 2x in step 2: after one step sum and mean agree (Adam
    normalises the gradient), after more they differ. Gradients are constant so the reference is exact."""
    lr, betas, eps = 0.1, (0.9, 0.999), 1e-8
    ids_per_step = [torch.tensor([0, 0, 0, 1]), torch.tensor([0, 1, 1, 2]), torch.tensor([2, 0, 0, 1])]
    grads_per_step = [torch.arange(1.0, 1.0 + D).expand(ids.numel(), D) * (1 + s) for s, ids in
                      enumerate(ids_per_step)]
    emb = dgl_oac.NodeEmbedding(N, D, unique_name(), init_func=lambda t: t.copy_(init_table()))
    opt = dgl_oac.SparseAdam([emb], lr=lr, betas=betas, eps=eps)
    for k, (ids, g) in enumerate(zip(ids_per_step, grads_per_step)):
        rows = emb(ids)
        (rows * g).sum().backward()  # d/d rows = g
        opt.step()
        mean_ref = adam_reference(ids_per_step[:k + 1], grads_per_step[:k + 1], lr, betas, eps, "mean")
        sum_ref = adam_reference(ids_per_step[:k + 1], grads_per_step[:k + 1], lr, betas, eps, "sum")
        torch.testing.assert_close(emb.weight, mean_ref, rtol=0, atol=1e-6)
        if k == 0:
            torch.testing.assert_close(mean_ref, sum_ref, rtol=0, atol=1e-6)  # blind after one step
        else:
            assert (emb.weight - sum_ref).abs().max() > 1e-3
    # and dgl.optim.SparseAdam agrees with the averaging
    dgl_emb = dgl.nn.NodeEmbedding(N, D, unique_name("dgl"), init_func=lambda t: t.copy_(init_table()))
    dopt = dgl.optim.SparseAdam([dgl_emb], lr=lr, betas=betas, eps=eps)
    for ids, g in zip(ids_per_step, grads_per_step):
        dopt.zero_grad()
        (dgl_emb(ids) * g).sum().backward()
        dopt.step()
    torch.testing.assert_close(emb.weight, dgl_emb.weight, rtol=0, atol=1e-6)


# --- validation ------------------------------------------------------------------------------------------------
def fresh_emb(dim=D):
    return dgl_oac.NodeEmbedding(N, dim, unique_name())


@pytest.mark.parametrize("cls", [dgl_oac.SparseSGD, dgl_oac.SparseAdagrad, dgl_oac.SparseAdam])
@pytest.mark.parametrize("lr", [0, -0.1, float("nan"), float("inf"), "0.1"])
def test_bad_lr(cls, lr):
    with pytest.raises(ValueError, match="lr must be a positive finite number"):
        cls([fresh_emb()], lr=lr)


@pytest.mark.parametrize("betas", [(1.0, 0.999), (0.9, 1.0), (-0.1, 0.9), (0.9, 1.5), (float("nan"), 0.9)])
def test_adam_bad_betas(betas):
    with pytest.raises(ValueError, match=r"betas must lie in \[0, 1\)"):
        dgl_oac.SparseAdam([fresh_emb()], lr=0.1, betas=betas)


@pytest.mark.parametrize("cls", [dgl_oac.SparseAdagrad, dgl_oac.SparseAdam])
@pytest.mark.parametrize("eps", [0, -1e-8, float("nan")])
def test_bad_eps(cls, eps):
    with pytest.raises(ValueError, match="eps must be > 0"):
        cls([fresh_emb()], lr=0.1, eps=eps)


def test_bad_params():
    with pytest.raises(ValueError, match="at least one"):
        dgl_oac.SparseSGD([], lr=0.1)
    with pytest.raises(TypeError, match="dgl_oac.NodeEmbedding objects, got Tensor"):
        dgl_oac.SparseSGD([torch.zeros(3, 3)], lr=0.1)
    a = dgl_oac.NodeEmbedding(N, D, "same")
    b = dgl_oac.NodeEmbedding(N, D, "same")
    with pytest.raises(ValueError, match="names must be unique"):
        dgl_oac.SparseSGD([a, b], lr=0.1)


def test_failed_validation_leaves_embedding_unattached():
    emb = fresh_emb()
    with pytest.raises(ValueError):
        dgl_oac.SparseAdam([emb], lr=-1)
    assert emb.optimizer is None and emb.store.state_width == 0
    dgl_oac.SparseAdam([emb], lr=0.1)  # can still get an optimizer
    assert emb.store.state_width == 2 * D + 1


def test_two_optimizers_on_one_embedding_raise():
    emb = fresh_emb()
    opt = dgl_oac.SparseAdagrad([emb], lr=0.1)
    for cls in (dgl_oac.SparseAdagrad, dgl_oac.SparseAdam):
        with pytest.raises(RuntimeError, match="already has a sparse optimizer"):
            cls([emb], lr=0.1)
    emb._attach_optimizer(opt)  # the same optimizer again is fine


@pytest.mark.parametrize("cls,width", [(dgl_oac.SparseSGD, 0), (dgl_oac.SparseAdagrad, D),
                                       (dgl_oac.SparseAdam, 2 * D + 1)])
def test_state_layout(cls, width):
    emb = fresh_emb()
    opt = cls([emb], lr=0.1)
    assert emb.store.width == D + width
    assert emb.optm_state.shape == (N, width)
    assert opt.param_groups[0]["lr"] == 0.1 and opt.lr == 0.1


# --- state_dict ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("opt_name", ["SparseSGD", "SparseAdagrad", "SparseAdam"])
def test_state_dict_round_trip(opt_name):
    stream = make_stream(steps=12, kind="dup")
    full, _, _ = run_ours(opt_name, stream, lr=0.05)

    first, emb, opt = run_ours(opt_name, stream[:5], lr=0.05)
    sd_opt, sd_emb = opt.state_dict(), emb.state_dict()
    assert set(sd_opt) == {"param_groups", "state_names", "state"}
    assert sd_opt["param_groups"][0]["lr"] == 0.05
    assert sd_opt["state_names"] == list(opt.state_names)
    assert sd_opt["state"][emb.name].shape == (N, emb.store.state_width)
    # state_dict returns copies: training on does not change them
    saved_weight, saved_state = sd_emb["weight"].clone(), sd_opt["state"][emb.name].clone()

    emb2 = dgl_oac.NodeEmbedding(N, D, emb.name)
    opt2 = getattr(dgl_oac, opt_name)([emb2], lr=1.0)  # lr overwritten by load_state_dict
    emb2.load_state_dict(sd_emb)
    opt2.load_state_dict(sd_opt)
    assert opt2.lr == 0.05
    for lookups, coefs in stream[5:]:
        for e, o in ((emb, opt), (emb2, opt2)):
            sum(loss_of(e(ids), c) for ids, c in zip(lookups, coefs)).backward()
            o.step()
    assert torch.equal(emb2.weight, emb.weight)
    assert torch.equal(emb2.weight, full)
    assert torch.equal(sd_emb["weight"], saved_weight) and torch.equal(sd_opt["state"][emb.name], saved_state)


def test_load_state_dict_errors():
    emb = fresh_emb()
    opt = dgl_oac.SparseAdagrad([emb], lr=0.1)
    sd = opt.state_dict()
    with pytest.raises(ValueError, match=r"has shape \(40, 3\), expected \(40, 5\)"):
        opt.load_state_dict({**sd, "state": {emb.name: torch.zeros(N, 3)}})
    with pytest.raises(KeyError, match="no state for embedding"):
        opt.load_state_dict({**sd, "state": {}})
    with pytest.raises(ValueError, match="eps must be > 0"):
        opt.load_state_dict({**sd, "param_groups": [{"lr": 0.1, "eps": 0.0}]})
    with pytest.raises(ValueError, match=r"weight for .* has shape \(40, 4\)"):
        emb.load_state_dict({"weight": torch.zeros(N, 4)})


def test_nan_gradient_raises_and_leaves_table():
    emb = dgl_oac.NodeEmbedding(N, D, unique_name(), init_func=lambda t: t.copy_(init_table()))
    opt = dgl_oac.SparseAdagrad([emb], lr=0.1)
    rows = emb(torch.tensor([1, 2, 3]))
    (rows * torch.tensor(float("nan"))).sum().backward()
    with pytest.raises(FloatingPointError, match="NaN or Inf in the gradient"):
        opt.step()
    assert torch.equal(emb.weight, init_table())
    assert torch.equal(emb.optm_state, torch.zeros(N, D))
    # the bad batch was skipped, not kept pending: the next step commits only its own batch
    emb(torch.tensor([7])).sum().backward()
    opt.step()
    expect = init_table()
    expect[7] -= 0.1 * 1.0 / math.sqrt(1.0 + 1e-10)
    torch.testing.assert_close(emb.weight, expect, rtol=0, atol=1e-7)
    assert emb.pipeline.steps == 1 and not emb.pipeline.pending()


# --- DGL's SparseAdam options: dtype=torch.float16, use_uva ------------------------------------------------------
@pytest.mark.parametrize("kind", ["dup", "multi"])
def test_adam_float16_state_matches_dgl_and_halves_the_state(kind):
    """dtype=torch.float16: moments computed in float32, w updated from them, stored rounded (DGL's order);
    ours packs both moments into D float32 columns, so the state takes D + 1 columns instead of 2D + 1."""
    stream = make_stream(steps=25, kind=kind)
    ref, dgl_emb = run_dgl("SparseAdam", stream, lr=0.05, dtype=torch.float16)
    ours, emb, opt = run_ours("SparseAdam", stream, lr=0.05, dtype=torch.float16)
    assert emb.store.state_width == D + 1
    torch.testing.assert_close(ours, ref, rtol=0, atol=1e-5)
    step, mem, power = dgl_emb.optm_state
    assert mem.dtype == torch.float16
    moments = opt.state_dict()["state"][emb.name][:, :D].contiguous().view(torch.float16)
    torch.testing.assert_close(moments[:, :D], mem, rtol=0, atol=1e-3)
    torch.testing.assert_close(moments[:, D:], power, rtol=0, atol=1e-3)
    # float16 rounding is visible: not the float32 run's table
    f32, _, _ = run_ours("SparseAdam", stream, lr=0.05)
    assert not torch.equal(ours, f32)


def test_adam_float16_oac_equals_sync():
    from conftest import power_law_graph
    from helpers import node_loader, run_epoch, snapshot

    graph = power_law_graph(150, seed=2)

    def run(mode):
        emb = dgl_oac.NodeEmbedding(graph.num_nodes(), 6, unique_name(),
                                    init_func=lambda t: t.uniform_(-1, 1, generator=torch.Generator().manual_seed(3)))
        opt = dgl_oac.SparseAdam([emb], lr=0.05, dtype=torch.float16)
        loader = node_loader(graph, emb, mode, prefetch=4)
        for _ in range(2):
            run_epoch(loader, emb, opt)
        return snapshot(emb), loader.stats.rows_patched

    (sync, _), (oac, patched) = run("sync"), run("oac")
    assert torch.equal(sync[0], oac[0]) and torch.equal(sync[1], oac[1]) and patched > 0


def test_adam_dgl_options_accepted_or_refused_clearly():
    emb = dgl_oac.NodeEmbedding(N, D, unique_name())
    with pytest.warns(UserWarning, match="use_uva=...\\) is a dgl.optim option that dgl_oac ignores"):
        dgl_oac.SparseAdam([emb], lr=0.1, use_uva=True)
    with pytest.raises(ValueError, match="torch.float32 or torch.float16, not torch.float64"):
        dgl_oac.SparseAdam([dgl_oac.NodeEmbedding(N, D, unique_name())], lr=0.1, dtype=torch.float64)


# --- SparseRowWiseAdagrad: FBGEMM's EXACT_ROWWISE_ADAGRAD -------------------------------------------------------
def rowwise_reference(stream, lr, eps):
    """Closed form in float64: per step, each row's gradient is the mean over its occurrences; then
    ``s += mean(g ** 2)`` over the row and ``w -= lr * g / (sqrt(s) + eps)`` (FBGEMM's multiplier)."""
    w = init_table().double()
    s = torch.zeros(N, 1, dtype=torch.float64)
    for lookups, coefs in stream:
        x = [w[ids].clone().requires_grad_(True) for ids in lookups]
        sum(loss_of(v, c.double()) for v, c in zip(x, coefs)).backward()
        ids, grad = torch.cat(lookups), torch.cat([v.grad for v in x])
        uniq, inverse, counts = torch.unique(ids, return_inverse=True, return_counts=True)
        g = torch.zeros(uniq.numel(), D, dtype=torch.float64).index_add_(0, inverse, grad) / counts.unsqueeze(1)
        s[uniq] += (g * g).mean(1, keepdim=True)
        w[uniq] -= lr * g / (s[uniq].sqrt() + eps)
    return w.float(), s.float()


@pytest.mark.parametrize("kind", ["dup", "multi"])
@pytest.mark.parametrize("eps", [1e-8, 0.5])  # a large eps tells sqrt(s) + eps from sqrt(s + eps)
def test_rowwise_adagrad_matches_its_closed_form(kind, eps):
    stream = make_stream(steps=20, kind=kind)
    ours, emb, opt = run_ours("SparseRowWiseAdagrad", stream, lr=0.1, eps=eps)
    w, s = rowwise_reference(stream, 0.1, eps)
    torch.testing.assert_close(ours, w, rtol=0, atol=2e-5)
    torch.testing.assert_close(emb.optm_state, s, rtol=1e-5, atol=1e-6)
    assert opt.state_names == ("sum",) and emb.optm_state.shape == (N, 1)


def test_rowwise_adagrad_one_state_float_per_row_and_its_checks():
    emb = fresh_emb()
    opt = dgl_oac.SparseRowWiseAdagrad([emb], lr=0.1)
    assert emb.store.width == D + 1 and opt.defaults["eps"] == 1e-8  # FBGEMM's default eps
    with pytest.raises(ValueError, match="eps must be > 0"):
        dgl_oac.SparseRowWiseAdagrad([fresh_emb()], lr=0.1, eps=0)


def test_rowwise_adagrad_is_a_cli_optimizer():
    from dgl_oac.app.tasks.backend import OPTIMIZERS, make_sparse_optimizer

    assert "rowwise_adagrad" in OPTIMIZERS
    assert isinstance(make_sparse_optimizer("oac", "rowwise_adagrad", [fresh_emb()], 0.1), dgl_oac.SparseRowWiseAdagrad)
    with pytest.raises(ValueError, match="dgl.optim has no sparse rowwise_adagrad"):
        make_sparse_optimizer("dgl", "rowwise_adagrad", [], 0.1)


@pytest.mark.parametrize("cls", [dgl_oac.SparseSGD, dgl_oac.SparseAdagrad, dgl_oac.SparseAdam,
                                 dgl_oac.SparseRowWiseAdagrad])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_built_in_kernels_carry_a_non_finite_gradient_into_the_new_rows(cls, bad):
    """The commit's finite check sums only the new rows of these kernels (propagates_nonfinite): a NaN/Inf in
    one gradient entry must reach them, and the step is then refused with the table untouched."""
    assert cls.propagates_nonfinite
    emb = fresh_emb()
    opt = cls([emb], lr=0.1)
    before = emb.weight.clone(), emb.optm_state.clone()
    x = emb(torch.tensor([3, 7, 3]))
    coef = torch.ones(3, D)
    coef[1, 2] = bad
    (x * coef).sum().backward()
    with pytest.raises(FloatingPointError, match="the gradient"):
        opt.step()
    assert torch.equal(emb.weight, before[0]) and torch.equal(emb.optm_state, before[1])
