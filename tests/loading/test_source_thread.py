"""BatchLoader(pull_thread=True) (dgl_oac.loading.source_thread): the source pulled on a background thread gives the
stream the caller's thread gives, in every mode, and trains the same bits; a failure inside the source reaches
the caller with its traceback; breaking out, close() and dropping the loader leave no thread; a slow or stuck
source does not hold up close()."""
from __future__ import annotations

import gc
import random
import threading
import time
import traceback

import pytest
import torch
import torch.nn.functional as F

import dgl_oac
import dgl_oac.loading.source_thread as source_thread

from conftest import oac_threads, seeded_init

pytestmark = [pytest.mark.hang_timeout(60)]
N, D = 40, 4


def own_rng_source(names=None, fail_at=None):
    """Batches from generators of the source's own (what a background pull needs); ``names`` records the thread
    each batch was made on; batch ``fail_at`` raises."""
    gen, rnd = torch.Generator().manual_seed(11), random.Random(12)
    i = 0
    while True:
        if names is not None:
            names.append(threading.current_thread().name)
        if i == fail_at:
            raise ValueError(f"source cannot make batch {i}")
        heads = torch.randint(0, N, (6,), generator=gen)
        yield torch.stack([heads, torch.tensor([rnd.randrange(N) for _ in range(6)])])
        i += 1


def train(make_emb, mode, pull_thread, steps=20, names=None):
    """A skip-gram-like loss whose loop draws from torch's global generator (dropout) while the source runs."""
    torch.manual_seed(0)
    emb = make_emb(N, D, init=seeded_init(1))
    opt = dgl_oac.SparseAdam([emb], lr=0.05)
    loader = dgl_oac.BatchLoader(own_rng_source(names), ids={emb: lambda b: b}, mode=mode, prefetch=3, seed=7,
                                 pull_thread=pull_thread)
    seen = []
    for step, batch in enumerate(loader):
        seen.append(batch.clone())
        x = emb(batch.reshape(-1)).reshape(*batch.shape, D)
        loss = -F.logsigmoid((F.dropout(x[0], 0.3) * x[1]).sum(-1)).mean()
        loss.backward()
        opt.step()
        if step + 1 == steps:
            break
    loader.close()
    return emb.weight.clone(), emb.optm_state.clone(), seen


def threads_end(before: set, within: float = 10.0) -> bool:
    """Whether every dgl-oac thread not in ``before`` ends within ``within`` seconds (a hang detector: a busy
    machine may take longer than a quiet one, never forever)."""
    deadline = time.monotonic() + within
    while set(oac_threads()) - before and time.monotonic() < deadline:
        time.sleep(0.02)
    return set(oac_threads()) <= before


def test_the_thread_pulls_the_callers_stream_and_every_mode_trains_the_same_bits(make_emb):
    before = set(oac_threads())
    names = []
    runs = {(mode, thread): train(make_emb, mode, thread, names=names if (mode, thread) == ("oac", True) else None)
            for mode in ("sync", "oac") for thread in (False, True)}
    reference = runs[("sync", False)]
    for key, (weight, state, seen) in runs.items():
        assert len(seen) == 20 and all(torch.equal(a, b) for a, b in zip(seen, reference[2])), key
        assert torch.equal(weight, reference[0]) and torch.equal(state, reference[1]), key
    assert set(names) == {"dgl-oac-source-e0"}  # every batch was made on the source's thread
    assert set(oac_threads()) <= before


def test_a_failure_inside_the_source_reaches_the_caller_with_its_traceback(make_emb):
    """The batches before it are handed out first; the exception is the source's own object, raised at once
    (not after a timeout), with the source's frame in its traceback; the epoch's threads end."""
    before = set(oac_threads())
    emb = make_emb(N, D)
    opt = dgl_oac.SparseSGD([emb], lr=0.1)
    loader = dgl_oac.BatchLoader(own_rng_source(fail_at=3), ids={emb: lambda b: b}, mode="oac", prefetch=2,
                                 pull_thread=True)
    handed = 0
    t0 = time.perf_counter()
    with pytest.raises(ValueError, match="source cannot make batch 3") as info:
        for batch in loader:
            emb(batch.reshape(-1)).sum().backward()
            opt.step()
            handed += 1
    assert handed == 3 and time.perf_counter() - t0 < 5
    frames = [f.name for f in traceback.extract_tb(info.value.__traceback__)]
    assert "own_rng_source" in frames
    assert any("dgl-oac-source-e0" in note for note in getattr(info.value, "__notes__", ["dgl-oac-source-e0"]))
    assert set(oac_threads()) <= before


@pytest.mark.parametrize("end", ["close", "drop"])
def test_breaking_out_then_close_or_drop_leaves_no_thread(make_emb, end):
    before = set(oac_threads())
    emb = make_emb(N, D)
    loader = dgl_oac.BatchLoader(own_rng_source(), ids={emb: lambda b: b}, mode="oac", prefetch=2,
                                 pull_thread=True)
    for i, batch in enumerate(loader):
        assert any(n.startswith("dgl-oac-source") for n in oac_threads())
        if i == 2:
            break
    if end == "close":
        loader.close()
        loader.close()  # idempotent
    else:
        del loader, batch
        gc.collect()
    assert threads_end(before)


def test_a_slow_infinite_source_does_not_hold_up_close(make_emb):
    def slow():
        while True:
            time.sleep(0.3)
            yield torch.tensor([1, 2, 3])

    before = set(oac_threads())
    emb = make_emb(N, D)
    loader = dgl_oac.BatchLoader(slow(), ids={emb: lambda b: b}, mode="oac", prefetch=2, pull_thread=True)
    it = iter(loader)  # held: a dropped epoch closes at once
    next(it)
    t0 = time.perf_counter()
    loader.close()  # the thread is inside a pull: it stops once that pull ends
    assert time.perf_counter() - t0 < 5 and threads_end(before)  # one 0.3 s pull, not the endless source


def test_a_stuck_source_warns_at_close_and_its_thread_ends_after_the_pull(make_emb, monkeypatch):
    monkeypatch.setattr(source_thread.SourceThread.close, "__defaults__", (0.2,))
    release, waiting = threading.Event(), threading.Event()

    def stuck():  # the epoch takes batches 0 and 1 (prefetch 1); the thread, pulling ahead, waits in batch 3
        for i in range(3):
            yield torch.tensor([i])
        waiting.set()
        release.wait(30)  # a source waiting on something that never comes
        yield torch.tensor([3])

    before = set(oac_threads())
    emb = make_emb(N, D)
    loader = dgl_oac.BatchLoader(stuck(), ids={emb: lambda b: b}, mode="oac", prefetch=1, pull_thread=True)
    it = iter(loader)  # held: a dropped epoch closes at once
    next(it)
    assert waiting.wait(30)  # the thread is inside the stuck pull (on a busy machine it gets there later)
    t0 = time.perf_counter()
    with pytest.warns(RuntimeWarning, match="dgl-oac-source-e0 did not stop"):
        loader.close()
    assert time.perf_counter() - t0 < 5  # close's own timeout (0.2 s here), not the source's 30 s
    release.set()
    assert threads_end(before)


def test_pull_thread_must_be_a_bool(make_emb):
    with pytest.raises(TypeError, match="pull_thread must be True or False"):
        dgl_oac.BatchLoader([], ids={make_emb(N, D): lambda b: b}, pull_thread="yes")
