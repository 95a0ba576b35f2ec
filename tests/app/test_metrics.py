"""Metrics: accuracy, ranking metrics, filtered ranks (hand-computed + reference), OGB wrappers."""
import pytest
import torch

from dgl_oac.app.metrics import (TripleFilter, accuracy, filtered_ranks, ogb_link_eval,
                             ogb_node_eval, ranking_metrics)


def test_accuracy_logits_and_predictions():
    logits = torch.tensor([[0.1, 0.9], [0.8, 0.2], [0.3, 0.7], [0.6, 0.4]])
    labels = torch.tensor([[1], [0], [0], [0]])               # OGB-style [N, 1]
    assert accuracy(logits, labels) == pytest.approx(0.75)
    assert accuracy(torch.tensor([1, 1, 0, 1]), labels.view(-1)) == pytest.approx(0.5)
    with pytest.raises(ValueError):
        accuracy(torch.tensor([1, 0]), labels)


def test_ranking_metrics():
    m = ranking_metrics(torch.tensor([1, 2, 4, 10, 11]))
    assert set(m) == {"mrr", "hits@1", "hits@3", "hits@10"}
    assert m["mrr"] == pytest.approx((1 + 1 / 2 + 1 / 4 + 1 / 10 + 1 / 11) / 5)
    assert (m["hits@1"], m["hits@3"], m["hits@10"]) == pytest.approx((0.2, 0.4, 0.8))
    assert ranking_metrics(torch.tensor([1.5]))["hits@1"] == 0.0   # a tie is not a hit@1


# Hand example: 5 entities; one score table S[h, t] used for every relation.
S = torch.tensor([[0.5, 0.9, 0.7, 0.6, 0.6],
                  [0.0, 0.0, 0.0, 0.1, 0.0],
                  [0.0, 0.0, 0.0, 0.8, 0.0],
                  [0.0, 0.0, 0.0, 0.6, 0.0],
                  [0.0, 0.0, 0.0, 0.2, 0.0]])


def table_score_fn(table):
    def fn(kept, rel, corrupt):
        return table[kept] if corrupt == "tail" else table[:, kept].t()
    return fn


TEST = torch.tensor([[0, 0, 3]])
# (0,0,1) and (2,0,3) are known true; the relation-1 triples must NOT filter relation-0 queries.
KNOWN = [torch.tensor([[0, 0, 1], [2, 0, 3]]), TEST, torch.tensor([[0, 1, 4], [3, 1, 3]])]


@pytest.mark.parametrize("ties, raw, filt", [
    # tail (0,0,?): target 0.6; higher {1: .9, 2: .7}, tied {4}; filtering drops 1.
    # head (?,0,3): column [.6 .1 .8 .6 .2], target h=0; higher {2}, tied {3}; filtering drops 2.
    ("mean", [3.5, 2.5], [2.5, 1.5]),
    ("optimistic", [3.0, 2.0], [2.0, 1.0]),
    ("pessimistic", [4.0, 3.0], [3.0, 2.0]),
])
def test_filtered_ranks_by_hand(ties, raw, filt):
    fn = table_score_fn(S)
    got_raw = filtered_ranks(fn, TEST, None, 5, corrupt="both", ties=ties)
    got_filt = filtered_ranks(fn, TEST, KNOWN, 5, corrupt="both", ties=ties)
    assert got_raw.tolist() == raw and got_filt.tolist() == filt
    assert filtered_ranks(fn, TEST, KNOWN, 5, corrupt="tail", ties=ties).tolist() == filt[:1]
    assert filtered_ranks(fn, TEST, KNOWN, 5, corrupt="head", ties=ties).tolist() == filt[1:]


def test_all_equal_scores_give_mean_rank():
    fn = lambda kept, rel, corrupt: torch.zeros(kept.shape[0], 5)
    assert filtered_ranks(fn, TEST, None, 5).tolist() == [3.0, 3.0]   # (1 + 5) / 2


def test_triple_filter_known():
    f = TripleFilter(KNOWN)
    rows, ents = f.known(torch.tensor([0, 3, 1]), torch.tensor([0, 1, 0]), "tail")
    assert sorted(zip(rows.tolist(), ents.tolist())) == [(0, 1), (0, 3), (1, 3)]
    rows, ents = f.known(torch.tensor([3]), torch.tensor([0]), "head")
    assert sorted(ents.tolist()) == [0, 2]


def naive_ranks(table_by_rel, triples, known, n_ent, mode):
    """Reference: Python sets and loops, mean tie convention."""
    true = {tuple(x) for t in known for x in t.tolist()}
    out = []
    for h, r, t in triples.tolist():
        sc = table_by_rel[r]
        target = sc[h, t]
        higher = tied = 0
        for e in range(n_ent):
            cand = (h, r, e) if mode == "tail" else (e, r, t)
            if cand in true or e == (t if mode == "tail" else h):
                continue
            s = sc[cand[0], cand[2]]
            higher += int(s > target)
            tied += int(s == target)
        out.append(1 + higher + tied / 2)
    return out


def test_filtered_ranks_match_reference_in_chunks():
    gen = torch.Generator().manual_seed(0)
    n_ent, n_rel = 30, 3
    # Few distinct integer scores -> many ties.
    tables = torch.randint(0, 6, (n_rel, n_ent, n_ent), generator=gen).float()
    rand_triples = lambda n: torch.stack([torch.randint(0, n_ent, (n,), generator=gen),
                                          torch.randint(0, n_rel, (n,), generator=gen),
                                          torch.randint(0, n_ent, (n,), generator=gen)], 1)
    train, test = rand_triples(400), rand_triples(40)
    fn = lambda kept, rel, corrupt: torch.stack(
        [tables[r][k] if corrupt == "tail" else tables[r][:, k] for k, r in zip(kept, rel)])
    ref = naive_ranks(tables, test, [train, test], n_ent, "tail") + \
        naive_ranks(tables, test, [train, test], n_ent, "head")
    flt = TripleFilter([train, test])
    for bs in (1, 7, 100):
        got = filtered_ranks(fn, test, flt, n_ent, corrupt="both", batch_size=bs)
        assert got.tolist() == ref


def test_ogb_node_eval_matches_accuracy():
    torch.manual_seed(0)
    logits, labels = torch.randn(100, 40), torch.randint(0, 40, (100, 1))
    logits[:30] += 10 * torch.nn.functional.one_hot(labels[:30, 0], 40)   # 30+ correct
    res = ogb_node_eval("ogbn-arxiv", logits, labels)
    assert res["acc"] == pytest.approx(accuracy(logits, labels)) and res["acc"] >= 0.3


def test_ogb_link_eval_mrr_and_hits():
    gen = torch.Generator().manual_seed(0)
    pos = torch.randint(0, 10, (50,), generator=gen).float()
    neg = torch.randint(0, 10, (50, 20), generator=gen).float()          # ties on purpose
    ranks = 1 + (neg > pos[:, None]).sum(1) + 0.5 * (neg == pos[:, None]).sum(1)
    res = ogb_link_eval("ogbl-citation2", pos, neg)
    for k, v in ranking_metrics(ranks).items():
        assert res[k] == pytest.approx(v, abs=1e-6)
    pos2, flat_neg = torch.rand(30, generator=gen) + 0.2, torch.rand(200, generator=gen)
    hits = ogb_link_eval("ogbl-collab", pos2, flat_neg)
    kth = torch.topk(flat_neg, 50).values[-1]            # hits@50: beat the 50th negative
    assert hits == pytest.approx({"hits@50": float((pos2 > kth).float().mean())})
    assert 0.0 < hits["hits@50"] < 1.0
