"""EdgeBatchSampler and negative samplers: layout, compaction, sharing, determinism, distribution."""
import dgl
import numpy as np
import pytest
import torch

from dgl_oac.dgl_frontend.sampling.edge import EdgeBatchSampler, unpack_negatives
from dgl_oac.sampling.negative import DegreeBased, SharedUniform, Uniform, corrupt_pairs


def kg_graph(num_nodes=50, num_edges=200, num_rels=4, seed=0):
    gen = torch.Generator().manual_seed(seed)
    src = torch.randint(0, num_nodes, (num_edges,), generator=gen)
    dst = torch.randint(0, num_nodes, (num_edges,), generator=gen)
    g = dgl.graph((src, dst), num_nodes=num_nodes)
    g.edata["etype"] = torch.randint(0, num_rels, (num_edges,), generator=gen)
    return g


def check_batch(g, eids, batch):
    """Invariants shared by every layout; returns global (pos_src, pos_dst, neg_src, neg_dst)."""
    input_nodes, pair, neg, blocks = batch
    assert blocks == []
    assert input_nodes.dtype == torch.int64 and input_nodes.device.type == "cpu"
    assert torch.unique(input_nodes).numel() == input_nodes.numel()
    n = input_nodes.numel()
    assert pair.num_nodes() == n and neg.num_nodes() == n
    assert torch.equal(pair.ndata[dgl.NID], input_nodes)
    assert torch.equal(neg.ndata[dgl.NID], input_nodes)
    assert torch.equal(pair.edata[dgl.EID], eids)
    ps, pd = (input_nodes[x] for x in pair.edges())
    src, dst = g.find_edges(eids)
    assert torch.equal(ps, src) and torch.equal(pd, dst)          # compaction maps back
    assert torch.equal(pair.edata["etype"], g.edata["etype"][eids])
    ns, nd = (input_nodes[x] for x in neg.edges())
    used = torch.cat([ps, pd, ns, nd]).unique()
    assert torch.equal(used, input_nodes)                          # covers exactly the endpoints
    return ps, pd, ns, nd


@pytest.mark.parametrize("corrupt", ["tail", "head", "both"])
def test_shared_layout(corrupt):
    g, k = kg_graph(), 7
    eids = torch.tensor([3, 17, 17, 40, 199, 0])
    torch.manual_seed(1)
    sampler = EdgeBatchSampler(num_negatives=k, shared=True, corrupt=corrupt)
    batch = sampler.sample(g, eids)
    ps, pd, ns, nd = check_batch(g, eids, batch)
    B, nblk = eids.numel(), 2 if corrupt == "both" else 1
    assert ns.numel() == nblk * B * k
    modes = ("tail", "head") if corrupt == "both" else (corrupt,)
    cands = []
    for b, mode in enumerate(modes):
        s = ns[b * B * k:(b + 1) * B * k].view(B, k)
        d = nd[b * B * k:(b + 1) * B * k].view(B, k)
        kept, repl = (s, d) if mode == "tail" else (d, s)
        assert torch.equal(kept, (ps if mode == "tail" else pd).unsqueeze(1).expand(B, k))
        assert torch.equal(repl, repl[:1].expand(B, k))            # same k candidates per row
        cands.append(repl[0])
    assert all(torch.equal(c, cands[0]) for c in cands)            # both modes share them
    # Relation of each negative = its positive's relation.
    rel = batch[1].edata["etype"]
    assert torch.equal(batch[2].edata["etype"], rel.repeat_interleave(k).repeat(nblk))
    # unpack gives the candidates' compacted ids.
    for mode, ids in sampler.unpack(batch[1], batch[2]):
        assert ids.shape == (k,) and torch.equal(batch[0][ids], cands[0])


def test_lean_shared_layout_matches_materialized():
    g, k, eids = kg_graph(), 9, torch.arange(30, 50)
    full = EdgeBatchSampler(num_negatives=k, corrupt="both")
    lean = EdgeBatchSampler(num_negatives=k, corrupt="both", materialize_negatives=False)
    torch.manual_seed(5)
    a = full.sample(g, eids)
    torch.manual_seed(5)
    b = lean.sample(g, eids)
    assert torch.equal(a[0], b[0])                      # same rows fetched
    assert b[2].num_nodes() == b[1].num_nodes() and b[2].num_edges() == k
    assert torch.equal(b[2].ndata[dgl.NID], b[0])
    for (ma, ia), (mb, ib) in zip(full.unpack(a[1], a[2]), lean.unpack(b[1], b[2])):
        assert ma == mb and torch.equal(ia, ib)
    with pytest.raises(ValueError):
        EdgeBatchSampler(num_negatives=k, shared=False, materialize_negatives=False)


def test_per_positive_layout():
    g, k = kg_graph(), 3
    eids = torch.arange(10, 30)
    torch.manual_seed(2)
    sampler = EdgeBatchSampler(num_negatives=k, shared=False, corrupt="tail")
    batch = sampler.sample(g, eids)
    ps, pd, ns, nd = check_batch(g, eids, batch)
    assert torch.equal(ns, ps.repeat_interleave(k))
    # Per-positive draws: 60 uniform draws from 50 nodes are not all one row repeated.
    assert not torch.equal(nd.view(-1, k), nd.view(-1, k)[:1].expand(-1, k))
    [(mode, ids)] = unpack_negatives(batch[1], batch[2], k, "tail", shared=False)
    assert mode == "tail" and ids.shape == (20, k)
    assert torch.equal(batch[0][ids].reshape(-1), nd)


def test_dgl_negative_sampler_is_accepted():
    g, k = kg_graph(), 2
    eids = torch.arange(8)
    sampler = EdgeBatchSampler(dgl.dataloading.negative_sampler.Uniform(k))
    ps, pd, ns, nd = check_batch(g, eids, sampler.sample(g, eids))
    assert torch.equal(ns, ps.repeat_interleave(k))


def test_deterministic_under_torch_seed_only():
    g = kg_graph()
    eids = torch.arange(0, 64)
    sampler = EdgeBatchSampler(DegreeBased(16, shared=True, corrupt="both"))

    def run(np_seed):
        np.random.seed(np_seed)                 # must not matter: torch's RNG only
        torch.manual_seed(123)
        inp, pair, neg, _ = sampler.sample(g, eids)
        return inp, neg.edges()

    a, b = run(0), run(99)
    assert torch.equal(a[0], b[0]) and all(torch.equal(x, y) for x, y in zip(a[1], b[1]))
    torch.manual_seed(124)
    c = sampler.sample(g, eids)
    assert not torch.equal(torch.stack(c[2].edges()), torch.stack(a[1]))


def test_works_in_dgl_dataloader():
    g = kg_graph()
    loader = dgl.dataloading.DataLoader(g, torch.arange(g.num_edges()),
                                        EdgeBatchSampler(num_negatives=5), batch_size=64)
    seen = []
    for batch in loader:
        check_batch(g, batch[1].edata[dgl.EID], batch)
        seen.append(batch[1].edata[dgl.EID])
    assert torch.equal(torch.cat(seen), torch.arange(g.num_edges()))


def test_shared_sampler_with_as_edge_prediction_sampler():
    # Shared negatives also plug into DGL's GNN edge sampler.
    g, k = kg_graph(), 4
    sampler = dgl.dataloading.as_edge_prediction_sampler(
        dgl.dataloading.NeighborSampler([3]), negative_sampler=SharedUniform(k))
    torch.manual_seed(0)
    inp, pair, neg, blocks = sampler.sample(g, torch.arange(12))
    nid = pair.ndata[dgl.NID]
    nd = nid[neg.edges()[1]].view(12, k)
    assert torch.equal(nd, nd[:1].expand(12, k))
    assert torch.equal(nid[neg.edges()[0]], nid[pair.edges()[0]].repeat_interleave(k))


def test_corrupt_pairs_both_per_positive():
    src, dst = torch.tensor([0, 1]), torch.tensor([5, 6])
    neg = torch.tensor([10, 11, 12, 13, 20, 21, 22, 23])  # k=2: tail draws then head draws
    ns, nd = corrupt_pairs(src, dst, neg, 2, "both", shared=False)
    assert ns.tolist() == [0, 0, 1, 1, 20, 21, 22, 23]
    assert nd.tolist() == [10, 11, 12, 13, 5, 5, 6, 6]


def test_uniform_range_and_shape():
    g = kg_graph(num_nodes=9)
    torch.manual_seed(0)
    s, d = Uniform(5)(g, torch.arange(40))
    assert s.shape == d.shape == (200,)
    assert d.min() >= 0 and d.max() < 9 and d.unique().numel() == 9


def test_degree_based_frequencies():
    # Star: hub 0 linked to 1..40 (degree 40); leaves degree 1; nodes 41..44 isolated.
    n_leaf = 40
    g = dgl.graph((torch.zeros(n_leaf, dtype=torch.int64), torch.arange(1, n_leaf + 1)),
                  num_nodes=n_leaf + 5)
    sampler = DegreeBased(1, power=0.75)
    cdf = sampler._cdf(g)  # the sampling distribution's CDF, float64[N]
    probs = torch.diff(cdf, prepend=cdf.new_zeros(1)) / cdf[-1]
    expect = torch.tensor([40 ** 0.75] + [1.0] * n_leaf + [0.0] * 4, dtype=torch.float64)
    expect /= expect.sum()
    assert torch.allclose(probs, expect)
    assert sampler._cdf(g) is sampler._cdf(g)          # cached per graph
    torch.manual_seed(0)
    n = 200_000
    counts = torch.bincount(sampler.draw(g, n), minlength=g.num_nodes()).double() / n
    assert counts[n_leaf + 1:].sum() == 0               # isolated nodes never drawn
    assert abs(counts[0] - expect[0]) < 0.01            # hub ~0.283
    assert torch.allclose(counts[1:n_leaf + 1], expect[1:n_leaf + 1], atol=0.004)
    assert counts[0] > 10 * counts[1:n_leaf + 1].max()  # high degree drawn far more often
