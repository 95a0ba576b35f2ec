"""dgl_oac.dgl_frontend.sampling: ``reproducible`` makes a batch a function of its seed and leaves the caller's
RNGs alone."""

import os
import subprocess
import sys
from pathlib import Path

import dgl
import pytest
import torch

from dgl_oac.dgl_frontend.sampling import batch_seed, reproducible

SAMPLER = dgl.dataloading.NeighborSampler([3, 3])
SEEDS = torch.arange(10, 40, 3)


def batch_key(batch):
    """Everything a sampled node batch is, in order: input nodes, output nodes, each block's ids and edges."""
    input_nodes, output_nodes, blocks = batch
    key = [input_nodes.tolist(), output_nodes.tolist()]
    for b in blocks:
        u, v, e = b.edges(form="all", order="eid")
        key += [b.srcdata[dgl.NID].tolist(), b.dstdata[dgl.NID].tolist(), u.tolist(), v.tolist(),
                b.edata[dgl.EID].tolist()]
    return key


def user_draw():
    """A user's own DGL random call (DGL's RNG, not torch's)."""
    return torch.stack(dgl.rand_graph(100, 50).edges())


def sample_and_draw(graph, loader_seed, user_seed, batches=2):
    """``dgl.seed(user_seed)``, then per batch: sample it, then make a user DGL call. -> (batch keys, draws)"""
    dgl.seed(user_seed)
    keys, draws = [], []
    for b in range(batches):
        with reproducible(batch_seed(loader_seed, 0, b)):
            keys.append(batch_key(SAMPLER.sample(graph, SEEDS)))
        draws.append(user_draw())
    return keys, draws


def test_batches_are_a_function_of_the_seed(graph):
    keys, _ = sample_and_draw(graph, loader_seed=1, user_seed=0, batches=3)
    again, _ = sample_and_draw(graph, loader_seed=1, user_seed=5, batches=3)  # the user's DGL seed: no effect
    assert keys == again
    assert keys[0] != keys[1] != keys[2]
    other, _ = sample_and_draw(graph, loader_seed=2, user_seed=0, batches=3)
    assert other != keys


def test_user_dgl_rng_after_a_batch_does_not_depend_on_the_loader_seed(graph):
    """After a batch, the user's DGL calls follow the user's ``dgl.seed``, not the loader's seed, and differ
    from batch to batch."""
    _, draws = sample_and_draw(graph, loader_seed=1, user_seed=0)
    _, other_loader = sample_and_draw(graph, loader_seed=2, user_seed=0)
    _, other_user = sample_and_draw(graph, loader_seed=1, user_seed=1)
    assert all(torch.equal(a, b) for a, b in zip(draws, other_loader))
    assert not torch.equal(draws[0], draws[1])
    assert not torch.equal(draws[0], other_user[0])


def test_torch_rng_and_threads_restored(graph):
    threads = dgl.utils.get_num_threads()
    torch.manual_seed(3)
    expect = torch.rand(5)
    torch.manual_seed(3)
    with reproducible(123):
        SAMPLER.sample(graph, SEEDS)
        torch.rand(7)
        assert dgl.utils.get_num_threads() == 1
    assert torch.equal(torch.rand(5), expect)
    assert dgl.utils.get_num_threads() == threads


# One process: a batch sampled under `reproducible`, a 2-layer SAGE forward/backward on it with torch's default
# threads; prints a digest of the batch and of the leaf and parameter gradients. With "other-thread-first",
# another thread calls dgl.seed before the sampling thread does (what losing the race among DGL's OpenMP
# threads at a user's first dgl.seed does to the sampling thread in some processes).
_ONE_PROCESS = """
import hashlib, sys, threading
import dgl, torch
import torch.nn.functional as F
from dgl_oac.app.models.sage import SAGE
from dgl_oac.dgl_frontend.sampling import batch_seed, reproducible
from conftest import power_law_graph

if sys.argv[1] == "other-thread-first":
    t = threading.Thread(target=dgl.seed, args=(0,))
    t.start()
    t.join()
g = power_law_graph(300, seed=0)
with reproducible(batch_seed(0, 0, 0)):
    input_nodes, output_nodes, blocks = dgl.dataloading.MultiLayerFullNeighborSampler(2).sample(g, torch.arange(16))
torch.manual_seed(0)
model = SAGE(8, 8, 3, 2)
x = torch.randn(len(input_nodes), 8, generator=torch.Generator().manual_seed(1)).requires_grad_()
F.cross_entropy(model(blocks, x), output_nodes % 3).backward()
parts = [input_nodes] + [torch.cat(b.edges(form="all", order="eid")) for b in blocks] + [x.grad]
parts += [p.grad.flatten() for p in model.parameters()]
print(hashlib.sha1(b"".join(p.numpy().tobytes() for p in parts)).hexdigest())
"""


@pytest.mark.slow
def test_batch_and_gradients_equal_whichever_thread_seeded_dgl_first():
    """Fresh processes: the sampling thread's DGL RNG stream (so the batch's node and edge order, so the
    gradients) must not depend on which thread seeded DGL first."""
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), str(root / "tests")])}
    digests = [subprocess.run([sys.executable, "-c", _ONE_PROCESS, first], cwd=root, env=env, check=True,
                              capture_output=True, text=True, timeout=120).stdout.strip()
               for first in ("sampling-thread-first", "other-thread-first")]
    assert len(digests[0]) == 40 and digests[0] == digests[1]
