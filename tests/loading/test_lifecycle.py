"""Lifecycle of the pipelined loader and the embedding's write-back (torchdata test/nodes style): exceptions at
start-up and mid-epoch, write-back failures, breaking out early, new epochs, injected
delays, context managers, and counting threads before and after. Every test runs under a hang guard."""
import gc
import threading
import random
import re
import time
import traceback
import weakref

import dgl
import pytest
import torch

import dgl_oac

from conftest import live_gather_threads, oac_threads, seeded_init
from helpers import train_step

pytestmark = pytest.mark.hang_timeout(60)
MODES = ("sync", "async", "oac")
PIPELINED = ("async", "oac")


class FailingSampler(dgl.dataloading.Sampler):
    """NeighborSampler([3, 3]) that raises on its ``at``-th call (counted across epochs), once."""

    def __init__(self, at):
        super().__init__()
        self.inner = dgl.dataloading.NeighborSampler([3, 3])
        self.at, self.calls = at, 0

    def sample(self, g, seeds):
        self.calls += 1
        if self.calls - 1 == self.at:
            raise ZeroDivisionError(f"sampler failed on call {self.at}")
        return self.inner.sample(g, seeds)


def make_loader(graph, emb, mode, sampler=None, **kw):
    kw = {"batch_size": 10, "shuffle": True, "seed": 3, "prefetch": 4, **kw}
    return dgl_oac.DataLoader(graph, torch.arange(graph.num_nodes()),
                              sampler or dgl.dataloading.NeighborSampler([3, 3]), embeddings=[emb], mode=mode, **kw)


def setup(graph, make_emb, mode, opt_cls=dgl_oac.SparseAdagrad, **kw):
    emb = make_emb(graph.num_nodes(), 4, init=1)
    opt = opt_cls([emb], lr=0.1)
    return emb, opt, make_loader(graph, emb, mode, **kw)


# --- sampler exceptions ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("at", [0, 3])
def test_sampler_exception_reaches_loop_and_threads_end(graph, make_emb, mode, at):
    before = oac_threads()
    emb, opt, loader = setup(graph, make_emb, mode, sampler=FailingSampler(at))
    got = []
    with pytest.raises(ZeroDivisionError, match=f"sampler failed on call {at}") as err:
        for batch in loader:
            got.append(batch[1].tolist())
            train_step(batch, emb, opt)
    assert len(got) == at  # the batches before the failing one are handed out first, in every mode
    assert traceback.extract_tb(err.value.__traceback__)[-1].name == "sample"  # the sampler's own frame
    assert not [t for t in oac_threads() if "gather" in t]
    assert emb.pipeline.clock.open_reads() == 0  # no prefetched read left open (it would pin the OAC log)
    # the loader recovers: the next epoch runs to the end (the sampler fails only once)
    steps = emb.pipeline.steps
    for batch in loader:
        train_step(batch, emb, opt)
    assert emb.pipeline.steps == steps + len(loader)
    emb.close()
    assert oac_threads() == before


def test_sampler_failure_leaves_table_as_sync(graph, make_emb):
    """oac after a mid-epoch sampler failure and a restart equals sync after the same."""
    tables = []
    for mode in ("sync", "oac"):
        emb, opt, loader = setup(graph, make_emb, mode, sampler=FailingSampler(5))
        with pytest.raises(ZeroDivisionError):
            for batch in loader:
                train_step(batch, emb, opt)
        for batch in loader:
            train_step(batch, emb, opt)
        tables.append(emb.weight.clone())
    assert torch.equal(*tables)


# --- write-back failures ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode,op", [("oac", "write"), ("async", "add")])
def test_writeback_failure_surfaces_quickly(graph, make_emb, mode, op, monkeypatch):
    before = oac_threads()
    emb, opt, loader = setup(graph, make_emb, mode, batch_size=5)
    it = iter(loader)
    train_step(next(it), emb, opt)
    emb.flush()
    assert f"dgl-oac-writeback-{emb.name}" in oac_threads()

    def broken(*args):
        raise OSError("disk gone")

    monkeypatch.setattr(emb.store, op, broken)
    t0 = time.monotonic()
    with pytest.raises(OSError, match="disk gone") as err:
        for _ in range(len(loader)):  # the next step()'s write-back fails; next()/step() must report it
            train_step(next(it), emb, opt)
            time.sleep(0.01)
    assert time.monotonic() - t0 < 1.0
    assert any("dgl-oac-writeback" in n for n in err.value.__notes__)
    t0 = time.monotonic()
    for read in (emb.flush, lambda: emb.weight):
        with pytest.raises(OSError, match="disk gone"):
            read()
    assert time.monotonic() - t0 < 1.0
    loader.close()
    emb.close()  # does not hang or raise again
    emb.close()
    assert oac_threads() == before


def test_sync_write_failure_raises_in_step(graph, make_emb, monkeypatch):
    emb, opt, loader = setup(graph, make_emb, "sync")
    it = iter(loader)
    train_step(next(it), emb, opt)
    table = emb.weight.clone()

    def broken(*args):
        raise OSError("disk gone")

    monkeypatch.setattr(emb.store, "write", broken)
    batch = next(it)
    with pytest.raises(OSError, match="disk gone"):
        train_step(batch, emb, opt)
    assert torch.equal(emb.weight, table)
    loader.close()


# --- breaking out, new epochs --------------------------------------------------------------------------------------
def run_with_break(graph, make_emb, mode, break_at, backward_before_break=False):
    emb, opt, loader = setup(graph, make_emb, mode)
    keys = []
    for i, batch in enumerate(loader):
        if i == break_at:
            break
        keys.append(batch[1].tolist())
        train_step(batch, emb, opt)
    # the for loop's iterator was the epoch's last reference: its threads stopped at the break
    assert not [t for t in oac_threads() if "gather" in t or "writeback" in t]
    for batch in loader:  # a new epoch
        keys.append(batch[1].tolist())
        train_step(batch, emb, opt)
    assert not [t for t in oac_threads() if "gather" in t]
    assert emb.pipeline.clock.open_reads() == 0
    return emb.weight.clone(), keys


@pytest.mark.parametrize("mode", PIPELINED)
def test_break_then_new_epoch_equals_sync(graph, make_emb, mode):
    before = oac_threads()
    ref, ref_keys = run_with_break(graph, make_emb, "sync", break_at=4)
    table, keys = run_with_break(graph, make_emb, mode, break_at=4)
    assert keys == ref_keys
    if mode == "oac":
        assert torch.equal(table, ref)
    # the second pass is epoch 1 (an abandoned epoch counts as done, as in torch): same batches as an
    # uninterrupted loader's second epoch
    emb, opt, loader = setup(graph, make_emb, "sync")
    epochs = [[b[1].tolist() for b in loader] for _ in range(2)]
    assert keys[4:] == epochs[1] and keys[:4] == epochs[0][:4]
    new = set(oac_threads()) - set(before)
    assert all(t.startswith("dgl-oac-writeback-") for t in new)  # only the embeddings' (closed at teardown)


def test_break_before_backward_drops_the_batch(graph, make_emb):
    """A batch handed out but never stepped (break right after next()) commits nothing, in every mode, and is
    released once nothing holds it."""
    tables = []
    for mode in MODES:
        emb, opt, loader = setup(graph, make_emb, mode)
        for i, batch in enumerate(loader):
            if i == 3:
                break  # batch 3 handed out, no backward
            train_step(batch, emb, opt)
        loader.close()
        assert len(emb.pipeline.pending()) == 1  # still held by `batch`: a later backward + step() would commit it
        del batch
        assert emb.pipeline.steps == 3 and not emb.pipeline.pending() and emb.pipeline.clock.open_reads() == 0
        tables.append(emb.weight.clone())
    assert torch.equal(tables[0], tables[2])  # sync == oac


def test_loader_dropped_mid_epoch_releases_thread_and_reads(graph, make_emb):
    """An iterator abandoned inside a function (no close()) must not keep its gather thread or its reads."""
    emb = make_emb(graph.num_nodes(), 4)
    opt = dgl_oac.SparseSGD([emb], lr=0.1)
    before = frozenset(live_gather_threads())  # loaders that earlier tests' tracebacks may still hold

    def partial_epoch():
        loader = make_loader(graph, emb, "oac")
        for i, batch in enumerate(loader):
            if i == 2:
                break
            train_step(batch, emb, opt)

    partial_epoch()
    partial_epoch()  # its first hand-out drops the previous epoch's last (unstepped) batch
    deadline = time.monotonic() + 2
    while live_gather_threads(before) and time.monotonic() < deadline:
        # the epoch <-> loader cycle goes at a collection; one that runs while the (idle-priority) gather thread
        # is still inside a gather of the dropped epoch finds it referenced from that frame: collect again
        gc.collect()
        time.sleep(0.02)
    assert not live_gather_threads(before)
    # only the last handed-out, never-stepped batch still holds a read; the next hand-out releases it
    assert emb.pipeline.clock.open_reads() <= 1 and len(emb.pipeline.pending()) <= 1
    loader = make_loader(graph, emb, "oac", batch_size=5, prefetch=2)
    for batch in loader:
        train_step(batch, emb, opt)
    assert emb.pipeline.clock.open_reads() == 0
    # nothing pins the write log any more: it is dropped with the epoch's lease (a leaked read used to keep
    # every step since it)
    assert emb.pipeline.log is None


@pytest.mark.parametrize("mode", PIPELINED)
def test_many_epochs_do_not_accumulate_threads(graph, make_emb, mode):
    before = oac_threads()
    gathers_before = frozenset(live_gather_threads())
    emb, opt, loader = setup(graph, make_emb, mode, batch_size=30)
    for _ in range(6):
        for batch in loader:
            train_step(batch, emb, opt)
            assert len(oac_threads()) <= len(before) + 2  # one gather + one write-back
        assert not live_gather_threads(gathers_before)
    emb.close()
    assert oac_threads() == before


def test_context_manager_closes_threads(graph, make_emb):
    before = oac_threads()
    emb = make_emb(graph.num_nodes(), 4)
    opt = dgl_oac.SparseAdam([emb], lr=0.1)
    with make_loader(graph, emb, "oac") as loader:
        for i, batch in enumerate(loader):
            train_step(batch, emb, opt)
            if i == 2:
                assert {"dgl-oac-gather-e0", f"dgl-oac-writeback-{emb.name}"} <= set(oac_threads())
                break
    assert oac_threads() == before
    expect = emb.weight.clone()  # the steps taken inside were written back before the threads stopped
    assert emb.pipeline.steps == 3 and not torch.equal(expect, make_emb(graph.num_nodes(), 4).weight)


def test_loader_close_is_idempotent_and_reusable(graph, make_emb):
    emb, opt, loader = setup(graph, make_emb, "oac")
    loader.close()
    it = iter(loader)
    train_step(next(it), emb, opt)
    loader.close()
    loader.close()
    with pytest.raises(StopIteration):
        next(it)  # a closed epoch ends instead of hanging
    assert sum(1 for _ in loader) == len(loader)


# --- injected delays -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("prefetch", [1, 3, 6])
def test_random_delays_do_not_change_oac_result(graph, make_emb, monkeypatch, prefetch):
    """Sleep a random 0-3 ms inside every gather (gather thread) and table write (write-back thread): the oac
    table still equals sync's bit for bit, while the schedule (what is stale when) changes from run to run."""
    def run(mode, delays):
        emb, opt, loader = setup(graph, make_emb, mode, opt_cls=dgl_oac.SparseAdam, prefetch=prefetch,
                                 writeback_depth=2, background_priority="normal")
        if delays:
            rng = random.Random(prefetch)
            store = emb.store
            gather, write = store.gather, store.write

            def slow_gather(*a, **k):
                time.sleep(rng.uniform(0, 0.003))
                return gather(*a, **k)

            def slow_write(*a, **k):
                time.sleep(rng.uniform(0, 0.003))
                return write(*a, **k)

            monkeypatch.setattr(store, "gather", slow_gather)
            monkeypatch.setattr(store, "write", slow_write)
        for _ in range(2):
            for batch in loader:
                train_step(batch, emb, opt)
        return emb.weight.clone(), emb.optm_state.clone(), loader.stats.rows_patched

    ref, ref_state, _ = run("sync", False)
    table, state, patched = run("oac", True)
    assert torch.equal(table, ref) and torch.equal(state, ref_state)
    assert patched > 0


# --- a failing training step -------------------------------------------------------------------------------------
def test_nan_batch_is_skipped_and_training_continues(graph, make_emb):
    """A non-finite gradient raises FloatingPointError at step(); the batch is skipped, training goes on, and
    oac still equals sync (its open read was closed, so the write log keeps draining)."""
    tables = []
    for mode in ("sync", "oac"):
        emb, opt, loader = setup(graph, make_emb, mode)
        errors = 0
        for i, batch in enumerate(loader):
            x = batch[2][0].srcdata[emb.name]
            loss = x.square().sum() * (float("nan") if i == 2 else 1.0)
            loss.backward()
            try:
                opt.step()
            except FloatingPointError:
                errors += 1
        assert errors == 1 and emb.pipeline.steps == len(loader) - 1
        assert emb.pipeline.clock.open_reads() == 0 and not emb.pipeline.pending()
        tables.append(emb.weight.clone())
    assert torch.equal(*tables)


@pytest.mark.parametrize("mode", MODES)
def test_gc_of_a_dropped_loader_keeps_the_current_batch(graph, make_emb, mode):
    """A dropped loader sits in a reference cycle with its epoch, so the cyclic GC frees it at an arbitrary
    moment, e.g. between another loader's hand-out and backward. Its clean-up must not drop that batch."""
    emb = make_emb(graph.num_nodes(), 4)
    opt = dgl_oac.SparseSGD([emb], lr=0.1)
    old = make_loader(graph, emb, mode)
    for batch in old:
        train_step(batch, emb, opt)
    del old, batch
    loader = make_loader(graph, emb, mode)
    for i, batch in enumerate(loader):
        loss = batch[2][0].srcdata[emb.name].sum()
        if i == 1:
            gc.collect()  # where the GC happens to run
        loss.backward()
        opt.step()
    assert emb.pipeline.steps == 2 * len(loader)


# --- background thread priority ----------------------------------------------------------------------------------
def _policies(prefix):
    import os
    import threading

    return {re.sub(r"-e\d+$", "", t.name): os.sched_getscheduler(t.native_id) for t in threading.enumerate()
            if t.name.startswith(prefix) and t.is_alive()}


@pytest.mark.skipif(not hasattr(__import__("os"), "SCHED_IDLE"), reason="Linux scheduling policies")
@pytest.mark.parametrize("priority", ["idle", "normal"])
def test_background_threads_run_at_the_requested_priority(graph, make_emb, priority):
    import os

    emb, opt, loader = setup(graph, make_emb, "oac", background_priority=priority)
    it = iter(loader)
    train_step(next(it), emb, opt)
    emb.flush()
    want = os.SCHED_IDLE if priority == "idle" else os.SCHED_OTHER
    got = _policies("dgl-oac-")
    assert set(got) == {"dgl-oac-gather", f"dgl-oac-writeback-{emb.name}"}, got
    assert set(got.values()) == {want}, got
    assert os.sched_getscheduler(0) == os.SCHED_OTHER  # the caller's own thread is untouched
    loader.close()
    emb.close()


def test_unknown_background_priority_is_refused(graph, make_emb):
    emb = make_emb(graph.num_nodes(), 4, init=1)
    with pytest.raises(ValueError, match="unknown background priority 'low': expected one of auto, idle, normal"):
        make_loader(graph, emb, "oac", background_priority="low")


# --- threads end with their owners (issue 10, item 11) ---------------------------------------------------------
@pytest.mark.parametrize("mode", PIPELINED)
def test_loader_close_stops_every_thread_and_keeps_the_steps(graph, make_emb, mode):
    """The write-back thread belongs to the epochs that pipeline, not to the embedding: after close() no dgl-oac
    thread is left, and every committed step is in the table (flushed first, never lost)."""
    before = oac_threads()
    emb, opt, loader = setup(graph, make_emb, mode)
    it = iter(loader)
    for _ in range(5):
        train_step(next(it), emb, opt)
    assert f"dgl-oac-writeback-{emb.name}" in oac_threads()
    loader.close()
    assert oac_threads() == before
    assert emb.pipeline.steps == 5 and emb.pipeline.clock.applied == 4


def test_dropping_loader_and_embeddings_stops_threads_within_a_second(graph):
    """No close(), no emb.close(): leaving a function that broke out of an oac loop frees its threads."""
    before = oac_threads()

    def train_and_leave():
        emb = dgl_oac.NodeEmbedding(graph.num_nodes(), 4, "dropped", seeded_init(0))
        opt = dgl_oac.SparseAdam([emb], lr=0.1)
        loader = make_loader(graph, emb, "oac")
        for i, batch in enumerate(loader):
            train_step(batch, emb, opt)
            assert len(oac_threads()) == len(before) + 2
            if i == 3:
                break
        it = iter(loader)  # an epoch left running, referenced only by this frame and its loader
        train_step(next(it), emb, opt)
        return weakref.ref(emb)

    dead = train_and_leave()
    deadline = time.monotonic() + 1.0
    while oac_threads() != before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert oac_threads() == before and dead() is None


@pytest.mark.hang_timeout(120)
def test_hundred_create_train_drop_cycles_leave_no_thread(graph):
    """A sweep or a notebook that trains many models in a row does not accumulate threads."""
    baseline = threading.active_count()
    for cycle in range(100):
        emb = dgl_oac.NodeEmbedding(graph.num_nodes(), 4, f"sweep{cycle}", seeded_init(cycle))
        opt = dgl_oac.SparseAdagrad([emb], lr=0.1)
        loader = make_loader(graph, emb, ("oac", "async", "sync")[cycle % 3], batch_size=40)
        for i, batch in enumerate(loader):
            train_step(batch, emb, opt)
            if i == 1 and cycle % 2:
                break  # half the cycles leave their epoch early
        del emb, opt, loader, batch
    assert threading.active_count() <= baseline  # (a thread an earlier test left may end meanwhile)
