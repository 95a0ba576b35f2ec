"""Synthetic generator: shapes, exact counts, determinism, power-law skew and planted signal."""
from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
import torch

from dgl_oac.app.data import KGDataset, LinkDataset, NodeDataset, load
from dgl_oac.app.data.synthetic import generate

N, D, C = 20_000, 10.0, 8


@pytest.fixture(scope="module")
def node_ds() -> NodeDataset:
    return load("synthetic", num_nodes=N, avg_degree=D, num_classes=C, seed=0)


def _keys(src: torch.Tensor, dst: torch.Tensor, n: int) -> torch.Tensor:
    return src * n + dst


def test_node_shapes_and_exact_counts(node_ds):
    g = node_ds.graph
    assert isinstance(node_ds, NodeDataset) and node_ds.name == "synthetic"
    assert g.num_nodes() == N and g.num_edges() == 2 * round(N * D / 2) and g.idtype == torch.int64
    assert node_ds.labels.shape == (N,) and node_ds.labels.dtype == torch.int64
    assert node_ds.labels.min() == 0 and node_ds.labels.max() == C - 1 and node_ds.num_classes == C
    assert node_ds.features is None and node_ds.ogb_name is None
    src, dst = g.edges()
    assert not bool((src == dst).any())  # no self loops
    keys = _keys(src, dst, N)
    assert torch.unique(keys).numel() == keys.numel()  # no duplicate edges
    assert torch.equal(torch.sort(keys).values, torch.sort(_keys(dst, src, N)).values)  # symmetric
    assert int((g.in_degrees() == 0).sum()) < N // 100  # almost every node has a neighbour


def test_node_split_is_a_partition(node_ds):
    parts = [node_ds.train_idx, node_ds.valid_idx, node_ds.test_idx]
    assert [p.numel() for p in parts] == [12_000, 4_000, 4_000]
    assert all(p.dtype == torch.int64 and bool((p[1:] > p[:-1]).all()) for p in parts)  # sorted, distinct
    assert torch.equal(torch.sort(torch.cat(parts)).values, torch.arange(N))


def test_deterministic_from_seed(node_ds):
    again = load("synthetic", num_nodes=N, avg_degree=D, num_classes=C, seed=0)
    other = load("synthetic", num_nodes=N, avg_degree=D, num_classes=C, seed=1)
    for a, b in zip(node_ds.graph.edges(), again.graph.edges()):
        assert torch.equal(a, b)
    assert torch.equal(node_ds.labels, again.labels) and torch.equal(node_ds.train_idx, again.train_idx)
    assert not torch.equal(node_ds.labels, other.labels)
    assert not torch.equal(node_ds.train_idx, other.train_idx)


def _hill(degrees: torch.Tensor, kmin: int) -> float:
    """Maximum-likelihood power-law exponent of the degrees >= kmin (discrete correction kmin - 0.5)."""
    k = degrees[degrees >= kmin].double()
    return 1.0 + k.numel() / float(torch.log(k / (kmin - 0.5)).sum())


def test_power_law_degree_skew(node_ds):
    deg = node_ds.graph.in_degrees()
    assert float(deg.float().mean()) == pytest.approx(D)
    assert int(deg.max()) > 30 * D  # hubs far above the mean
    assert float(deg.float().median()) < D  # while most nodes sit below it
    assert 1.8 < _hill(deg, 10) < 2.6  # requested exponent 2.1
    light = generate(num_nodes=N, avg_degree=D, power=3.5, num_classes=C, seed=0).graph.in_degrees()
    assert 3.0 < _hill(light, 10) < 4.2 and _hill(light, 10) > _hill(deg, 10) + 0.8


def test_planted_classes_are_predictable_from_neighbours(node_ds):
    g, y = node_ds.graph, node_ds.labels
    src, dst = g.edges()
    homophily = float((y[src] == y[dst]).float().mean())
    assert homophily > 0.7 > 5 / C  # default homophily 0.8, chance 1/8
    # Majority vote over neighbours with a TRAIN label predicts test labels far above chance: the signal a
    # featureless GNN over learnable embeddings picks up.
    is_train = torch.zeros(N, dtype=torch.bool)
    is_train[node_ds.train_idx] = True
    keep = is_train[src]
    ones = torch.ones(int(keep.sum()))
    votes = torch.zeros(N, C).index_put_((dst[keep], y[src[keep]]), ones, accumulate=True)
    acc = float((votes[node_ds.test_idx].argmax(1) == y[node_ds.test_idx]).float().mean())
    assert acc > 0.75


def test_homophily_zero_point_signal_disappears():
    ds = generate(num_nodes=5_000, avg_degree=8, num_classes=4, homophily=0.0, seed=3)
    src, dst = ds.graph.edges()
    assert abs(float((ds.labels[src] == ds.labels[dst]).float().mean()) - 0.25) < 0.05


def test_link_task_splits_edges():
    ds = load("synthetic", task="link", num_nodes=5_000, avg_degree=6, seed=2, num_neg=7)
    assert isinstance(ds, LinkDataset)
    total = round(5_000 * 6 / 2)
    n_valid = n_test = round(total * 0.05)
    assert ds.valid_edges.shape == (n_valid, 2) and ds.test_edges.shape == (n_test, 2)
    assert ds.train_edges.shape == (total - n_valid - n_test, 2) and ds.train_edges.dtype == torch.int64
    splits = (ds.train_edges, ds.valid_edges, ds.test_edges)
    keys = torch.cat([_keys(e[:, 0], e[:, 1], 5_000) for e in splits])
    assert torch.unique(keys).numel() == total  # disjoint, no duplicates
    assert ds.graph.num_edges() == 2 * ds.train_edges.shape[0]  # message passing over train edges only
    assert ds.valid_neg.shape == (n_valid, 7) and ds.test_neg.shape == (n_test, 7)
    assert 0 <= int(ds.valid_neg.min()) and int(ds.valid_neg.max()) < 5_000


def test_kg_task_has_learnable_relation_patterns():
    ds = load("synthetic", task="kg", num_nodes=6_000, avg_degree=10, num_classes=6, num_relations=5, seed=4)
    assert isinstance(ds, KGDataset) and ds.num_entities == 6_000 and ds.num_relations == 5
    total = 30_000
    assert ds.train.shape[0] + ds.valid.shape[0] + ds.test.shape[0] == total
    assert ds.valid.shape == (1_500, 3) and ds.test.shape == (1_500, 3)
    all_t = torch.cat([ds.train, ds.valid, ds.test])
    assert torch.unique(all_t, dim=0).shape[0] == total
    assert int(all_t[:, 1].max()) == 4 and int(all_t[:, [0, 2]].max()) < 6_000
    assert torch.equal(ds.graph.edata["etype"], ds.train[:, 1])
    assert torch.equal(torch.stack(ds.graph.edges(), 1), ds.train[:, [0, 2]])
    # Each relation maps head cluster -> one tail cluster (mostly), and that map is an involution.
    cl = ds.clusters
    counts = torch.zeros(5, 6, 6).index_put_((all_t[:, 1], cl[all_t[:, 0]], cl[all_t[:, 2]]),
                                             torch.ones(total), accumulate=True)
    top = counts.argmax(2)
    assert float(counts.max(2).values.sum() / total) > 0.75
    assert torch.equal(torch.gather(top, 1, top), torch.arange(6).expand(5, 6))


def test_kg_default_relations_and_bad_arguments():
    assert generate(num_nodes=500, avg_degree=4, task="kg").num_relations == 16
    with pytest.raises(ValueError, match="task"):
        generate(num_nodes=100, task="graph")
    with pytest.raises(ValueError, match="power"):
        generate(num_nodes=100, power=1.0)
    with pytest.raises(ValueError, match="split"):
        generate(num_nodes=100, split=(0.5, 0.5, 0.5))


def test_default_size_is_quick():
    import time

    start = time.perf_counter()
    ds = load("synthetic")
    elapsed = time.perf_counter() - start
    assert ds.graph.num_nodes() == 100_000 and ds.graph.num_edges() == 1_000_000 and ds.num_classes == 8
    # 0.2 s on 2 idle cores; the generous bound only catches super-linear regressions on a loaded machine.
    assert elapsed < 15.0
    assert math.isclose(float(ds.graph.in_degrees().float().mean()), 10.0)


@settings(max_examples=25, deadline=None)
@given(n=st.integers(20, 400), deg=st.floats(1.0, 8.0), classes=st.integers(1, 6), seed=st.integers(0, 99),
       power=st.floats(1.5, 4.0))
def test_property_exact_simple_graph(n, deg, classes, seed, power):
    ds = generate(num_nodes=n, avg_degree=deg, num_classes=classes, seed=seed, power=power)
    g = ds.graph
    src, dst = g.edges()
    assert g.num_edges() == 2 * round(n * deg / 2)
    assert not bool((src == dst).any()) and torch.unique(src * n + dst).numel() == g.num_edges()
    assert int(ds.labels.max()) < classes
    assert ds.train_idx.numel() + ds.valid_idx.numel() + ds.test_idx.numel() == n


@settings(max_examples=30, deadline=None)
@given(edges=st.lists(st.tuples(st.integers(0, 9), st.integers(0, 9)), max_size=40))
def test_property_undirected_graph(edges):
    from dgl_oac.app.data._graphs import undirected_graph

    t = torch.tensor(edges, dtype=torch.int64).view(-1, 2)
    g, pairs = undirected_graph(t, 10)
    expected = {(min(a, b), max(a, b)) for a, b in edges if a != b}
    assert sorted(map(tuple, pairs.tolist())) == sorted(expected)
    assert set(zip(*[x.tolist() for x in g.edges()])) == expected | {(b, a) for a, b in expected}
    assert g.num_edges() == 2 * len(expected)


def test_guide_table_lookup_equals_binary_search():
    from dgl_oac.app.data.synthetic import _nodes, _Sampler

    gen = torch.Generator().manual_seed(7)
    labels, weights = _nodes(50_000, 10.0, 1.3, 5, gen)  # very heavy tail: long runs inside buckets
    sampler = _Sampler(weights, labels, 5)
    u = torch.rand(200_000, dtype=torch.float64, generator=gen) * sampler.total
    u = torch.cat([u, sampler.cdf[:1000], torch.tensor([0.0, sampler.total], dtype=torch.float64)])
    expected = sampler.order[torch.searchsorted(sampler.cdf, u, right=True).clamp_(max=sampler.n - 1)]
    assert torch.equal(sampler._lookup(u), expected)
