"""Heterographs: per-type tables on ``embeddings={ntype: NodeEmbedding}``, OAC validated per type.

The central claim again, on typed graphs: oac is bitwise equal to sync (every step's loss, each type's table
and optimizer state) with SGD/Adagrad/Adam at prefetch 1, 4 and 8, for (a) node classification with an R-GCN
over blocks on the ogbn-mag-shaped synthetic graph and (b) link prediction on a bipartite user-item graph
with per-type negative sampling; each run patched a real share of its rows. Plus where rows arrive, bad input
naming the type, and checkpoint/resume.
"""
from __future__ import annotations

from typing import Dict, List, Tuple

import dgl
import pytest
import torch
import torch.nn.functional as F

import dgl_oac
from dgl_oac.checkpoint import load_checkpoint, save_checkpoint
from dgl_oac.app.data.synthetic_mag import generate_mag
from dgl_oac.app.models.rgcn import RGCN

OPTIMIZERS = {"sgd": (dgl_oac.SparseSGD, {"lr": 0.5}), "adagrad": (dgl_oac.SparseAdagrad, {"lr": 0.1}),
              "adam": (dgl_oac.SparseAdam, {"lr": 0.05})}
DIM = 8
MAG = generate_mag(1500, num_classes=3, feat_dim=4, skew=3.0, seed=1)
LEARNED = ("author", "institution", "field_of_study")  # featureless: learnable tables


def bipartite(users: int = 300, items: int = 200, m: int = 3000, seed: int = 0) -> dgl.DGLGraph:
    gen = torch.Generator().manual_seed(seed)
    u = torch.randint(0, users, (m,), generator=gen)
    i = (torch.rand(m, generator=gen) ** 3 * items).long()  # popular items are in most batches
    return dgl.heterograph({("user", "clicks", "item"): (u, i), ("item", "clicked_by", "user"): (i, u)},
                           num_nodes_dict={"user": users, "item": items})


BIPARTITE = bipartite()


def make_tables(graph: dgl.DGLGraph, ntypes, init_seed: int = 0) -> Dict[str, dgl_oac.NodeEmbedding]:
    torch.manual_seed(init_seed)
    return {nt: dgl_oac.NodeEmbedding(graph.num_nodes(nt), DIM, f"emb_{nt}", init_func=lambda t: t.uniform_(-1, 1))
            for nt in ntypes}


def rows_of(blocks_or_graph, embs: Dict[str, dgl_oac.NodeEmbedding]) -> Dict[str, torch.Tensor]:
    return {nt: blocks_or_graph.srcdata[e.name][nt] for nt, e in embs.items()}


class NodeRun:
    """(a): R-GCN over blocks on the mag-shaped graph, paper features + learnable author/institution/topic."""

    def __init__(self, mode: str, opt_name: str, prefetch: int = 4, init_seed: int = 0) -> None:
        self.embs = make_tables(MAG.graph, LEARNED, init_seed)
        cls, kw = OPTIMIZERS[opt_name]
        self.sparse = cls(list(self.embs.values()), **kw)
        self.model = RGCN({"paper": 4, **{nt: DIM for nt in LEARNED}}, DIM, MAG.num_classes, MAG.graph.etypes)
        self.dense = torch.optim.SGD(self.model.parameters(), lr=0.1)
        self.loader = dgl_oac.DataLoader(MAG.graph, {"paper": MAG.train_idx}, dgl.dataloading.NeighborSampler([4, 4]),
                                         embeddings=self.embs, mode=mode, prefetch=prefetch, batch_size=32,
                                         shuffle=True, seed=3, background_priority="normal")

    def step(self, batch) -> float:
        input_nodes, output_nodes, blocks = batch
        x = rows_of(blocks[0], self.embs)
        x["paper"] = MAG.features["paper"][input_nodes["paper"]]
        logits = self.model(blocks, x)["paper"]
        loss = F.cross_entropy(logits, MAG.labels[output_nodes["paper"]])
        self.dense.zero_grad()
        loss.backward()
        self.dense.step()
        self.sparse.step()
        return loss.item()


class LinkRun:
    """(b): user-item link prediction, a 1-layer R-GCN encoder, per-type uniform negatives (DGL's)."""

    def __init__(self, mode: str, opt_name: str, prefetch: int = 4, init_seed: int = 0) -> None:
        self.embs = make_tables(BIPARTITE, ("user", "item"), init_seed)
        cls, kw = OPTIMIZERS[opt_name]
        self.sparse = cls(list(self.embs.values()), **kw)
        self.model = RGCN({"user": DIM, "item": DIM}, DIM, DIM, BIPARTITE.etypes, num_layers=1)
        self.dense = torch.optim.SGD(self.model.parameters(), lr=0.1)
        sampler = dgl.dataloading.as_edge_prediction_sampler(
            dgl.dataloading.NeighborSampler([4]), negative_sampler=dgl.dataloading.negative_sampler.Uniform(2))
        self.loader = dgl_oac.DataLoader(BIPARTITE, {"clicks": torch.arange(0, 3000, 5)}, sampler,
                                         embeddings=self.embs, mode=mode, prefetch=prefetch, batch_size=40,
                                         shuffle=True, seed=3, background_priority="normal")

    @staticmethod
    def score(graph: dgl.DGLGraph, h: Dict[str, torch.Tensor]) -> torch.Tensor:
        u, i = graph.edges(etype="clicks")
        # index_select: its backward is deterministic on CPU (advanced indexing's is not)
        return (h["user"].index_select(0, u) * h["item"].index_select(0, i)).sum(1)

    def step(self, batch) -> float:
        _, pos, neg, blocks = batch
        h = self.model(blocks, rows_of(blocks[0], self.embs))
        loss = F.softplus(-self.score(pos, h)).mean() + F.softplus(self.score(neg, h)).mean()
        self.dense.zero_grad()
        loss.backward()
        self.dense.step()
        self.sparse.step()
        return loss.item()


RUNS = {"node": NodeRun, "link": LinkRun}


pytestmark = pytest.mark.usefixtures("single_torch_thread")


def train(task: str, mode: str, opt_name: str, prefetch: int = 4, epochs: int = 1):
    run = RUNS[task](mode, opt_name, prefetch)
    losses = [run.step(batch) for _ in range(epochs) for batch in run.loader]
    tables = {nt: (e.weight.clone(), e.optm_state.clone()) for nt, e in run.embs.items()}
    for e in run.embs.values():
        e.close()
    return losses, tables, run.loader


_SYNC: Dict[Tuple[str, str], tuple] = {}


def sync_run(task: str, opt_name: str) -> tuple:
    if (task, opt_name) not in _SYNC:
        _SYNC[task, opt_name] = train(task, "sync", opt_name)
    return _SYNC[task, opt_name]


@pytest.mark.parametrize("task", list(RUNS))
@pytest.mark.parametrize("opt_name", list(OPTIMIZERS))
@pytest.mark.parametrize("prefetch", [1, 4, 8])
def test_oac_equals_sync_on_heterographs(task: str, opt_name: str, prefetch: int) -> None:
    ref_losses, ref_tables, _ = sync_run(task, opt_name)
    losses, tables, loader = train(task, "oac", opt_name, prefetch)
    assert losses == ref_losses, "oac diverged from sync at step %d" % next(
        i for i, (a, b) in enumerate(zip(losses, ref_losses)) if a != b)
    for nt, (values, state) in tables.items():
        assert torch.equal(values, ref_tables[nt][0]), nt
        assert torch.equal(state, ref_tables[nt][1]), nt
    # the test only means something if the pipeline really read stale rows and patched them
    assert loader.stats.conflict_rate > 0.10, loader.stats
    assert loader.stats.max_in_flight == prefetch
    assert loader.stats.committed == loader.stats.batches == len(ref_losses)
    assert loader.stats.rows_repatched_at_commit == 0


# --- where the rows arrive --------------------------------------------------------------------------------------
def test_rows_arrive_per_type_where_dgl_models_look() -> None:
    run = NodeRun("oac", "sgd", prefetch=2)
    input_nodes, output_nodes, blocks = next(iter(run.loader))
    assert set(output_nodes) == {"paper"}
    for nt, emb in run.embs.items():
        rows = blocks[0].srcdata[emb.name][nt]
        assert rows.shape == (input_nodes[nt].numel(), DIM) and rows.requires_grad
        assert torch.equal(rows.detach(), emb.weight[input_nodes[nt]])
        assert emb(input_nodes[nt]) is rows  # DGL's emb(input_nodes[ntype], device): the batch's own leaf
    assert set(blocks[0].srcdata[run.embs["author"].name]) == {"author"}
    run.loader.close()


def test_edge_loader_keys_edge_types_by_name_or_canonical() -> None:
    embs = make_tables(BIPARTITE, ("user", "item"))
    batches = {}
    for key in ("clicks", ("user", "clicks", "item")):
        loader = dgl_oac.DataLoader(BIPARTITE, {key: torch.arange(40)}, dgl.dataloading.as_edge_prediction_sampler(
            dgl.dataloading.NeighborSampler([2]), negative_sampler=dgl.dataloading.negative_sampler.Uniform(1)),
            embeddings=embs, batch_size=20, seed=1)
        batches[key] = [(b[0]["user"].clone(), b[1].edges(etype="clicks")) for b in loader]
    assert len(batches["clicks"]) == 2
    assert all(torch.equal(a[0], b[0]) for a, b in zip(*batches.values()))


class ShallowSampler:
    """A zero-layer edge sampler on a heterograph (DGL's as_edge_prediction_sampler over zero layers fails):
    the pair graph is the seed edges' subgraph over their endpoints, which are the input nodes."""

    samples_edges = True

    def sample(self, g: dgl.DGLGraph, seed_edges):
        pair = g.edge_subgraph(seed_edges)
        return {nt: pair.nodes[nt].data[dgl.NID] for nt in pair.ntypes}, pair, pair, []


def test_with_no_blocks_the_rows_of_each_type_are_on_the_pair_graph() -> None:
    embs = make_tables(BIPARTITE, ("user", "item"))
    opt = dgl_oac.SparseSGD(list(embs.values()), lr=0.5)
    loader = dgl_oac.DataLoader(BIPARTITE, {"clicks": torch.arange(60)}, ShallowSampler(), embeddings=embs,
                                batch_size=20, prefetch=2)
    for input_nodes, pair, _, blocks in loader:
        assert blocks == []
        for nt, emb in embs.items():
            assert pair.nodes[nt].data[emb.name] is emb(input_nodes[nt])
        LinkRun.score(pair, {nt: pair.nodes[nt].data[e.name] for nt, e in embs.items()}).sum().backward()
        opt.step()
    assert loader.stats.committed == 3


def test_a_type_absent_from_a_batch_commits_nothing_and_the_batch_counts_once() -> None:
    # regression: the first table's type ("tag") is in no batch; the batch is counted (stats, resume position)
    # with the first table that has rows, and the empty table takes no step
    embs = make_tables(BIPARTITE, ("user", "item"))
    g = dgl.heterograph({**{e: BIPARTITE.edges(etype=e) for e in BIPARTITE.canonical_etypes},
                         ("tag", "tags", "item"): (torch.tensor([0]), torch.tensor([0]))},
                        num_nodes_dict={"user": 300, "item": 200, "tag": 4})
    tag = dgl_oac.NodeEmbedding(4, DIM, "emb_tag")
    tables = {"tag": tag, **embs}
    opt = dgl_oac.SparseSGD(list(tables.values()), lr=0.5)
    loader = dgl_oac.DataLoader(g, {"user": torch.arange(0, 300, 3)}, dgl.dataloading.NeighborSampler([3]),
                                embeddings=tables, batch_size=25, seed=1, prefetch=2)
    for i, (input_nodes, _, blocks) in enumerate(loader):
        assert input_nodes["tag"].numel() == 0 and blocks[0].srcdata["emb_tag"]["tag"].shape == (0, DIM)
        assert loader.state_dict()["position"] == i  # handed out, not stepped: not done
        # a model skips a type with no input nodes (HeteroGraphConv does): its empty rows get no gradient
        sum((v ** 2).sum() for v in rows_of(blocks[0], tables).values() if v.shape[0]).backward()
        opt.step()
        assert loader.state_dict()["position"] == i + 1
    assert loader.stats.committed == loader.stats.batches == 4
    assert tag.pipeline.steps == 0 and embs["user"].pipeline.steps == 4


# --- bad input ----------------------------------------------------------------------------------------------------
def bad_loader(indices, embeddings=None, graph=None, sampler=None):
    graph = MAG.graph if graph is None else graph
    embeddings = make_tables(graph, LEARNED) if embeddings is None else embeddings
    return dgl_oac.DataLoader(graph, indices, sampler or dgl.dataloading.NeighborSampler([2]),
                              embeddings=embeddings, batch_size=8)


def test_an_id_out_of_range_names_its_type() -> None:
    papers = MAG.graph.num_nodes("paper")
    with pytest.raises(IndexError, match=rf"node type 'paper'.*found id {papers}, valid ids are 0..{papers - 1}"):
        bad_loader({"paper": torch.tensor([0, papers])})
    with pytest.raises(IndexError, match=r"edge type \('user', 'clicks', 'item'\)"):
        bad_loader({"clicks": torch.tensor([BIPARTITE.num_edges("clicks")])}, make_tables(BIPARTITE, ("user",)),
                   BIPARTITE, dgl.dataloading.as_edge_prediction_sampler(
                       dgl.dataloading.NeighborSampler([2]),
                       negative_sampler=dgl.dataloading.negative_sampler.Uniform(1)))


def test_unknown_types_are_named() -> None:
    with pytest.raises(ValueError, match=r"unknown node type 'papers' in indices; the graph has \["):
        bad_loader({"papers": torch.arange(3)})
    with pytest.raises(ValueError, match=r"embeddings: unknown node type 'writer'"):
        bad_loader({"paper": torch.arange(3)}, {"writer": make_tables(MAG.graph, ("author",))["author"]})


def test_an_embedding_of_the_wrong_size_for_its_type_is_refused() -> None:
    wrong = dgl_oac.NodeEmbedding(MAG.graph.num_nodes("paper"), DIM, "wrong")
    authors = MAG.graph.num_nodes("author")
    with pytest.raises(ValueError, match=rf"'wrong' has {wrong.num_embeddings} rows but node type 'author' of the "
                                         rf"graph has {authors} nodes"):
        bad_loader({"paper": torch.arange(3)}, {"author": wrong})


def test_a_heterograph_needs_typed_indices_and_tables() -> None:
    with pytest.raises(TypeError, match=r"several node types .*indices as a dict"):
        bad_loader(torch.arange(3))
    embs = list(make_tables(MAG.graph, ("author", "institution")).values())
    with pytest.raises(TypeError, match=r"embeddings=\{ntype: NodeEmbedding\}"):
        bad_loader({"paper": torch.arange(3)}, embs)
    one = make_tables(MAG.graph, ("author",))["author"]
    with pytest.raises(ValueError, match="bound to two node types"):
        bad_loader({"paper": torch.arange(3)}, {"author": one, "paper": one})


# --- checkpoint and resume --------------------------------------------------------------------------------------------
def parts(run: NodeRun) -> dict:
    return dict(embeddings=run.embs, sparse_opt=run.sparse, dense_modules={"model": run.model},
                dense_optimizers={"dense": run.dense}, loader=run.loader)


def finish(run: NodeRun, it=(), epochs: int = 2) -> Dict[str, torch.Tensor]:
    for batch in it:  # the rest of an epoch under way
        run.step(batch)
    while run.loader.state_dict()["epoch"] < epochs:
        for batch in run.loader:
            run.step(batch)
    out = {nt: e.store.table.clone() for nt, e in run.embs.items() if not e.flush()}
    out.update({f"model.{k}": v.clone() for k, v in run.model.state_dict().items()})
    for e in run.embs.values():
        e.close()
    return out


@pytest.mark.parametrize("mode", ["sync", "oac"])
def test_resume_on_a_heterograph_equals_uninterrupted(tmp_path, mode: str) -> None:
    path = tmp_path / "hetero.ckpt"
    ref = NodeRun(mode, "adam", prefetch=3)
    it = iter(ref.loader)
    for _ in range(5):
        ref.step(next(it))
    save_checkpoint(path, **parts(ref))
    expect = finish(ref, it)

    resumed = NodeRun(mode, "adam", prefetch=3, init_seed=9)  # other initial values: all must come from the file
    load_checkpoint(path, **parts(resumed))
    assert resumed.loader.state_dict() == {"seed": 3, "epoch": 0, "position": 5}
    got = finish(resumed)
    assert got.keys() == expect.keys()
    for k in expect:
        assert torch.equal(got[k], expect[k]), k
