"""dgl_oac.sampling: ``reproducible`` makes a batch a function of its seed and leaves the caller's RNGs alone."""

import dgl
import torch

from dgl_oac.sampling import batch_seed, reproducible

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
