"""BatchLoader(generators="global"): the source draws from the global generators as the unwrapped loop does, so
the batches are the unwrapped loop's (torch's, Python's and numpy's generators), in every mode and at every
depth while the step draws nothing; a step that draws is detected and warned about once; oac == sync with
either setting."""
from __future__ import annotations

import random
import warnings

import numpy as np
import pytest
import torch

import dgl_oac

N, D = 500, 8


def source(n=12):
    """Batches drawing from all three global generators, as PyG's and DGL's samplers do."""
    for _ in range(n):
        a = torch.randint(0, N, (16,))
        b = torch.tensor([random.randrange(N) for _ in range(8)])
        c = torch.from_numpy(np.random.randint(0, N, 8))
        yield torch.cat([a, b, c])


def seed_all(s=0):
    torch.manual_seed(s)
    random.seed(s)
    np.random.seed(s)


def unwrapped():
    seed_all()
    return [b.clone() for b in source()]


def train(mode, generators, prefetch=4, draw=False):
    seed_all(1)
    emb = dgl_oac.nn.Embedding(N, D)
    opt = dgl_oac.nn.SparseAdam(emb.parameters(), lr=0.05)
    seed_all()
    kw = {} if generators is None else {"generators": generators}
    if generators != "global":
        kw["seed"] = 3
    loader = dgl_oac.BatchLoader(source(), ids={emb: lambda b: b}, mode=mode, prefetch=prefetch, **kw)
    seen = []
    gen = torch.Generator().manual_seed(5)
    for b in loader:
        seen.append(b.clone())
        scale = torch.rand(()) if draw else torch.rand((), generator=gen)  # the step's own draws
        (emb(b).square().sum() * scale).backward()
        opt.step()
        opt.zero_grad()
    loader.close()
    return seen, emb.weight.clone()


@pytest.mark.parametrize("mode,prefetch", [("sync", 1), ("oac", 4), ("async", 2), ("oac", "auto")])
def test_global_generators_give_the_unwrapped_loops_batches(mode, prefetch):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the step draws nothing global: no warning
        seen, _ = train(mode, "global", prefetch)
    ref = unwrapped()
    assert len(seen) == len(ref) and all(torch.equal(a, b) for a, b in zip(seen, ref))


def test_the_default_keeps_a_stream_of_its_own():
    seen, _ = train("oac", None)
    assert not all(torch.equal(a, b) for a, b in zip(seen, unwrapped()))


@pytest.mark.parametrize("generators", ["global", "loader"])
def test_oac_equals_sync_with_either_setting(generators):
    sync_batches, sync_w = train("sync", generators)
    oac_batches, oac_w = train("oac", generators)
    assert all(torch.equal(a, b) for a, b in zip(sync_batches, oac_batches))
    assert torch.equal(sync_w, oac_w)


def test_a_step_that_draws_is_warned_about_once():
    with pytest.warns(RuntimeWarning, match="drew from the global random generators") as record:
        train("oac", "global", draw=True)
    assert sum("drew from the global" in str(w.message) for w in record) == 1


def test_refused_combinations():
    emb = dgl_oac.nn.Embedding(N, D)
    with pytest.raises(ValueError, match="generators must be one of 'loader', 'global', got 'own'"):
        dgl_oac.BatchLoader(source(), ids={emb: lambda b: b}, generators="own")
    with pytest.raises(ValueError, match="not seed="):
        dgl_oac.BatchLoader(source(), ids={emb: lambda b: b}, generators="global", seed=0)
    with pytest.raises(ValueError, match="pull_thread=True"):
        dgl_oac.BatchLoader(source(), ids={emb: lambda b: b}, generators="global", pull_thread=True)
