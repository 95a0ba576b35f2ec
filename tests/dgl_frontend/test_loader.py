"""dgl_oac.DataLoader: same batches as dgl.dataloading.DataLoader, embedding rows attached where models look,
reproducible streams, input validation, ``emb(ids)`` inside an iteration, resume from ``state_dict``."""
import threading
import warnings

import dgl
import dgl.function as fn
import pytest
import torch
import torch.nn.functional as F

import dgl_oac
from dgl_oac.dgl_frontend.blocks import IndexBlock
from dgl_oac.sampling import batch_seed

from conftest import oac_threads, oac_threads_left, power_law_graph
from helpers import train_step

pytestmark = [pytest.mark.hang_timeout(60), pytest.mark.filterwarnings("ignore:Dataloader CPU affinity")]
MODES = ("sync", "async", "oac")


def block_key(block):
    u, v = block.edges()
    return (block.srcdata[dgl.NID].tolist(), block.dstdata[dgl.NID].tolist(), u.tolist(), v.tolist(),
            block.edata[dgl.EID].tolist())


def batch_key(batch):
    """Everything a node-classification batch carries, as plain lists (comparable with ==)."""
    input_nodes, output_nodes, blocks = batch
    return input_nodes.tolist(), output_nodes.tolist(), [block_key(b) for b in blocks]


def global_block_key(block):
    """Order-free view of a block: its node sets and global (src, dst, eid) edges."""
    u, v = block.edges()
    src, dst = block.srcdata[dgl.NID], block.dstdata[dgl.NID]
    edges = sorted(zip(src[u].tolist(), dst[v].tolist(), block.edata[dgl.EID].tolist()))
    return sorted(src.tolist()), sorted(dst.tolist()), edges


class SeededPerBatch(dgl.dataloading.Sampler):
    """Wraps a sampler so DGL's RNG is seeded per batch exactly as dgl_oac's loader does (shuffle=False)."""

    def __init__(self, inner, seed):
        super().__init__()
        self.inner, self.seed, self.b = inner, seed, 0

    def sample(self, g, seeds):
        dgl.seed(batch_seed(self.seed, 0, self.b))
        torch.default_generator.manual_seed(batch_seed(self.seed, 0, self.b))
        self.b += 1
        return self.inner.sample(g, seeds)


# --- the same batches as dgl.dataloading.DataLoader --------------------------------------------------------------
def test_node_batches_equal_dgl(graph, single_dgl_thread):
    """Exact equality with DGL's loader for the same RNG stream; order-free equality with plain DGL.

    Measured: with one OpenMP thread, MultiLayerFullNeighborSampler's block node order still changes between
    calls unless DGL's RNG is reseeded (to_block draws from it), so the exact comparison reseeds per batch."""
    sampler = dgl.dataloading.MultiLayerFullNeighborSampler(2)
    idx = torch.arange(3, graph.num_nodes(), 2)
    ours = list(dgl_oac.DataLoader(graph, idx, sampler, embeddings=[], batch_size=9, seed=7))
    ref = list(dgl.dataloading.DataLoader(graph, idx, SeededPerBatch(sampler, 7), batch_size=9, shuffle=False))
    plain = list(dgl.dataloading.DataLoader(graph, idx, sampler, batch_size=9, shuffle=False))
    assert len(ours) == len(ref) == len(plain) == 7
    assert [batch_key(b) for b in ours] == [batch_key(b) for b in ref]
    for a, b in zip(ours, plain):
        assert torch.equal(a[1], b[1])
        assert sorted(a[0].tolist()) == sorted(b[0].tolist())
        assert [global_block_key(x) for x in a[2]] == [global_block_key(x) for x in b[2]]


def test_edge_prediction_batches_equal_dgl(graph, single_dgl_thread):
    sampler = dgl.dataloading.as_edge_prediction_sampler(dgl.dataloading.MultiLayerFullNeighborSampler(1))
    eids = torch.arange(0, graph.num_edges(), 5)
    ours = list(dgl_oac.DataLoader(graph, eids, sampler, embeddings=[], batch_size=16, seed=3))
    ref = list(dgl.dataloading.DataLoader(graph, eids, SeededPerBatch(sampler, 3), batch_size=16, shuffle=False))
    assert len(ours) == len(ref) == 9
    for (i_a, pair_a, blocks_a), (i_b, pair_b, blocks_b) in zip(ours, ref):
        assert torch.equal(i_a, i_b)
        assert torch.equal(pair_a.ndata[dgl.NID], pair_b.ndata[dgl.NID])
        assert torch.equal(pair_a.edata[dgl.EID], pair_b.edata[dgl.EID])
        for x, y in zip(pair_a.edges(), pair_b.edges()):
            assert torch.equal(x, y)
        assert [block_key(b) for b in blocks_a] == [block_key(b) for b in blocks_b]
    # the positive pairs are the requested edges
    got = torch.cat([p.edata[dgl.EID] for _, p, _ in ours])
    assert torch.equal(got, eids)


# --- embedding rows ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("structure", ["auto", "index"])
@pytest.mark.parametrize("mode", MODES)
def test_rows_attached_on_device(graph, make_emb, devices, mode, structure):
    """Rows land in ``blocks[0].srcdata`` on the device, DGL's blocks or index blocks alike (on CUDA without
    DGL's CUDA build "auto" is index blocks: they have DGL's ``.device`` too, regression)."""
    emb = make_emb(graph.num_nodes(), 6)
    loader = dgl_oac.DataLoader(graph, torch.arange(graph.num_nodes()), dgl.dataloading.NeighborSampler([4, 4]),
                                embeddings=[emb], mode=mode, device=devices, batch_size=20, seed=0,
                                structure=structure)
    n = 0
    for input_nodes, output_nodes, blocks in loader:  # no optimizer: evaluation-style pass
        assert isinstance(blocks[0], IndexBlock) == (loader.structure == "index")
        x = blocks[0].srcdata[emb.name]
        assert x.device.type == torch.device(devices).type and blocks[0].device.type == x.device.type
        assert x.requires_grad and x.is_leaf and x.dtype == torch.float32 and x.shape == (len(input_nodes), 6)
        assert torch.equal(x.detach().cpu(), emb.weight[input_nodes.cpu()])
        n += 1
    assert n == len(loader) == 6
    loader.close()


@pytest.mark.parametrize("mode", ["sync", "oac"])
def test_rows_equal_current_table_while_training(graph, make_emb, mode):
    """sync reads fresh rows; oac validates prefetched rows to the same values: every batch equals the table."""
    emb = make_emb(graph.num_nodes(), 4)
    opt = dgl_oac.SparseAdagrad([emb], lr=0.2)
    loader = dgl_oac.DataLoader(graph, torch.arange(graph.num_nodes()), dgl.dataloading.NeighborSampler([5, 5]),
                                embeddings=[emb], mode=mode, batch_size=10, shuffle=True, seed=4, prefetch=4,
                                background_priority="normal")  # gathers early: prefetched rows go stale
    for batch in loader:
        assert torch.equal(batch[2][0].srcdata[emb.name].detach(), emb.weight[batch[0]])
        train_step(batch, emb, opt)
    assert emb.pipeline.steps == len(loader)
    if mode == "oac":
        assert loader.stats.rows_patched > 0  # the check above was not vacuous: prefetched rows went stale


class PairSampler(dgl.dataloading.Sampler):
    """A zero-layer edge sampler (what as_edge_prediction_sampler cannot do in DGL 1.1.3): (input_nodes,
    pair_graph, neg_pair_graph, []) over the compacted endpoints of the seed edges and one corrupted tail each."""

    samples_edges = True

    def sample(self, g, eids):
        src, dst = g.find_edges(eids)
        neg = (dst * 7 + 3) % g.num_nodes()
        input_nodes, inv = torch.unique(torch.cat([src, dst, neg]), return_inverse=True)
        n, m = eids.numel(), input_nodes.numel()
        pair = dgl.graph((inv[:n], inv[n:2 * n]), num_nodes=m)
        neg_pair = dgl.graph((inv[:n], inv[2 * n:]), num_nodes=m)
        pair.edata[dgl.EID] = eids
        for h in (pair, neg_pair):
            h.ndata[dgl.NID] = input_nodes
        return input_nodes, pair, neg_pair, []


def run_pair_training(graph, emb, mode):
    opt = dgl_oac.SparseAdam([emb], lr=0.05)
    loader = dgl_oac.DataLoader(graph, torch.arange(graph.num_edges()), PairSampler(), embeddings=[emb],
                                mode=mode, batch_size=64, shuffle=True, seed=2)
    for input_nodes, pair, neg_pair, blocks in loader:
        assert blocks == []
        x = pair.ndata[emb.name]
        assert neg_pair.ndata[emb.name] is x and x.requires_grad
        if mode != "async":
            assert torch.equal(x.detach(), emb.weight[input_nodes])
        pair.apply_edges(fn.u_dot_v(emb.name, emb.name, "s"))
        neg_pair.apply_edges(fn.u_dot_v(emb.name, emb.name, "s"))
        loss = -F.logsigmoid(pair.edata["s"]).mean() - F.logsigmoid(-neg_pair.edata["s"]).mean()
        loss.backward()
        opt.step()
    return emb.weight.clone()


def test_zero_layer_sampler_rows_on_pair_graphs(graph, make_emb):
    sync = run_pair_training(graph, make_emb(graph.num_nodes(), 4, init=5), "sync")
    oac = run_pair_training(graph, make_emb(graph.num_nodes(), 4, init=5), "oac")
    assert not torch.equal(sync, make_emb(graph.num_nodes(), 4, init=5).weight)
    assert torch.equal(sync, oac)


def test_attach_without_blocks_or_matching_graph_raises(graph, make_emb):
    class NoGraph(dgl.dataloading.Sampler):
        def sample(self, g, seeds):
            return seeds, seeds, []

    loader = dgl_oac.DataLoader(graph, torch.arange(10), NoGraph(), embeddings=[make_emb(graph.num_nodes(), 2)],
                                mode="sync", batch_size=5)
    with pytest.raises(ValueError, match="sampler returned no blocks and no graph over its 5 input nodes"):
        next(iter(loader))


# --- reproducibility ---------------------------------------------------------------------------------------------
def collect(graph, mode, seed, make_emb, epochs=2):
    emb = make_emb(graph.num_nodes(), 4)
    opt = dgl_oac.SparseSGD([emb], lr=0.1)
    loader = dgl_oac.DataLoader(graph, torch.arange(graph.num_nodes()), dgl.dataloading.NeighborSampler([5, 5]),
                                embeddings=[emb], mode=mode, batch_size=16, shuffle=True, seed=seed, prefetch=3)
    keys = []
    for _ in range(epochs):
        for batch in loader:
            keys.append(batch_key(batch))
            train_step(batch, emb, opt)
    return keys


def test_same_seed_same_stream_in_every_mode_under_background_load(graph, make_emb):
    stop = threading.Event()

    def hammer():
        g = power_law_graph(60, seed=9)
        while not stop.is_set():
            torch.randn(64, 64) @ torch.randn(64, 64)
            torch.randint(0, 100, (100,))
            torch.randperm(50)
            dgl.sampling.sample_neighbors(g, torch.arange(10), 3)

    ref = collect(graph, "sync", 11, make_emb)
    t = threading.Thread(target=hammer, name="hammer", daemon=True)
    t.start()
    try:
        for mode in MODES:
            assert collect(graph, mode, 11, make_emb) == ref, mode
    finally:
        stop.set()
        t.join(5)
    assert len(ref) == 16
    assert ref[:8] != ref[8:]  # epochs are shuffled differently
    assert collect(graph, "oac", 12, make_emb) != ref  # a different seed, a different stream


def test_user_rng_untouched(graph):
    torch.manual_seed(0)
    expect = torch.rand(5)
    torch.manual_seed(0)
    loader = dgl_oac.DataLoader(graph, torch.arange(graph.num_nodes()), dgl.dataloading.NeighborSampler([3]),
                                batch_size=30, shuffle=True, seed=1)
    for _ in loader:
        pass
    assert torch.equal(torch.rand(5), expect)


def test_seed_none_follows_torch_manual_seed(graph):
    def first_batch():
        loader = dgl_oac.DataLoader(graph, torch.arange(graph.num_nodes()), dgl.dataloading.NeighborSampler([3]),
                                    batch_size=30, shuffle=True)
        return batch_key(next(iter(loader)))

    torch.manual_seed(5)
    a = first_batch()
    torch.manual_seed(5)
    assert first_batch() == a


@pytest.mark.parametrize("drop_last,expect", [(False, 8), (True, 7)])
def test_len_and_drop_last(graph, drop_last, expect):
    idx = torch.arange(graph.num_nodes())  # 120 = 7 * 16 + 8
    loader = dgl_oac.DataLoader(graph, idx, dgl.dataloading.NeighborSampler([2]), batch_size=16,
                                drop_last=drop_last, shuffle=True, seed=0)
    assert len(loader) == expect
    batches = list(loader)
    assert len(batches) == expect
    sizes = [b[1].numel() for b in batches]
    assert sizes == [16] * 7 + ([] if drop_last else [8])
    seen = torch.cat([b[1] for b in batches])
    assert seen.unique().numel() == seen.numel()  # no seed twice in an epoch
    if not drop_last:
        assert torch.equal(seen.sort().values, idx)


# --- bad input -----------------------------------------------------------------------------------------------------
SAMPLER = dgl.dataloading.NeighborSampler([2])


@pytest.mark.parametrize("kwargs,exc,msg", [
    ({"indices": torch.arange(10, dtype=torch.int32)}, TypeError, "indices .* must have dtype torch.int64"),
    ({"indices": torch.tensor([0, 120])}, IndexError, r"found id 120, valid ids are 0..119"),
    ({"indices": torch.tensor([-3, 2])}, IndexError, r"found id -3, valid ids are 0..119"),
    ({"indices": {"user": torch.arange(3)}}, ValueError, r"unknown node type 'user' in indices; the graph has \['_N'\]"),
    ({"mode": "fast"}, ValueError, "unknown mode 'fast'"),
    ({"device": "tpu"}, ValueError, "unknown device 'tpu'"),
    ({"num_workers": -1}, ValueError, "num_workers must be an integer >= 0, got -1"),
    ({"num_workers": 1.5}, ValueError, "num_workers must be an integer >= 0"),
    ({"bogus": 1, "other": 2}, TypeError, "unknown DataLoader option.*: bogus, other"),
    ({"batch_size": 0}, ValueError, "batch_size must be an integer >= 1"),
    ({"prefetch": 0}, ValueError, "prefetch must be an integer >= 1"),
    ({"seed": 1.5}, ValueError, "seed must be an int"),
])
def test_bad_arguments(graph, kwargs, exc, msg):
    args = {"indices": torch.arange(10), **kwargs}
    with pytest.raises(exc, match=msg):
        dgl_oac.DataLoader(graph, args.pop("indices"), SAMPLER, **args)


def test_edge_indices_checked_against_edges(graph):
    sampler = dgl.dataloading.as_edge_prediction_sampler(SAMPLER)
    dgl_oac.DataLoader(graph, torch.tensor([graph.num_edges() - 1]), sampler)  # > num_nodes, still valid
    with pytest.raises(IndexError, match=f"edge ids.*valid ids are 0..{graph.num_edges() - 1}"):
        dgl_oac.DataLoader(graph, torch.tensor([graph.num_edges()]), sampler)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA error")
def test_cuda_requested_without_cuda(graph):
    with pytest.raises(ValueError, match="CUDA is not available"):
        dgl_oac.DataLoader(graph, torch.arange(10), SAMPLER, device="cuda")


def test_bad_embeddings(graph):
    wrong = dgl_oac.NodeEmbedding(100, 2, "wrong")
    with pytest.raises(ValueError, match="'wrong' has 100 rows but the graph has 120 nodes"):
        dgl_oac.DataLoader(graph, torch.arange(10), SAMPLER, embeddings=[wrong])
    a, b = dgl_oac.NodeEmbedding(120, 2, "x"), dgl_oac.NodeEmbedding(120, 3, "x")
    with pytest.raises(ValueError, match="embedding names must be unique"):
        dgl_oac.DataLoader(graph, torch.arange(10), SAMPLER, embeddings=[a, b])
    with pytest.raises(TypeError, match="embeddings must be dgl_oac.NodeEmbedding"):
        dgl_oac.DataLoader(graph, torch.arange(10), SAMPLER, embeddings=[torch.zeros(120, 2)])
    with pytest.raises(TypeError, match="graph must be a dgl.DGLGraph"):
        dgl_oac.DataLoader(None, torch.arange(10), SAMPLER)
    with pytest.raises(ValueError, match="keeps its table on the CPU"):
        dgl_oac.NodeEmbedding(120, 2, "dev", device="meta")
    with pytest.raises(ValueError, match="name must be a non-empty string"):
        dgl_oac.NodeEmbedding(120, 2, "")


def test_known_dgl_kwarg_warns(graph):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loader = dgl_oac.DataLoader(graph, torch.arange(10), SAMPLER, use_uva=True, persistent_workers=True)
    msgs = [str(w.message) for w in caught]
    assert any("use_uva" in m and "ignores" in m for m in msgs)
    assert any("persistent_workers" in m for m in msgs)
    assert all(w.filename == __file__ for w in caught if "ignores" in str(w.message))  # points at the caller
    assert len(list(loader)) == 10  # batch_size=1 by default, as in DGL


# --- emb(ids) inside an iteration --------------------------------------------------------------------------------
def test_emb_lookup_inside_iteration(graph, make_emb, devices):
    emb = make_emb(graph.num_nodes(), 3)
    opt = dgl_oac.SparseSGD([emb], lr=0.5)
    loader = dgl_oac.DataLoader(graph, torch.arange(graph.num_nodes()), dgl.dataloading.NeighborSampler([2]),
                                embeddings=[emb], mode="oac", device=devices, batch_size=8, seed=0)
    input_nodes, _, blocks = next(iter(loader))
    leaf = blocks[0].srcdata[emb.name]
    before = emb.weight.clone()
    pick = torch.tensor([4, 1, 4, 0])
    sub = input_nodes[pick]  # a subset, with a duplicate, in another order
    rows = emb(sub, leaf.device)  # DGL's emb(ids, device); without a device the rows come to the CPU
    assert rows.device == leaf.device  # (regression: compared a CPU result with CUDA rows on a GPU)
    assert torch.equal(rows, leaf[pick.to(leaf.device)])
    with torch.no_grad():  # no read of its own: the update below stays the two occurrences' mean
        assert emb(sub).device.type == "cpu" and torch.equal(emb(sub), rows.detach().cpu())
    assert emb(input_nodes) is leaf  # the whole batch, first call: the hand-out leaf itself
    rows.sum().backward()  # a read of its own (DGL's trace per call), committed with the batch
    assert leaf.grad is None
    opt.step()
    after = emb.weight
    changed = (after != before).any(1).nonzero().squeeze(1)
    assert torch.equal(changed, input_nodes[[0, 1, 4]].cpu().sort().values)
    # row 4 occurs twice with gradient 1 each: their mean, 1, as dgl.optim averages (not their sum)
    torch.testing.assert_close(after[input_nodes[4].item()], before[input_nodes[4].item()] - 0.5 * 1.0)
    loader.close()


def test_emb_lookup_checks_ids(graph, make_emb):
    emb = make_emb(graph.num_nodes(), 3)
    with pytest.raises(TypeError, match="ids passed to NodeEmbedding .* must have dtype torch.int64"):
        emb(torch.tensor([1, 2], dtype=torch.int32))
    with pytest.raises(IndexError, match="found id 120"):
        emb(torch.tensor([120]))


# --- resume ------------------------------------------------------------------------------------------------------
def test_state_dict_resume_batches(graph):
    def make(seed):
        return dgl_oac.DataLoader(graph, torch.arange(graph.num_nodes()), dgl.dataloading.NeighborSampler([3, 3]),
                                  embeddings=[], batch_size=16, shuffle=True, seed=seed)

    full = make(5)
    epochs = [[batch_key(b) for b in full] for _ in range(4)]
    assert full.state_dict() == {"seed": 5, "epoch": 4, "position": 0}
    for e, p in [(0, 0), (1, 3), (2, 7), (1, 8)]:
        run = make(5)
        for _ in range(e):
            for _ in run:
                pass
        it = iter(run)
        for _ in range(p):
            next(it)
        sd = run.state_dict()
        assert sd == {"seed": 5, "epoch": e, "position": p}
        run.close()
        resumed = make(99)
        resumed.load_state_dict(sd)
        assert resumed.state_dict() == sd
        assert [batch_key(b) for b in resumed] == epochs[e][p:]
        assert [batch_key(b) for b in resumed] == epochs[e + 1]  # and the next epoch starts at 0


@pytest.mark.parametrize("mode", ["sync", "oac"])
def test_resume_training_equals_uninterrupted(graph, make_emb, mode):
    """Stop at batch p of epoch 1, save loader + embedding + optimizer, restore into fresh objects, finish:
    the table equals an uninterrupted run's, bit for bit. (Not async: what its batches read depends on how far
    the gather thread ran ahead, so a restarted pipeline reads fresher rows than an uninterrupted one.)"""
    sampler = dgl.dataloading.NeighborSampler([4, 4])

    def setup(seed):
        emb = make_emb(graph.num_nodes(), 4, name="e")
        opt = dgl_oac.SparseAdam([emb], lr=0.05)
        loader = dgl_oac.DataLoader(graph, torch.arange(graph.num_nodes()), sampler, embeddings=[emb],
                                    mode=mode, batch_size=12, shuffle=True, seed=seed, prefetch=3)
        return emb, opt, loader

    before = oac_threads()
    emb, opt, loader = setup(8)
    for _ in range(2):
        for batch in loader:
            train_step(batch, emb, opt)
    expect = emb.weight.clone()
    emb.close()

    emb, opt, loader = setup(8)
    for batch in loader:
        train_step(batch, emb, opt)
    it = iter(loader)
    for _ in range(4):
        train_step(next(it), emb, opt)
    held = next(it)  # handed out, never stepped: not part of the saved position  # noqa: F841
    sd_loader, sd_emb, sd_opt = loader.state_dict(), emb.state_dict(), opt.state_dict()
    assert sd_loader == {"seed": 8, "epoch": 1, "position": 4}
    loader.close()
    emb.close()

    emb2, opt2, loader2 = setup(1234)
    emb2.load_state_dict(sd_emb)
    opt2.load_state_dict(sd_opt)
    loader2.load_state_dict(sd_loader)
    for batch in loader2:
        train_step(batch, emb2, opt2)
    assert torch.equal(emb2.weight, expect)
    assert loader2.state_dict() == {"seed": 8, "epoch": 2, "position": 0}
    loader2.close()
    assert not [t for t in oac_threads_left(before) if "gather" in t]


def test_two_embeddings_attached_and_oac_equals_sync(graph, make_emb):
    def run(mode):
        a = make_emb(graph.num_nodes(), 3, init=1, name=f"a_{mode}")
        b = make_emb(graph.num_nodes(), 5, init=2, name=f"b_{mode}")
        opt_a, opt_b = dgl_oac.SparseAdagrad([a], lr=0.1), dgl_oac.SparseAdam([b], lr=0.05)
        loader = dgl_oac.DataLoader(graph, torch.arange(graph.num_nodes()), dgl.dataloading.NeighborSampler([4, 4]),
                                    embeddings=[a, b], mode=mode, batch_size=12, shuffle=True, seed=6)
        for input_nodes, _, blocks in loader:
            xa, xb = blocks[0].srcdata[a.name], blocks[0].srcdata[b.name]
            assert xa.shape == (len(input_nodes), 3) and xb.shape == (len(input_nodes), 5)
            (xa.sum(1).square().sum() + (xb[:, :3] * xa).sum()).backward()
            opt_a.step()
            opt_b.step()
        return a.weight.clone(), b.weight.clone()

    (sa, sb), (oa, ob) = run("sync"), run("oac")
    assert torch.equal(sa, oa) and torch.equal(sb, ob)


def test_embedding_load_state_dict_refused_mid_batch(graph, make_emb):
    emb = make_emb(graph.num_nodes(), 3)
    dgl_oac.SparseSGD([emb], lr=0.1)
    loader = dgl_oac.DataLoader(graph, torch.arange(graph.num_nodes()), dgl.dataloading.NeighborSampler([2]),
                                embeddings=[emb], mode="oac", batch_size=8)
    batch = next(iter(loader))
    with pytest.raises(RuntimeError, match="while batches are in flight; close its loader"):
        emb.load_state_dict({"weight": torch.zeros(graph.num_nodes(), 3)})
    loader.close()
    with pytest.raises(RuntimeError, match="while batches are in flight"):  # the batch still held
        emb.load_state_dict({"weight": torch.zeros(graph.num_nodes(), 3)})
    del batch
    emb.load_state_dict({"weight": torch.ones(graph.num_nodes(), 3)})
    assert torch.equal(emb.weight, torch.ones(graph.num_nodes(), 3))
