"""Models: shapes, exactness of shared-negative scoring and inference, and overfitting."""
import dgl
import pytest
import torch

from dgl_oac.app.metrics import filtered_ranks, kg_score_fn, ranking_metrics
from dgl_oac.app.models import (SAGE, ComplEx, DistMult, LinkPredictor, NodeClassifier, TransE,
                            kg_loss, kg_regularization, link_bce_loss, sage_inference)
from dgl_oac.dgl_frontend.sampling.edge import EdgeBatchSampler


pytestmark = pytest.mark.usefixtures("single_torch_thread")


def rand_graph(n=60, e=300, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return dgl.graph((torch.randint(0, n, (e,), generator=gen),
                      torch.randint(0, n, (e,), generator=gen)), num_nodes=n)


# ---------------------------------------------------------------- SAGE / node classification
@pytest.mark.parametrize("aggregator", ["mean", "gcn", "pool"])
def test_sage_shapes(aggregator):
    torch.manual_seed(0)
    g = rand_graph()
    seeds = torch.arange(10)
    _, out_nodes, blocks = dgl.dataloading.NeighborSampler([4, 3]).sample(g, seeds)
    model = SAGE(8, 16, 5, num_layers=2, dropout=0.5, aggregator=aggregator)
    y = model(blocks, torch.randn(blocks[0].num_src_nodes(), 8))
    assert y.shape == (10, 5)
    with pytest.raises(ValueError):
        model(blocks[:1], torch.randn(blocks[0].num_src_nodes(), 8))


@pytest.mark.parametrize("num_layers", [1, 3])
def test_sage_inference_equals_full_neighbour_forward(num_layers):
    torch.manual_seed(0)
    g = rand_graph()
    x = torch.randn(g.num_nodes(), 6)
    model = SAGE(6, 12, 4, num_layers=num_layers, dropout=0.3).eval()
    inp, _, blocks = dgl.dataloading.MultiLayerFullNeighborSampler(num_layers).sample(
        g, g.nodes())
    with torch.no_grad():
        ref = model(blocks, x[inp])
    out = sage_inference(model, g, x, batch_size=7, device="cpu")   # 9 uneven chunks
    assert out.shape == (g.num_nodes(), 4)
    assert torch.allclose(out, ref, atol=1e-5)


def test_node_classifier_concat_and_inference():
    torch.manual_seed(0)
    g = rand_graph()
    emb, feats = torch.randn(g.num_nodes(), 4), torch.randn(g.num_nodes(), 3)
    clf = NodeClassifier(4, 3, 8, num_classes=5).eval()
    inp, _, blocks = dgl.dataloading.MultiLayerFullNeighborSampler(2).sample(g, g.nodes())
    with torch.no_grad():
        ref = clf(blocks, emb[inp], feats[inp])
        plain = clf.sage(blocks, torch.cat([emb, feats], 1)[inp])
    assert ref.shape == (g.num_nodes(), 5) and torch.allclose(ref, plain)
    assert torch.allclose(clf.inference(g, emb, feats, 16, "cpu"), ref, atol=1e-5)


# ---------------------------------------------------------------- link prediction
@pytest.mark.parametrize("scorer", ["dot", "mlp"])
def test_link_predictor_with_blocks(scorer):
    torch.manual_seed(0)
    g = rand_graph()
    sampler = dgl.dataloading.as_edge_prediction_sampler(
        dgl.dataloading.NeighborSampler([5, 5]),
        negative_sampler=dgl.dataloading.negative_sampler.Uniform(3))
    inp, pair, neg, blocks = sampler.sample(g, torch.arange(16))
    model = LinkPredictor(SAGE(8, 16, 16), scorer=scorer, hidden_dim=32)
    pos_s, neg_s = model(pair, neg, blocks, torch.randn(inp.numel(), 8))
    assert pos_s.shape == (16,) and neg_s.shape == (48,)
    h = torch.randn(5, 1, 16), torch.randn(5, 9, 16)
    assert model.score_pairs(*h).shape == (5, 9)          # broadcasting for MRR eval


def test_shallow_link_prediction_overfits():
    # 4 disjoint 5-cliques: dot-product embeddings can separate them perfectly.
    torch.manual_seed(0)
    u, v = torch.meshgrid(torch.arange(5), torch.arange(5), indexing="ij")
    keep = u != v
    src = torch.cat([u[keep] + 5 * c for c in range(4)])
    dst = torch.cat([v[keep] + 5 * c for c in range(4)])
    g = dgl.graph((src, dst), num_nodes=20)
    emb = torch.nn.Parameter(torch.randn(g.num_nodes(), 8) * 0.1)
    model = LinkPredictor(None, scorer="dot")
    opt = torch.optim.Adam([emb], lr=0.05)
    sampler = EdgeBatchSampler(num_negatives=4, shared=False)
    losses = []
    for _ in range(150):
        inp, pair, neg, blocks = sampler.sample(g, torch.arange(g.num_edges()))
        loss = link_bce_loss(*model(pair, neg, blocks, emb[inp]))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    with torch.no_grad():
        pos_s, neg_s = model.score_pairs(emb[src], emb[dst]), emb @ emb.t()
    same = (torch.arange(20)[:, None] // 5) == (torch.arange(20)[None] // 5)
    assert pos_s.min() > neg_s[~same].max()          # every edge outranks every non-edge
    # The sampled loss cannot reach 0: a quarter of uniform negatives fall inside a clique
    # and cap the margins; scored against true non-edges it still falls by more than half.
    assert link_bce_loss(pos_s, neg_s[~same]) < 0.5 * losses[0]


# ---------------------------------------------------------------- KG scorers
KG_MODELS = [lambda: DistMult(5, 8), lambda: ComplEx(5, 8), lambda: TransE(5, 8, p=1),
             lambda: TransE(5, 8, p=2, gamma=3.0)]


@pytest.mark.parametrize("make", KG_MODELS)
@pytest.mark.parametrize("corrupt", ["tail", "head"])
def test_score_neg_equals_naive_loop(make, corrupt):
    torch.manual_seed(0)
    model = make()
    B, K = 6, 40   # K > 25 takes cdist's matmul path for p=2
    kept, r, cand = torch.randn(B, 8), torch.randint(0, 5, (B,)), torch.randn(K, 8)
    fast = model.score_neg(kept, r, cand, corrupt)
    assert fast.shape == (B, K)
    naive = torch.empty(B, K)
    for b in range(B):
        for k in range(K):
            h, t = (kept[b], cand[k]) if corrupt == "tail" else (cand[k], kept[b])
            naive[b, k] = model.score(h[None], r[b:b + 1], t[None])[0]
    assert torch.allclose(fast, naive, atol=1e-4)


def test_complex_matches_complex_arithmetic():
    torch.manual_seed(0)
    model = ComplEx(3, 6)
    h, t, r_ids = torch.randn(4, 6), torch.randn(4, 6), torch.tensor([0, 1, 2, 1])
    as_c = lambda x: torch.complex(x[:, :3], x[:, 3:])
    r = model.relation.weight[r_ids]
    ref = (as_c(h) * as_c(r) * as_c(t).conj()).sum(1).real
    assert torch.allclose(model.score(h, r_ids, t), ref, atol=1e-6)
    with pytest.raises(ValueError):
        ComplEx(3, 5)


def test_kg_loss_values():
    pos, neg = torch.tensor([2.0, -1.0]), torch.tensor([[0.5, -0.5, 1.0], [0.0, 2.0, -2.0]])
    ls = torch.nn.functional.logsigmoid
    expect = (-ls(pos).mean() - ls(-neg).mean(1).mean()) / 2
    assert torch.allclose(kg_loss(pos, neg, "logsigmoid"), expect)
    # Temperature 0 -> uniform self-adversarial weights.
    for kind in ("logsigmoid", "softplus", "margin"):
        assert torch.allclose(kg_loss(pos, neg, kind, adversarial_temperature=0.0),
                              kg_loss(pos, neg, kind))
    sp = torch.nn.functional.softplus
    assert torch.allclose(kg_loss(pos, neg, "softplus"),
                          (sp(-pos).sum() + sp(neg).sum()) / 8)
    # margin 1: row 0 -> relu(1-2+[.5,-.5,1]) = [0,0,0]; row 1 -> relu(2+[0,2,-2]) = [2,4,0]
    assert torch.allclose(kg_loss(pos, neg, "margin"), torch.tensor(1.0))
    # A large temperature puts all weight on the hardest negative.
    hard = kg_loss(pos, neg, "margin", adversarial_temperature=100.0)
    assert torch.allclose(hard, torch.tensor(2.0), atol=1e-3)   # (0 + 4) / 2


def test_regularization_values():
    x = torch.tensor([[3.0, 0.0, 4.0, 0.0], [0.0, 1.0, 0.0, 1.0]])
    assert torch.allclose(kg_regularization([x], "l2", weight=2.0), torch.tensor(27.0))
    assert torch.allclose(kg_regularization([x], "n3"), torch.tensor((27 + 64 + 2) / 2))
    # complex moduli: row 0 -> |3+4i| = 5, 0 ; row 1 -> 0, |1+1i| = sqrt 2
    assert torch.allclose(kg_regularization([x], "n3", complex_halves=True),
                          torch.tensor((125 + 2 ** 1.5) / 2), atol=1e-4)


@pytest.mark.parametrize("make", [lambda: DistMult(2, 16), lambda: ComplEx(2, 16),
                                  lambda: TransE(2, 16, p=1, gamma=4.0),
                                  lambda: TransE(2, 16, p=2, gamma=4.0)])
def test_tiny_kg_overfits(make):
    torch.manual_seed(0)
    n_ent = 8
    # A path 0-1-...-7 with alternating relations: each entity occurs once per relation (so
    # symmetric DistMult can rank all first) and no cycle forces TransE's r0 + r1 = 0.
    triples = torch.tensor([[0, 0, 1], [2, 0, 3], [4, 0, 5], [6, 0, 7],
                            [1, 1, 2], [3, 1, 4], [5, 1, 6]])
    g = dgl.graph((triples[:, 0], triples[:, 2]), num_nodes=n_ent)
    g.edata["etype"] = triples[:, 1]
    model = make()
    ent = torch.nn.Parameter(torch.randn(n_ent, 16) * 0.1)
    opt = torch.optim.Adam([ent, *model.parameters()], lr=0.05)
    sampler = EdgeBatchSampler(num_negatives=n_ent, shared=True, corrupt="both")
    for _ in range(200):
        inp, pair, neg, _ = sampler.sample(g, torch.arange(len(triples)))
        x = ent[inp]
        s, d = pair.edges()
        r = pair.edata["etype"]
        pos = model.score(x[s], r, x[d])
        loss = 0
        for mode, cand in sampler.unpack(pair, neg):
            kept = x[s] if mode == "tail" else x[d]
            loss = loss + kg_loss(pos, model.score_neg(kept, r, x[cand], mode),
                                  adversarial_temperature=1.0)
        opt.zero_grad()
        loss.backward()
        opt.step()
    ranks = filtered_ranks(kg_score_fn(model, ent, "cpu"), triples, [triples], n_ent)
    assert ranking_metrics(ranks)["mrr"] > 0.9
