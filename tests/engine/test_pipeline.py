"""``TablePipeline`` (one owner per table of everything in flight) and the reads that feed it.

What a read records and when it is released: ``emb(ids)`` under ``no_grad`` records nothing; a read with grad
lives as long as its leaf can still get a gradient, and a leaf that got one is held until ``step()``; reads in
the middle of an iteration (evaluation rows, two loaders zipped, after the loop) see the table as of now; an
epoch that ends while its gather is still running gives every read back.
"""
from __future__ import annotations

import gc
import threading
import warnings

import dgl
import pytest
import torch

import dgl_oac
from dgl_oac.loading import epoch as epoch_module
from dgl_oac.loading.epoch import EpochResources, gather_batch

from conftest import oac_threads, power_law_graph
from helpers import assert_same, loss_of, node_loader, rows_of, snapshot, train_step

pytestmark = [pytest.mark.hang_timeout(60), pytest.mark.filterwarnings("ignore:Dataloader CPU affinity")]

N, DIM = 200, 4
GRAPH = power_law_graph(N, seed=1)


def idle(emb) -> bool:
    """Nothing pending, no read open."""
    return emb.pipeline.pending() == [] and emb.pipeline.clock.open_reads() == 0


# --- item 5: reads outside a loader ------------------------------------------------------------------------------
def test_no_grad_read_is_a_plain_tensor_and_records_nothing(make_emb, devices):
    emb = make_emb(N, DIM)
    dgl_oac.SparseAdagrad([emb], lr=0.1)
    ids = torch.tensor([3, 1, 3, 7])
    with torch.no_grad():
        x = emb(ids.to(devices), devices)
    assert not x.requires_grad and x.grad_fn is None and x.device.type == torch.device(devices).type
    assert torch.equal(x.cpu(), emb.weight[ids])
    assert idle(emb)
    all_ids = torch.arange(N)
    with torch.no_grad():
        for _ in range(40):  # an evaluation loop over the whole table
            assert torch.equal(emb(all_ids), emb.weight)
    assert idle(emb)


def test_read_with_grad_dropped_without_backward_is_released(make_emb):
    emb = make_emb(N, DIM)
    opt = dgl_oac.SparseSGD([emb], lr=0.1)
    before = emb.weight.clone()
    x = emb(torch.arange(0, N, 2))
    assert x.requires_grad
    # held for the next step(), but its read closed when it was handed out (a held leaf never pins the log)
    assert len(emb.pipeline.pending()) == 1 and emb.pipeline.clock.open_reads() == 0
    del x
    assert idle(emb)
    with pytest.warns(UserWarning, match="found nothing to commit"):
        opt.step()
    assert torch.equal(emb.weight, before)


# --- step() -------------------------------------------------------------------------------------------------------
def test_step_with_nothing_to_commit_warns(make_emb):
    emb = make_emb(N, DIM)
    opt = dgl_oac.SparseAdam([emb], lr=0.1)
    before = emb.weight.clone()
    with pytest.warns(UserWarning, match="found nothing to commit"):
        opt.step()  # nothing read
    with torch.no_grad():
        emb(torch.arange(5))
    with pytest.warns(UserWarning, match="found nothing to commit"):
        opt.step()  # read without grad
    x = emb(torch.arange(5))
    with pytest.warns(UserWarning, match="found nothing to commit"):
        opt.step()  # read with grad, no backward yet: it stays pending
    loss_of(x).backward()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        opt.step()  # now it commits, silently
    assert torch.equal(emb.weight[5:], before[5:]) and bool((emb.weight[:5] != before[:5]).all())


def test_leaf_with_gradient_survives_dropping_the_batch(make_emb):
    emb = make_emb(N, DIM)
    opt = dgl_oac.SparseSGD([emb], lr=0.1)
    loader = node_loader(GRAPH, emb, "oac")
    it = iter(loader)
    batch = next(it)
    ids = batch[0].clone()
    loss = loss_of(rows_of(batch, emb))
    loss.backward()
    del batch, loss
    gc.collect()
    before = emb.weight.clone()
    opt.step()
    changed = (emb.weight != before).any(1).nonzero().squeeze(1)
    assert torch.equal(changed, ids.sort().values)
    assert emb.pipeline.pending() == []
    loader.close()
    assert idle(emb)


def test_batch_without_gradient_stays_pending_until_its_leaf_dies(make_emb):
    """Neither the next hand-out nor the end of the epoch drops it: its leaf dying does."""
    emb = make_emb(N, DIM)
    opt = dgl_oac.SparseSGD([emb], lr=0.1)
    loader = node_loader(GRAPH, emb, "oac", prefetch=2)
    batches = list(loader)  # the epoch ends here
    assert len(emb.pipeline.pending()) == len(loader)
    loss_of(rows_of(batches[0], emb)).backward()
    opt.step()
    assert len(emb.pipeline.pending()) == len(loader) - 1
    del batches[-1]
    assert len(emb.pipeline.pending()) == len(loader) - 2
    batches.clear()
    assert idle(emb)


def test_input_nodes_of_any_pending_batch_resolve_to_its_leaf(make_emb, monkeypatch):
    """With grad: the first ``emb(input_nodes)`` of any pending batch is that batch's leaf; a subset of the newest
    batch, or a second call, is a leaf of its own over the batch's rows (DGL's trace per call), not a new read of
    the table. One step commits both batches."""
    emb = make_emb(N, DIM)
    opt = dgl_oac.SparseSGD([emb], lr=0.1)
    loader = node_loader(GRAPH, emb, "oac")
    it = iter(loader)
    a, b = next(it), next(it)
    table_reads = []
    real_read_now = type(emb.pipeline).read_now
    monkeypatch.setattr(type(emb.pipeline), "read_now",
                        lambda self, *args: table_reads.append(args) or real_read_now(self, *args))
    assert emb(a[0]) is rows_of(a, emb) and emb(b[0]) is rows_of(b, emb)
    sub = emb(b[0][[4, 1, 4]])
    assert sub.is_leaf and torch.equal(sub.detach(), rows_of(b, emb).detach()[[4, 1, 4]])
    again = emb(a[0])
    assert again is not rows_of(a, emb) and torch.equal(again.detach(), rows_of(a, emb).detach())
    assert len(emb.pipeline.pending()) == 2 and table_reads == []  # served from the batches' rows
    (loss_of(again) + loss_of(rows_of(b, emb)) + sub.sum()).backward()
    assert rows_of(b, emb).grad is not None and sub.grad is not None and again.grad is not None
    opt.step()
    assert emb.pipeline.pending() == [] and loader.stats.committed == 2
    loader.close()
    assert idle(emb)


# --- item 6: reads in the middle of an iteration ----------------------------------------------------------------
@pytest.mark.parametrize("mode", ["sync", "oac"])
def test_no_grad_read_inside_iteration_returns_current_rows(make_emb, mode, devices):
    emb = make_emb(N, DIM)
    opt = dgl_oac.SparseAdagrad([emb], lr=0.1)
    loader = node_loader(GRAPH, emb, mode, prefetch=3, device=devices)
    val_ids = torch.randperm(N, generator=torch.Generator().manual_seed(0))[:50]
    for i, batch in enumerate(loader):
        loss_of(rows_of(batch, emb)).backward()
        with torch.no_grad():
            v = emb(val_ids)           # not the batch's ids: read from the table
            w = emb(batch[0])          # the batch's own ids: its rows
        assert not v.requires_grad and not w.requires_grad and w.device == batch[0].device
        assert torch.equal(v, emb.weight[val_ids]) and torch.equal(w.cpu(), emb.weight[batch[0].cpu()])
        assert len(emb.pipeline.pending()) == 1  # the batch; the reads recorded nothing
        opt.step()
        with torch.no_grad():
            assert torch.equal(emb(val_ids), emb.weight[val_ids])
    assert loader.stats.committed == len(loader)
    assert idle(emb)


def train_zipped(make_emb, mode):
    emb = make_emb(N, DIM)
    opt = dgl_oac.SparseAdam([emb], lr=0.05)
    a = node_loader(GRAPH, emb, mode, seed=1, prefetch=2)
    b = node_loader(GRAPH, emb, mode, seed=2, prefetch=3, batch_size=20)
    steps = 0
    for x, y in zip(a, b):
        before = emb.weight.clone() if mode == "sync" else None
        (loss_of(rows_of(x, emb)) + loss_of(rows_of(y, emb))).backward()
        opt.step()
        steps += 1
        if before is not None:  # both batches committed by the one step (each loader's rows, each read once)
            ids = torch.cat([x[0], y[0]]).unique()
            assert bool((emb.weight[ids] != before[ids]).any(1).all()), f"step {steps - 1}: rows did not move"
    a.close()
    b.close()
    assert steps == min(len(a), len(b)) == 10
    return snapshot(emb), a.stats.rows_patched + b.stats.rows_patched


def test_two_loaders_zipped_over_one_embedding(make_emb):
    (sync, _), (oac, patched) = train_zipped(make_emb, "sync"), train_zipped(make_emb, "oac")
    assert_same(sync, oac)
    assert patched > 0


@pytest.mark.parametrize("mode", ["sync", "oac"])
@pytest.mark.parametrize("last", ["backward", "nothing"])
def test_read_all_ids_after_a_loop_whose_last_batch_was_not_stepped(make_emb, mode, last):
    """The last batch got a gradient (or not) but no step; then ``emb(all_ids)``: under no_grad the table, with
    grad a fresh read that the next step commits together with the last batch (if it has a gradient)."""
    emb = make_emb(N, DIM)
    opt = dgl_oac.SparseSGD([emb], lr=0.1)
    loader = node_loader(GRAPH, emb, mode)
    for i, batch in enumerate(loader):
        if i < len(loader) - 1:
            train_step(batch, emb, opt)
        elif last == "backward":
            loss_of(rows_of(batch, emb)).backward()
    all_ids = torch.arange(N)
    table = emb.weight.clone()
    with torch.no_grad():
        assert torch.equal(emb(all_ids), table)
    x = emb(all_ids)
    assert x.requires_grad and torch.equal(x.detach(), table)
    g = torch.randn(N, DIM, generator=torch.Generator().manual_seed(3))
    (x * g).sum().backward()
    opt.step()
    # SGD, duplicates averaged: rows of the last batch (if it has a gradient) get the mean of both gradients
    grad = g.clone()
    if last == "backward":
        ids, leaf = batch[0], rows_of(batch, emb)
        grad[ids] = (g[ids] + leaf.grad) / 2
    torch.testing.assert_close(emb.weight, table - 0.1 * grad, rtol=0, atol=1e-6)
    del batch, x
    assert idle(emb)


# --- item 7: a loader that does not carry the embedding the model reads ------------------------------------------
def test_unpipelined_read_of_input_nodes_warns_once(make_emb):
    emb = make_emb(N, DIM)
    opt = dgl_oac.SparseSGD([emb], lr=0.1)
    loader = dgl_oac.DataLoader(GRAPH, torch.arange(N), dgl.dataloading.NeighborSampler([3]), batch_size=40,
                                seed=0)  # no embeddings=[emb]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for input_nodes, _, _ in loader:
            x = emb(input_nodes)
            assert torch.equal(x.detach(), emb.weight[input_nodes])
            loss_of(x).backward()
            opt.step()
    mine = [w for w in caught if "does not carry it" in str(w.message)]
    assert len(mine) == 1, [str(w.message) for w in caught]
    assert issubclass(mine[0].category, UserWarning)
    assert mine[0].filename == __file__  # points at the model's emb(...) call


def test_unpipelined_warning_matches_pytest_warns(make_emb):
    emb = make_emb(N, DIM)
    loader = dgl_oac.DataLoader(GRAPH, torch.arange(N), dgl.dataloading.NeighborSampler([3]), batch_size=40)
    it = iter(loader)  # kept: the loader holds its epoch only weakly
    input_nodes, _, _ = next(it)
    with pytest.warns(UserWarning, match="does not carry it"):
        emb(input_nodes)
    loader.close()


def test_reads_that_are_not_a_batchs_input_nodes_do_not_warn(make_emb):
    emb = make_emb(N, DIM)
    carried = node_loader(GRAPH, emb, "oac")
    other = dgl_oac.DataLoader(GRAPH, torch.arange(N), dgl.dataloading.NeighborSampler([3]), batch_size=40)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for input_nodes, _, _ in other:
            emb(input_nodes.clone())  # other ids than the hand-out's input_nodes tensor: an ordinary read
        for input_nodes, _, _ in carried:
            emb(input_nodes)  # a loader that carries it
    carried.close()


# --- item 12: an epoch closed while its gather runs ---------------------------------------------------------------
def one_table(result):
    """The input nodes of a batch for the one table of these tests (what
    dgl_oac.dgl_frontend.inputs.Inputs.table_ids does)."""
    return [result[0]]


def prepared(make_emb):
    emb = make_emb(N, DIM)
    dgl_oac.SparseSGD([emb], lr=0.1)
    emb.pipeline.prepare(torch.device("cpu"), False, "oac")
    return emb


def test_late_gather_after_close_releases_its_own_reads(make_emb):
    emb = prepared(make_emb)
    res = EpochResources([emb.pipeline], one_table)
    ids = torch.arange(10, 30)
    early = gather_batch(res, {"gather": 0.0, "copy": 0.0}, (0, (ids,)))
    assert early is not None and early[0] == 0 and emb.pipeline.clock.open_reads() == 1
    res.close()  # releases what it holds
    assert emb.pipeline.clock.open_reads() == 0
    assert res.hold(1, []) is False  # a late hold is refused: the caller releases
    assert gather_batch(res, {"gather": 0.0, "copy": 0.0}, (1, (ids,))) is None
    assert idle(emb)
    res.close()  # idempotent
    assert idle(emb)


def test_epoch_closed_while_its_gather_thread_is_inside_a_gather(make_emb, monkeypatch):
    """The real interleaving: the gather thread is inside ``gather_batch_rows`` when the epoch closes; it finishes
    after ``close()`` set ``closed``, finds its hold refused and releases its own read."""
    emb = prepared(make_emb)
    entered, go = threading.Event(), threading.Event()
    real = epoch_module.gather_batch_rows

    def slow_gather(*args, **kwargs):
        entered.set()
        assert go.wait(10)
        return real(*args, **kwargs)

    monkeypatch.setattr(epoch_module, "gather_batch_rows", slow_gather)
    res = EpochResources([emb.pipeline], one_table)
    res.start("dgl-oac-gather-test", 2, "normal", {"gather": 0.0, "copy": 0.0})
    res.lease("oac", 2, "normal", 8)
    assert emb.pipeline.writer is not None
    res.worker.submit((0, (torch.arange(20),)))
    assert entered.wait(10)
    closer = threading.Thread(target=res.close)
    closer.start()
    for _ in range(1000):
        if res.closed:
            break
        threading.Event().wait(0.005)
    assert res.closed
    go.set()
    closer.join(10)
    assert not closer.is_alive()
    assert idle(emb)
    assert emb.pipeline.writer is None  # its lease was returned
    assert "dgl-oac-gather-test" not in oac_threads()
