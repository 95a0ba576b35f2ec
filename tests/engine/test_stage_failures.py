"""Failing stages, the commit and write-back side (tests/loading/test_lifecycle.py covers the sampler, breaking out and
the plain write-back failure): an exception in the gather, the host->device copy, the device->host copy of the
commit, the row kernel or the write-back reaches the training loop at the next ``next()``/``step()``/``flush()``
within 1 second, as the original exception with its original traceback; the batch it hit is skipped without a
trace (oac still equals sync), a write-back thread that dies behind a full queue cannot hang ``step()``, and an
exception in user code inside ``with loader:`` stops every thread."""
import threading
import time
import traceback

import dgl
import pytest
import torch

import dgl_oac

from conftest import power_law_graph, seeded_init
from helpers import train_step

pytestmark = pytest.mark.hang_timeout(60)
GRAPH = power_law_graph(150, seed=4)


def live_threads():
    """The dgl-oac background threads alive now (objects: names repeat across loaders)."""
    return {t for t in threading.enumerate() if t.name.startswith("dgl-oac") and t.is_alive()}


def started_since(before):
    """Names of dgl-oac threads alive now that were not alive at ``before`` (other tests' leftovers ignored)."""
    return sorted(t.name for t in live_threads() - before)


class Boom(RuntimeError):
    pass


def setup(mode, prefetch=3, writeback_depth=None, opt_cls=dgl_oac.SparseAdagrad):
    emb = dgl_oac.NodeEmbedding(GRAPH.num_nodes(), 4, "e", seeded_init(0))
    opt = opt_cls([emb], lr=0.1)
    loader = dgl_oac.DataLoader(GRAPH, torch.arange(GRAPH.num_nodes()), dgl.dataloading.NeighborSampler([3, 3]),
                                embeddings=[emb], mode=mode, batch_size=10, shuffle=True, seed=2, prefetch=prefetch,
                                writeback_depth=writeback_depth)
    return emb, opt, loader


def fail_on_call(fn, at, exc=None):
    """``fn`` that raises Boom on its ``at``-th call (0-based), from whatever thread calls it."""
    calls = [0]

    def broken_stage(*args, **kwargs):
        calls[0] += 1
        if calls[0] - 1 == at:
            raise exc or Boom(f"stage failed on call {at}")
        return fn(*args, **kwargs)

    return broken_stage


def frames(exc):
    return [f.name for f in traceback.extract_tb(exc.__traceback__)]


def reference_table(steps, skip=None):
    """sync: the table after ``steps`` batches, batch ``skip`` handed out but never stepped."""
    emb, opt, loader = setup("sync")
    for i, batch in enumerate(loader):
        if i == steps:
            break
        if i != skip:
            train_step(batch, emb, opt)
    loader.close()
    out = emb.weight.clone(), emb.optm_state.clone()
    emb.close()
    return out


# --- gather and host->device copy (gather thread) --------------------------------------------------------------
@pytest.mark.parametrize("stage", ["gather", "to_device"])
def test_gather_thread_failure_raised_at_its_batch_with_traceback(stage):
    before = live_threads()
    emb, opt, loader = setup("oac")
    owner = emb.store if stage == "gather" else None
    it = iter(loader)  # creates the transfer object the copy stage uses
    owner = owner or emb.pipeline.transfer
    setattr(owner, stage, fail_on_call(getattr(owner, stage), at=5))
    done = 0
    with pytest.raises(Boom, match="stage failed on call 5") as err:
        while True:
            t0 = time.monotonic()
            batch = next(it)
            train_step(batch, emb, opt)
            done += 1
    assert time.monotonic() - t0 < 1.0  # the failing next() returned at once, nothing waited on a timeout
    assert done == 5  # the 5 batches gathered before it were handed out and trained, in order
    assert "broken_stage" in frames(err.value) and "gather_batch" in frames(err.value)  # the thread's own frames
    assert any("dgl-oac-gather-e0" in n for n in err.value.__notes__)
    assert not [t for t in started_since(before) if "gather" in t] and emb.pipeline.clock.open_reads() == 0
    table = emb.weight.clone(), emb.optm_state.clone()
    emb.close()
    assert not started_since(before)
    ref = reference_table(5)
    assert torch.equal(table[0], ref[0]) and torch.equal(table[1], ref[1])


# --- the commit: device->host copy and the row kernel -----------------------------------------------------------
@pytest.mark.parametrize("stage", ["to_host", "update_rows"])
@pytest.mark.parametrize("mode", ["async", "oac"])
def test_commit_failure_skips_the_batch_without_a_trace(stage, mode):
    """A failure inside step() (copy back, or a kernel raising) leaves table, state and write log as before the
    batch; training goes on and, in oac, still equals sync with that batch skipped."""
    emb, opt, loader = setup(mode, opt_cls=dgl_oac.SparseAdam)
    owner = opt if stage == "update_rows" else None
    raised = 0
    for i, batch in enumerate(loader):
        if i == 12:
            break
        if i == 4:
            owner = owner or emb.pipeline.transfer
            setattr(owner, stage, fail_on_call(getattr(owner, stage), at=0))
            before = emb.weight.clone(), emb.optm_state.clone(), emb.pipeline.steps, len(emb.pipeline.log.entries if emb.pipeline.log
                                                                                        else [])
            try:
                train_step(batch, emb, opt)
            except Boom as exc:
                raised += 1
                assert "broken_stage" in frames(exc)
            after = emb.weight.clone(), emb.optm_state.clone(), emb.pipeline.steps, len(emb.pipeline.log.entries if emb.pipeline.log
                                                                                       else [])
            assert torch.equal(before[0], after[0]) and torch.equal(before[1], after[1])
            assert before[2:] <= after[2:] and after[2] == 4 and not emb.pipeline.pending()
            continue
        train_step(batch, emb, opt)
    assert raised == 1
    loader.close()
    table = emb.weight.clone(), emb.optm_state.clone()
    emb.close()
    if mode == "oac":
        ref_emb, ref_opt, ref_loader = setup("sync", opt_cls=dgl_oac.SparseAdam)
        for i, batch in enumerate(ref_loader):
            if i == 12:
                break
            if i != 4:
                train_step(batch, ref_emb, ref_opt)
        ref_loader.close()
        assert torch.equal(table[0], ref_emb.weight) and torch.equal(table[1], ref_emb.optm_state)
        ref_emb.close()


# --- the write-back thread ---------------------------------------------------------------------------------------
def test_writeback_dying_behind_a_full_queue_cannot_hang_step():
    """writeback_depth=1: the thread blocks in a write, one more step fills its queue, the next step() waits for
    room; then the write fails and the thread ends. That step() raises the failure within 1 s."""
    before = live_threads()
    emb, opt, loader = setup("oac", writeback_depth=1)
    gate = threading.Event()
    write = emb.store.write

    def stuck_then_broken(ids, rows):
        if not gate.wait(10):
            raise AssertionError("never released")
        raise Boom("table write failed after a long stall")

    it = iter(loader)
    train_step(next(it), emb, opt)
    emb.flush()
    emb.store.write = stuck_then_broken
    train_step(next(it), emb, opt)  # taken by the thread, which now blocks in the write
    time.sleep(0.1)
    train_step(next(it), emb, opt)  # fills the queue (depth 1)
    batch = next(it)
    timer = threading.Timer(0.3, gate.set)
    timer.start()
    t0 = time.monotonic()
    with pytest.raises(Boom, match="after a long stall") as err:
        train_step(batch, emb, opt)  # waits for room, then must notice the dead thread
    elapsed = time.monotonic() - t0
    assert 0.25 < elapsed < 1.3, elapsed  # it did wait for the stall, and no longer than ~1 s after the failure
    assert "stuck_then_broken" in frames(err.value)
    with pytest.raises(Boom):  # the failure sticks: the table is missing steps, nothing may pretend otherwise
        emb.flush()
    emb.store.write = write
    loader.close()
    emb.close()
    timer.join()
    assert not started_since(before)


def test_slow_failing_writeback_reaches_a_waiting_flush_within_a_second():
    emb, opt, loader = setup("async")
    failing_at = []

    def slow_broken_add(ids, rows):
        time.sleep(0.4)
        failing_at.append(time.monotonic())
        raise Boom("add failed")

    it = iter(loader)
    train_step(next(it), emb, opt)
    emb.flush()
    emb.store.add = slow_broken_add
    train_step(next(it), emb, opt)
    with pytest.raises(Boom, match="add failed"):
        emb.flush()  # the caller is blocked here when the thread fails
    assert time.monotonic() - failing_at[0] < 1.0
    loader.close()
    emb.close()


# --- user code failing inside the loop ------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["sync", "async", "oac"])
@pytest.mark.parametrize("between", [True, False])
def test_user_exception_inside_with_stops_every_thread(mode, between):
    """An exception in the model (between next() and step(), or after step()) inside ``with loader:``: every
    dgl-oac thread is gone afterwards, no read is open, and the table holds exactly the committed steps."""
    before = live_threads()
    emb, opt, loader = setup(mode)
    with pytest.raises(ZeroDivisionError):
        with loader:
            for i, batch in enumerate(loader):
                if i == 6 and between:
                    raise ZeroDivisionError("model blew up before step()")
                train_step(batch, emb, opt)
                if i == 6:
                    raise ZeroDivisionError("model blew up after step()")
    del batch  # (the batch the model failed on is released once nothing holds it)
    assert not started_since(before)
    assert emb.pipeline.clock.open_reads() == 0 and not emb.pipeline.pending() and emb.pipeline.writer is None
    steps = 6 if between else 7
    assert emb.pipeline.steps == steps
    if mode != "async":
        ref = reference_table(steps)
        assert torch.equal(emb.weight, ref[0]) and torch.equal(emb.optm_state, ref[1])
