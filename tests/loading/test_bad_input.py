"""Bad input, hypothesis-driven: random bad id batches (out of range, negative, wrong dtype or shape, not a
tensor) for ``emb(ids)``, for loader indices and from a sampler; NaN/Inf in gradients, in the rows read, or
produced by the update, in sync, async and oac, with one embedding or two in one optimizer: a clear error at
``opt.step()`` and every table and optimizer state bitwise unchanged by that batch; size mismatches, int32
graphs, unknown options (library, TrainConfig, CLI). Every error names what is wrong."""
import re
import threading

import dgl
import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import dgl_oac
from dgl_oac.app.tasks import TrainConfig

from conftest import is_pipeline_thread, power_law_graph, seeded_init

pytestmark = pytest.mark.hang_timeout(120)
GRAPH = power_law_graph(120, seed=2)
N = GRAPH.num_nodes()
MODES = ("sync", "async", "oac")
OPTS = {"sgd": (dgl_oac.SparseSGD, {"lr": 0.3}), "adagrad": (dgl_oac.SparseAdagrad, {"lr": 0.1}),
        "adam": (dgl_oac.SparseAdam, {"lr": 0.05})}
SETTINGS = dict(deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])


# --- bad id batches --------------------------------------------------------------------------------------------
def good_ids(bound):
    return st.lists(st.integers(0, bound - 1), max_size=12)


def live_threads():
    """The dgl-oac background threads alive now (objects: names repeat across loaders)."""
    return {t for t in threading.enumerate() if is_pipeline_thread(t)}


def started_since(before):
    """Names of dgl-oac threads alive now that were not alive at ``before`` (other tests' leftovers ignored)."""
    return sorted(t.name for t in live_threads() - before)


@st.composite
def bad_ids(draw, bound):
    """``(ids, exception type, regex the message must match)`` for a random kind of bad batch."""
    kind = draw(st.sampled_from(["high", "negative", "dtype", "shape", "not_tensor"]))
    ids = draw(good_ids(bound))
    if kind in ("high", "negative"):
        bad = draw(st.integers(bound, 2**40) if kind == "high" else st.integers(-2**40, -1))
        ids.insert(draw(st.integers(0, len(ids))), bad)
        t = torch.tensor(ids, dtype=torch.int64)
        shown = int(t.max()) if kind == "high" else int(t.min())
        return t, IndexError, rf"out of range: found id {shown}, valid ids are 0\.\.{bound - 1}"
    if kind == "dtype":
        dtype = draw(st.sampled_from([torch.int32, torch.int16, torch.uint8, torch.float32, torch.float64,
                                      torch.bool]))
        return torch.tensor(ids or [0]).to(dtype), TypeError, rf"must have dtype torch.int64, got {dtype}"
    if kind == "shape":
        rows, cols = draw(st.integers(1, 4)), draw(st.integers(2, 4))
        t = torch.randint(0, bound, (rows, cols), generator=torch.Generator().manual_seed(len(ids)))
        return t, ValueError, r"must be 1-D, got shape"
    wrapper = draw(st.sampled_from([list, tuple, lambda x: torch.tensor(x, dtype=torch.int64).numpy()]))
    return wrapper(ids), TypeError, r"must be a torch.Tensor of int64 node ids, got"


@settings(max_examples=60, **SETTINGS)
@given(case=bad_ids(N))
def test_bad_ids_to_embedding_lookup(case):
    ids, exc, msg = case
    emb = dgl_oac.NodeEmbedding(N, 3, "lookup", seeded_init(1))
    opt = dgl_oac.SparseAdagrad([emb], lr=0.1)
    table = emb.store.table.clone()
    with pytest.raises(exc, match=f"ids passed to NodeEmbedding 'lookup' {msg}"):
        emb(ids)
    assert not emb.pipeline.pending()  # nothing half-registered for the next step()
    emb(torch.tensor([4, 4, 7])).sum().backward()  # and the embedding still works
    opt.step()
    assert not torch.equal(emb.store.table, table) and emb.pipeline.steps == 1


@settings(max_examples=40, **SETTINGS)
@given(case=bad_ids(N).filter(lambda c: isinstance(c[0], torch.Tensor)), edge=st.booleans())
def test_bad_loader_indices(case, edge):
    """(Lists and arrays of valid ids are accepted, as by DGL: ``torch.as_tensor`` then the same checks.)"""
    ids, exc, msg = case
    sampler = dgl.dataloading.NeighborSampler([2])
    if edge:  # edge ids are checked against the number of edges
        sampler = dgl.dataloading.as_edge_prediction_sampler(sampler)
        ids, exc, msg = draw_edge_case(ids, exc, msg)
    with pytest.raises(exc, match=("indices \\(edge ids\\) " if edge else "indices \\(node ids\\) ") + msg):
        dgl_oac.DataLoader(GRAPH, ids, sampler)


def draw_edge_case(ids, exc, msg):
    """Re-express a node-id case against the edge-id bound (only range errors depend on the bound)."""
    if exc is IndexError:
        t = ids.clone()
        t[t >= N] += GRAPH.num_edges()  # still out of range for edges
        shown = int(t.max()) if int(t.max()) >= GRAPH.num_edges() else int(t.min())
        return t, IndexError, rf"out of range: found id {shown}, valid ids are 0\.\.{GRAPH.num_edges() - 1}"
    return ids, exc, msg


class BadSampler(dgl.dataloading.Sampler):
    """A NeighborSampler whose ``at``-th batch has its input nodes replaced by ``ids``."""

    def __init__(self, at, ids):
        super().__init__()
        self.inner, self.at, self.ids, self.calls = dgl.dataloading.NeighborSampler([2]), at, ids, 0

    def sample(self, g, seeds):
        input_nodes, output_nodes, blocks = self.inner.sample(g, seeds)
        self.calls += 1
        return (self.ids if self.calls - 1 == self.at else input_nodes), output_nodes, blocks


@pytest.mark.parametrize("mode", MODES)
@settings(max_examples=8, **SETTINGS)
@given(case=bad_ids(N).filter(lambda c: isinstance(c[0], torch.Tensor) and c[0].dim() == 1
                              and c[0].numel() > 0), at=st.integers(0, 3))
def test_sampler_returning_bad_input_nodes(mode, case, at):
    """Raised in the loop at that batch (not as torch's bare 'index out of range'), in every mode; the
    batches before it were trained, no thread or read is left behind."""
    ids, exc, msg = case
    before = live_threads()
    emb = dgl_oac.NodeEmbedding(N, 3, "e", seeded_init(0))
    opt = dgl_oac.SparseSGD([emb], lr=0.1)
    loader = dgl_oac.DataLoader(GRAPH, torch.arange(N), BadSampler(at, ids), embeddings=[emb], mode=mode,
                                batch_size=10, prefetch=2)
    done = 0
    with pytest.raises(exc, match=f"input nodes of a batch \\(from the sampler\\) for NodeEmbedding 'e' {msg}"):
        for batch in loader:
            batch[-1][0].srcdata["e"].sum().backward()
            opt.step()
            done += 1
    assert done == at and emb.pipeline.steps == at and emb.pipeline.clock.open_reads() == 0
    emb.close()
    assert not started_since(before)


def test_size_mismatches_and_int32_graphs():
    small = dgl_oac.NodeEmbedding(N - 1, 3, "small")
    with pytest.raises(ValueError, match=f"'small' has {N - 1} rows but the graph has {N} nodes"):
        dgl_oac.DataLoader(GRAPH, torch.arange(N), dgl.dataloading.NeighborSampler([2]), embeddings=[small])
    emb = dgl_oac.NodeEmbedding(N, 3, "e")
    with pytest.raises(TypeError, match="graph has idtype torch.int32.*pass graph.long\\(\\)"):
        dgl_oac.DataLoader(GRAPH.int(), torch.arange(N), dgl.dataloading.NeighborSampler([2]), embeddings=[emb])
    with pytest.raises(ValueError, match="init_func returned shape \\(120, 2\\), expected \\(120, 3\\)"):
        dgl_oac.NodeEmbedding(N, 3, "bad_init", init_func=lambda t: torch.zeros(N, 2))
    with pytest.raises(ValueError, match="num_rows > 0 and dim > 0, got 0 x 3"):
        dgl_oac.NodeEmbedding(0, 3, "empty")


# --- non-finite values -----------------------------------------------------------------------------------------
def run_with_bad_step(mode, opt_name, bad_step, kind, row, two_embs=False, steps=7, skip_instead=False):
    """Train ``steps`` batches; at ``bad_step`` inject ``kind`` into row ``row`` of the batch (of the second
    embedding when ``two_embs``). Checks the failed step changed nothing; returns the final tables+states.
    ``skip_instead``: the reference, where that batch is simply never stepped."""
    names = ["a", "b"] if two_embs else ["a"]
    embs = [dgl_oac.NodeEmbedding(N, 4, n, seeded_init(i)) for i, n in enumerate(names)]
    cls, kw = OPTS[opt_name]
    opt = cls(embs, **kw)
    loader = dgl_oac.DataLoader(GRAPH, torch.arange(N), dgl.dataloading.NeighborSampler([3, 3]), embeddings=embs,
                                mode=mode, batch_size=12, shuffle=True, seed=5, prefetch=3)
    target = embs[-1]
    for i, batch in enumerate(loader):
        if i == steps:
            break
        xs = [batch[-1][0].srcdata[e.name] for e in embs]
        loss = sum((x * x).sum() + x[:, 0].sum() for x in xs)
        r = row % xs[-1].shape[0]
        held = target.pipeline.find(batch[0])  # this batch's rows of the target table, as handed out
        assert held is not None
        if mode == "oac" and i == bad_step:  # a row the commit re-patches from the log would lose the NaN
            fresh = (~target.pipeline.log.stale(held.ids_dev, held.rv)[0]).nonzero().squeeze(1)
            r = int(fresh[row % fresh.numel()])
        if i == bad_step and skip_instead:
            continue
        if i == bad_step:
            if kind == "nan_loss":
                loss = loss * float("nan")
            elif kind in ("inf_grad", "huge_grad"):
                value = float("inf") if kind == "inf_grad" else 1e30
                xs[-1].register_hook(lambda g: g.index_fill(0, torch.tensor([r]), value))
            elif kind in ("nan_value", "nan_state"):  # a row as read from the table (value or state column)
                col = 0 if kind == "nan_value" else 4
                held.rows[r, col] = float("nan")
        loss.backward()
        if i != bad_step:
            opt.step()
            continue
        before = [(e.weight.clone(), e.optm_state.clone()) for e in embs]
        bad_id = int(held.ids[r])
        with pytest.raises(FloatingPointError) as err:
            opt.step()
        expect = {"nan_loss": "the gradient", "inf_grad": "the gradient", "nan_value": "table \\(values\\)",
                  "nan_state": "table \\(optimizer state\\)", "huge_grad": "update \\(overflow\\)"}[kind]
        msg = str(err.value)
        assert re.search(f"NaN or Inf in .*{expect} of NodeEmbedding '{target.name}'", msg), msg
        assert "the batch was skipped" in msg
        if kind != "nan_loss":
            assert f"ids [{bad_id}]" in msg, msg
        for e, (w, s) in zip(embs, before):  # every embedding, bitwise; nothing left pending or open
            assert torch.equal(e.weight, w) and torch.equal(e.optm_state, s)
            assert not e.pipeline.pending()
    out = [(e.weight.clone(), e.optm_state.clone()) for e in embs]
    loader.close()
    del batch, xs, loss  # the batch the loop broke at is released once nothing holds its rows
    assert all(e.pipeline.clock.open_reads() == 0 for e in embs)
    for e in embs:
        e.close()
    return out


KINDS = ["nan_loss", "inf_grad", "nan_value", "nan_state", "huge_grad"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("mode", MODES)
@settings(max_examples=4, **SETTINGS)
@given(opt_name=st.sampled_from(sorted(OPTS)), bad_step=st.integers(0, 5), row=st.integers(0, 10_000))
def test_non_finite_step_raises_and_changes_nothing(mode, kind, opt_name, bad_step, row):
    assume(not (opt_name == "sgd" and kind in ("nan_state", "huge_grad")))  # SGD rows have no state to spoil
    got = run_with_bad_step(mode, opt_name, bad_step, kind, row)
    if mode != "async":  # training went on exactly as if the batch had never been stepped
        ref = run_with_bad_step("sync", opt_name, bad_step, kind, row, skip_instead=True)
        assert all(torch.equal(x, y) for p, q in zip(got, ref) for x, y in zip(p, q))


@pytest.mark.parametrize("mode", MODES)
def test_non_finite_in_one_embedding_leaves_both_unchanged(mode):
    """Two embeddings in one optimizer, NaN only in the second's gradient: neither is written (the first is
    checked-and-held, not committed), and oac still ends equal to sync with that batch skipped."""
    got = run_with_bad_step(mode, "adam", 2, "inf_grad", 3, two_embs=True)
    if mode != "async":
        ref = run_with_bad_step("sync", "adam", 2, "inf_grad", 3, two_embs=True, skip_instead=True)
        assert all(torch.equal(x, y) for p, q in zip(got, ref) for x, y in zip(p, q))


def test_check_finite_false_lets_non_finite_through():
    emb = dgl_oac.NodeEmbedding(N, 2, "e", seeded_init(0))
    opt = dgl_oac.SparseSGD([emb], lr=0.1)
    loader = dgl_oac.DataLoader(GRAPH, torch.arange(N), dgl.dataloading.NeighborSampler([2]), embeddings=[emb],
                                mode="oac", batch_size=20, check_finite=False)
    batch = next(iter(loader))
    (batch[-1][0].srcdata["e"].sum() * float("nan")).backward()
    opt.step()  # the caller asked for no check
    assert bool(torch.isnan(emb.weight).any())
    loader.close()
    emb.close()


# --- unknown options ------------------------------------------------------------------------------------------------
def test_unknown_options_are_named():
    emb = dgl_oac.NodeEmbedding(N, 2, "e")
    cases = [(lambda: dgl_oac.NodeEmbedding(N, 2, "x", storge="memory"), TypeError, "storge"),
             (lambda: dgl_oac.SparseAdam([emb], lr=0.1, weight_decay=0.1), TypeError, "weight_decay"),
             (lambda: dgl_oac.SparseSGD([emb], lr=0.1, momentum=0.9), TypeError, "momentum"),
             (lambda: dgl_oac.DataLoader(GRAPH, torch.arange(3), dgl.dataloading.NeighborSampler([2]), prefech=2),
              TypeError, "unknown DataLoader option\\(s\\): prefech"),
             (lambda: dgl_oac.DataLoader(GRAPH, torch.arange(3), dgl.dataloading.NeighborSampler([2]),
                                         writeback_depth=0), ValueError, "writeback_depth must be an integer >= 1"),
             (lambda: dgl_oac.DataLoader(GRAPH, torch.arange(3), dgl.dataloading.NeighborSampler([2]), pin="yes"),
              ValueError, "pin must be True, False or 'auto'"),
             (lambda: TrainConfig(epocs=3), TypeError, "epocs")]
    for make, exc, msg in cases:
        with pytest.raises(exc, match=msg):
            make()


@pytest.mark.parametrize("argv,msg", [
    (["train", "--epocs", "3"], "unrecognized arguments: --epocs 3"),
    (["train", "--mode", "fast"], "invalid choice: 'fast'"),
    (["train", "--optimizer", "lbfgs"], "invalid choice: 'lbfgs'"),
    (["train", "--prefetch", "two"], "must be 'auto' or an integer >= 0 (0: sync's schedule), got 'two'"),
    (["fly"], "invalid choice: 'fly'"),
])
def test_cli_unknown_options(argv, msg, capsys):
    from dgl_oac.app.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    assert msg in capsys.readouterr().err


@pytest.mark.parametrize("argv,msg", [
    (["--lr", "-1"], "--lr and --dense-lr must be positive"),
    (["--fanouts", "10,x"], "--fanouts must be comma-separated integers"),
    (["--task", "node", "--mode", "dgl", "--optimizer", "sgd"], "dgl.optim has no sparse sgd"),
])
def test_cli_bad_values_exit_2_with_message(argv, msg, capsys):
    from dgl_oac.app.cli import main

    assert main(["train", "--num-nodes", "300", "--no-progress"] + argv) == 2
    assert msg in capsys.readouterr().err
