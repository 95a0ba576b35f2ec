"""dgl_oac.BatchLoader (any batch source) and DataLoader(attach=False): every mode, oac bitwise equal to sync,
the same stream in every mode for sources that draw from global RNGs, rows served from the prefetch, and the
warnings when prefetched rows go unused (a silent bypass)."""
import random
import warnings

import dgl
import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader as TorchLoader, IterableDataset

import dgl_oac

from conftest import oac_threads, power_law_graph, seeded_init

pytestmark = [pytest.mark.hang_timeout(60)]
MODES = ("sync", "async", "oac")
N, D = 40, 4


class Triples(IterableDataset):
    """Infinite (heads, tails) drawn from torch's and Python's global generators, as DGL's PinSAGE source does."""

    def __iter__(self):
        while True:
            heads = torch.randint(0, N, (6,))
            tails = torch.tensor([random.randrange(N) for _ in range(6)])
            yield heads, tails


def collate(items):
    heads, tails = items[0]
    return torch.stack([heads, tails])  # int64[2, 6]: ids of any shape


def train(make_emb, mode, source, ids_fn=lambda b: b, steps=25, prefetch=3, seed=7, dropout=True):
    """Train a skip-gram-like loss over ``source``; the loop draws from the global RNG too (dropout)."""
    torch.manual_seed(0)
    random.seed(0)
    emb = make_emb(N, D, init=seeded_init(1))
    opt = dgl_oac.SparseAdam([emb], lr=0.05)
    loader = dgl_oac.BatchLoader(source, ids={emb: ids_fn}, mode=mode, prefetch=prefetch, seed=seed)
    seen, losses = [], []
    for step, batch in enumerate(loader):
        seen.append(batch.clone())
        x = emb(batch.reshape(-1)).reshape(*batch.shape, D)
        h = F.dropout(x[0], 0.3) if dropout else x[0]
        loss = -F.logsigmoid((h * x[1]).sum(-1)).mean() + 0.1 * emb(batch[0]).pow(2).sum()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if step + 1 == steps:
            break
    loader.close()
    return emb.weight.clone(), losses, seen, loader.stats


def test_every_mode_runs_a_torch_dataloader_source_and_oac_equals_sync_bitwise(make_emb):
    before = set(oac_threads())
    runs = {m: train(make_emb, m, TorchLoader(Triples(), collate_fn=collate)) for m in MODES}
    w_sync, l_sync, s_sync, _ = runs["sync"]
    w_oac, l_oac, s_oac, st = runs["oac"]
    # the stream is the same in every mode although the source and the loop both draw from torch's and
    # Python's global generators and oac pulls 3 batches ahead
    for m in MODES:
        assert all(torch.equal(a, b) for a, b in zip(runs[m][2], s_sync)) and len(runs[m][2]) == 25
    assert torch.equal(w_oac, w_sync) and l_oac == l_sync
    assert not torch.equal(runs["async"][0], w_sync)  # async reads stale rows: it is not exact
    # the pipeline ran: gathered on its thread, committed, rows served from the prefetch, rows patched
    assert st.committed == 25 and st.max_in_flight == 3 and st.rows_patched > 0
    assert st.seconds["gather"] > 0 and st.seconds["commit"] > 0
    assert st.rows_served == 25 * (12 + 6) and st.fresh_reads == 0
    assert runs["async"][3].rows_served == st.rows_served  # async is served from its (stale) rows too
    assert set(oac_threads()) <= before  # every gather and write-back thread stopped


def test_generator_source_without_seed_gives_one_stream_in_every_mode(make_emb):
    def walks():  # a generator drawing from torch's global generator; seed=None: drawn from it at iter()
        while True:
            yield torch.randint(0, N, (2, 5))
    runs = {m: train(make_emb, m, walks(), seed=None) for m in MODES}
    for m in ("async", "oac"):
        assert all(torch.equal(a, b) for a, b in zip(runs[m][2], runs["sync"][2]))
    assert torch.equal(runs["oac"][0], runs["sync"][0])


def test_the_callers_draws_are_not_moved_by_the_loader(make_emb):
    """The loop's own random numbers are those it draws without any loader (the source has its own states)."""
    def noisy():
        while True:
            torch.rand(100)  # a source that draws a lot
            yield torch.randint(0, N, (2, 3))
    emb = make_emb(N, D)
    torch.manual_seed(3)
    expected = [torch.rand(2) for _ in range(5)]
    torch.manual_seed(3)
    got = []
    with dgl_oac.BatchLoader(noisy(), ids={emb: lambda b: b}, mode="oac", prefetch=2, seed=1) as loader:
        for i, _ in enumerate(loader):
            got.append(torch.rand(2))
            if i == 4:
                break
    assert all(torch.equal(a, b) for a, b in zip(got, expected))


def test_finite_source_ends_and_iterates_again(make_emb):
    emb = make_emb(N, D, init=seeded_init(2))
    opt = dgl_oac.SparseSGD([emb], lr=0.1)
    data = [torch.tensor([i, i + 1]) for i in range(7)]
    loader = dgl_oac.BatchLoader(data, ids={emb: lambda b: b}, mode="oac", prefetch=2)
    assert len(loader) == 7
    for _ in range(2):
        count = 0
        for b in loader:
            emb(b).sum().backward()
            opt.step()
            count += 1
        assert count == 7
    assert loader.stats.committed == 14


def test_nn_embedding_keys_are_passed_through():
    """torch's own nn.Embedding: nothing to prefetch; the loader yields the source's batches."""
    table = torch.nn.Embedding(N, D, sparse=True)
    loader = dgl_oac.BatchLoader([torch.tensor([1, 2])] * 3, ids={table: lambda b: b}, mode="oac")
    assert [b.tolist() for b in loader] == [[1, 2]] * 3 and loader.stats.rows_read == 0


def test_bad_input_is_named(make_emb):
    emb = make_emb(N, D)
    with pytest.raises(TypeError, match="iterable of batches"):
        dgl_oac.BatchLoader(3, ids={emb: lambda b: b})
    with pytest.raises(TypeError, match="non-empty dict"):
        dgl_oac.BatchLoader([], ids=[emb])
    with pytest.raises(TypeError, match="keys must be dgl_oac.NodeEmbedding"):
        dgl_oac.BatchLoader([], ids={"emb": lambda b: b})
    with pytest.raises(TypeError, match=r"ids\['.*'\]\(batch\) must return an int64 tensor.*float32"):
        list(dgl_oac.BatchLoader([torch.ones(2)], ids={emb: lambda b: b}, mode="sync"))
    with pytest.raises(IndexError, match=r"ids\['.*'\]\(batch\) out of range: found id 45"):
        list(dgl_oac.BatchLoader([torch.tensor([N + 5])], ids={emb: lambda b: b}, mode="oac", prefetch=1))


def test_unused_prefetched_rows_warn_once_naming_the_cost(make_emb):
    """Regression: ids that name other rows than the model reads leave the pipeline idle; it is said, once."""
    emb = make_emb(N, D, init=seeded_init(3))
    opt = dgl_oac.SparseAdam([emb], lr=0.05)
    batches = [torch.tensor([i % N, (i + 1) % N]) for i in range(6)]
    loader = dgl_oac.BatchLoader(batches, ids={emb: lambda b: b + 10}, mode="oac", prefetch=2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for b in loader:
            emb(b).sum().backward()
            opt.step()
    msgs = [str(w.message) for w in caught if "pipeline did nothing" in str(w.message)]
    assert len(msgs) == 1 and "gather and commit seconds near 0" in msgs[0]
    assert loader.stats.rows_served == 0 and loader.stats.fresh_reads == 6 and loader.stats.committed == 0


def test_dropped_attached_rows_then_emb_input_nodes_warns(make_emb):
    """Regression (issue 25): rows deleted from srcdata and read again with emb(input_nodes) ran unpipelined,
    silently (commit 0.00 s)."""
    g = power_law_graph(60)
    emb = make_emb(g.num_nodes(), D)
    opt = dgl_oac.SparseAdam([emb], lr=0.05)
    loader = dgl_oac.DataLoader(g, torch.arange(30), dgl.dataloading.NeighborSampler([3]), embeddings=[emb],
                                mode="oac", prefetch=2, batch_size=10)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for input_nodes, _, blocks in loader:
            del blocks[0].srcdata[emb.name]
            emb(input_nodes).sum().backward()
            opt.step()
    msgs = [str(w.message) for w in caught if "dropped unused" in str(w.message)]
    assert len(msgs) == 1 and "attach=False" in msgs[0]
    assert loader.stats.committed == 0


def train_graph(make_emb, mode, attach):
    g = power_law_graph(80, seed=1)
    emb = make_emb(g.num_nodes(), D, init=seeded_init(4))
    lin = torch.nn.Linear(D, 1)
    torch.nn.init.constant_(lin.weight, 0.5)
    torch.nn.init.constant_(lin.bias, 0.1)
    opt = dgl_oac.SparseAdam([emb], lr=0.05)
    loader = dgl_oac.DataLoader(g, torch.arange(60), dgl.dataloading.NeighborSampler([4]), embeddings=[emb],
                                mode=mode, prefetch=3, batch_size=8, seed=0, attach=attach)
    for input_nodes, output_nodes, blocks in loader:
        if not attach:  # a model that iterates srcdata (PinSAGE's LinearProjector) sees the sampler's data only
            assert set(blocks[0].srcdata.keys()) == {dgl.NID}
            x = emb(input_nodes)
        else:
            x = blocks[0].srcdata[emb.name]
        lin(x).pow(2).sum().backward()
        opt.step()
    return emb.weight.clone(), loader.stats


def test_attach_false_serves_the_prefetched_rows_through_emb_input_nodes(make_emb):
    w_sync, _ = train_graph(make_emb, "sync", attach=True)
    w_oac, st = train_graph(make_emb, "oac", attach=False)
    assert torch.equal(w_oac, w_sync)
    assert st.committed == st.batches == 8 and st.seconds["gather"] > 0


def test_nn_embedding_is_accepted_wherever_a_node_embedding_is():
    """dgl_oac.nn.Embedding keys a BatchLoader, joins a DataLoader's embeddings and a DGL-style optimizer."""
    from dgl_oac.nn import Embedding, SparseAdam
    torch.manual_seed(0)
    emb = Embedding(N, D, sparse=True)
    opt = SparseAdam(emb.parameters(), lr=0.1)
    loader = dgl_oac.BatchLoader([torch.tensor([[1, 2], [2, 3]])] * 4, ids={emb: lambda b: b}, mode="oac",
                                 prefetch=2)
    for b in loader:
        emb(b).sum().backward()
        opt.step()
    assert loader.embeddings == [emb.node_embedding] and loader.stats.committed == 4
    assert loader.stats.rows_served == 4 * 4
    g = power_law_graph(50)
    other = Embedding(g.num_nodes(), D, sparse=True)
    dl = dgl_oac.DataLoader(g, torch.arange(10), dgl.dataloading.NeighborSampler([2]), embeddings=[other],
                            batch_size=5)
    assert dl.embeddings == [other.node_embedding]
    assert dgl_oac.SparseSGD([other], lr=0.1)._params == [other.node_embedding]
    emb.node_embedding.close()
    other.node_embedding.close()


def test_torch_dataloader_with_worker_processes_gives_one_stream_in_every_mode(make_emb):
    """torch's workers are seeded from a base seed drawn at iter(source): inside the loader's own states."""
    streams = {}
    for mode in ("sync", "oac"):
        source = TorchLoader(Triples(), collate_fn=collate, num_workers=2)
        streams[mode] = train(make_emb, mode, source, steps=6)[2]
    assert all(torch.equal(a, b) for a, b in zip(streams["oac"], streams["sync"])) and len(streams["oac"]) == 6
