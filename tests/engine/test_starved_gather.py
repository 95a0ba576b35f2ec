"""A gather thread that gets no core (idle priority beside a busy process): the caller gathers the batch due
itself instead of waiting for it (dgl_oac.engine.runtime.Worker.result), and oac still trains sync's bits."""
from __future__ import annotations

import threading
import time

import pytest
import torch

import dgl_oac
from dgl_oac.engine import runtime

from conftest import seeded_init

pytestmark = pytest.mark.hang_timeout(120)
N, D = 40, 4


def batches(n=16):
    gen = torch.Generator().manual_seed(4)
    return [torch.randint(0, N, (6,), generator=gen) for _ in range(n)]


def train(mode):
    emb = dgl_oac.NodeEmbedding(N, D, f"starved-{mode}", init_func=seeded_init(3))
    opt = dgl_oac.SparseAdam([emb], lr=0.05)
    loader = dgl_oac.BatchLoader(batches(), ids={emb: lambda b: b}, mode=mode, prefetch=3)
    for b in loader:
        emb(b).square().sum().backward()
        opt.step()
    return emb.weight.clone(), emb.optm_state.clone(), loader.stats


@pytest.fixture
def starved_gather(monkeypatch):
    """The gather thread takes each item late, as a thread the scheduler keeps off the cores would."""
    real_get = runtime.get

    def late_get(q, stop, alive=None, what="queue"):
        if threading.current_thread().name.startswith("dgl-oac-gather") and what.startswith("dgl-oac-gather"):
            time.sleep(0.05)
        return real_get(q, stop, alive, what)

    monkeypatch.setattr(runtime, "get", late_get)


def test_the_caller_gathers_what_a_starved_thread_has_not_started_and_oac_stays_exact(starved_gather):
    weight, state, stats = train("oac")
    ref_weight, ref_state, _ = train("sync")
    assert torch.equal(weight, ref_weight) and torch.equal(state, ref_state)
    assert stats.gathered_by_caller > 0 and stats.as_dict()["gathered_by_caller"] == stats.gathered_by_caller
    assert stats.batches == 16


def test_a_gather_thread_that_keeps_up_gathers_the_batches_itself():
    """With time between batches the thread has taken every batch long before it is due: at most the epoch's
    first (asked for right after it was queued) is gathered on the caller."""
    emb = dgl_oac.NodeEmbedding(N, D, "keeps-up", init_func=seeded_init(3))
    loader = dgl_oac.BatchLoader(batches(8), ids={emb: lambda b: b}, mode="oac", prefetch=2)
    for _ in loader:
        time.sleep(0.05)
    assert loader.stats.batches == 8 and loader.stats.gathered_by_caller <= 1


def test_a_gather_failing_on_the_caller_says_which_stage_and_leaves_no_thread(starved_gather):
    emb = dgl_oac.NodeEmbedding(N, D, "starved-fail", init_func=seeded_init(3))
    real, calls = emb.store.gather, [0]

    def gather(*args, **kwargs):
        calls[0] += 1
        if calls[0] == 4:
            raise OSError("disk gone")
        return real(*args, **kwargs)

    emb.store.gather = gather
    loader = dgl_oac.BatchLoader(batches(), ids={emb: lambda b: b}, mode="oac", prefetch=3)
    handed = 0
    with pytest.raises(OSError, match="disk gone") as err:
        for _ in loader:
            handed += 1
    assert handed == 3 and loader.stats.gathered_by_caller > 0
    assert any("dgl-oac-gather-e0" in note for note in err.value.__notes__)
    assert not [t for t in threading.enumerate() if t.name.startswith("dgl-oac-gather") and t.is_alive()]
    emb.close()


def test_batches_queued_for_a_starved_thread_keep_the_table_busy(starved_gather):
    """A batch read ahead is in flight from its submission, not only once the (late) thread opens its read: the
    table refuses to be replaced until the loader closes, and is idle after."""
    emb = dgl_oac.NodeEmbedding(N, D, "starved-busy", init_func=seeded_init(3))
    loader = dgl_oac.BatchLoader(batches(), ids={emb: lambda b: b}, mode="oac", prefetch=3)
    it = iter(loader)
    next(it)
    assert emb.pipeline.queued_reads == 3  # batches 1-3, submitted; whether the thread has opened them or not
    with pytest.raises(RuntimeError, match="while batches are in flight"):
        emb.pipeline.reset()
    loader.close()
    assert emb.pipeline.queued_reads == 0
    emb.close()
