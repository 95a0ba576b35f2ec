"""dgl_oac.dgl_frontend.blocks: a DGL block's structure as torch index tensors, and the built-in models over it, equal
to DGL's own kernels on CPU (within 1e-6: DGL's spmm sums in another order), including nodes without in-edges."""
import dgl
import pytest
import torch
from dgl.nn import SAGEConv

from dgl_oac.dgl_frontend.blocks import IndexBlock, IndexGraph, aggregate, graph_to
from dgl_oac.app.models.link import LinkPredictor
from dgl_oac.app.models.sage import SAGE, IndexSAGEConv
from dgl_oac.dgl_frontend.sampling.edge import EdgeBatchSampler

from conftest import power_law_graph


def _blocks(fanouts=(4, 3)):
    g = power_law_graph(200, seed=3)
    g = dgl.add_nodes(g, 5)  # isolated nodes: destinations with no in-edge
    seeds = torch.cat([torch.arange(0, 200, 7), torch.arange(200, 205)])
    return dgl.dataloading.NeighborSampler(list(fanouts)).sample(g, seeds)


def test_index_block_carries_the_structure():
    input_nodes, _, blocks = _blocks()
    for b in blocks:
        ib = IndexBlock.from_dgl(b)
        assert (ib.num_src_nodes(), ib.num_dst_nodes(), ib.num_edges()) == (b.num_src_nodes(), b.num_dst_nodes(),
                                                                             b.num_edges())
        assert torch.equal(ib.in_deg, b.in_degrees()) and bool((ib.dst[1:] >= ib.dst[:-1]).all())
        got = sorted(zip(ib.src.tolist(), ib.dst.tolist(), ib.edata[dgl.EID].tolist()))
        assert got == sorted(zip(*(t.tolist() for t in b.edges()), b.edata[dgl.EID].tolist())), "edge data follows"
        assert torch.equal(ib.srcdata[dgl.NID], b.srcdata[dgl.NID])
        moved = ib.with_tensors([t.clone() for t in ib.tensors()])
        assert torch.equal(moved.edata[dgl.EID], ib.edata[dgl.EID]) and torch.equal(moved.dst, ib.dst)
        assert (ib.in_deg == 0).any(), "the test covers destinations without in-edges"


@pytest.mark.parametrize("how", ["mean", "sum"])
def test_aggregate_equals_dgl_update_all(how):
    _, _, blocks = _blocks()
    b = blocks[0]
    x = torch.randn(b.num_src_nodes(), 5, generator=torch.Generator().manual_seed(0))
    b.srcdata["h"] = x
    b.update_all(dgl.function.copy_u("h", "m"), getattr(dgl.function, how)("m", "o"))
    assert torch.allclose(aggregate(IndexBlock.from_dgl(b), x, how), b.dstdata["o"], rtol=0, atol=1e-6)


@pytest.mark.parametrize("in_dim,out_dim", [(8, 3), (3, 8)])  # fc_neigh before / after message passing
def test_index_sage_conv_equals_dgl_sage_conv(in_dim, out_dim):
    _, _, blocks = _blocks()
    b = blocks[0]
    torch.manual_seed(0)
    ref = SAGEConv(in_dim, out_dim, "mean")
    ours = IndexSAGEConv(in_dim, out_dim, "mean")
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(b.num_src_nodes(), in_dim, requires_grad=True)
    x2 = x.detach().clone().requires_grad_(True)
    want, got = ref(b, x), ours(IndexBlock.from_dgl(b), x2)
    assert torch.allclose(got, want, rtol=0, atol=1e-6), (got - want).abs().max()
    want.square().sum().backward()
    got.square().sum().backward()
    assert torch.allclose(x2.grad, x.grad, rtol=0, atol=1e-5)
    assert torch.equal(ours(b, x), want), "DGL blocks still go to DGL's kernels"


def test_sage_and_link_predictor_over_index_structure_equal_dgl():
    g = power_law_graph(150, seed=2)
    sampler = dgl.dataloading.as_edge_prediction_sampler(
        dgl.dataloading.NeighborSampler([3, 3]), negative_sampler=dgl.dataloading.negative_sampler.Uniform(2))
    dgl.seed(0)
    input_nodes, pair, neg, blocks = sampler.sample(g, torch.arange(0, g.num_edges(), 5))
    torch.manual_seed(1)
    model = LinkPredictor(SAGE(6, 8, 4, num_layers=2))
    x = torch.randn(input_nodes.numel(), 6)
    want = model(pair, neg, blocks, x)
    got = model(IndexGraph.from_dgl(pair), IndexGraph.from_dgl(neg), [IndexBlock.from_dgl(b) for b in blocks], x)
    for w, o in zip(want, got):
        assert torch.allclose(o, w, rtol=0, atol=1e-5), (o - w).abs().max()


def test_shallow_link_scoring_over_index_graph_is_exact():
    g = power_law_graph(80, seed=1)
    _, pair, neg, blocks = EdgeBatchSampler(num_negatives=2).sample(g, torch.arange(30))
    model = LinkPredictor(None)
    x = torch.randn(pair.num_nodes(), 4)
    want = model(pair, neg, blocks, x)
    got = model(IndexGraph.from_dgl(pair), IndexGraph.from_dgl(neg), [], x)
    assert all(torch.equal(w, o) for w, o in zip(want, got))


def test_what_the_adapter_cannot_carry_is_named():
    _, _, blocks = _blocks()
    with pytest.raises(ValueError, match="'mean' or 'sum'"):
        aggregate(IndexBlock.from_dgl(blocks[0]), torch.zeros(blocks[0].num_src_nodes(), 2), "max")
    with pytest.raises(ValueError, match="aggregator 'mean'"):
        IndexSAGEConv(2, 2, "pool")(IndexBlock.from_dgl(blocks[0]), torch.zeros(blocks[0].num_src_nodes(), 2))
    hg = dgl.heterograph({("a", "r", "b"): ([0], [0])})
    with pytest.raises(TypeError, match="homogeneous"):
        IndexBlock.from_dgl(dgl.to_block(hg, {"b": torch.tensor([0])}))


def test_graph_to_keeps_dgl_graphs_where_dgl_can_hold_them_and_carries_index_tensors_elsewhere():
    _, _, blocks = _blocks()
    assert graph_to(blocks[0], "cpu") is blocks[0] or isinstance(graph_to(blocks[0], "cpu"), dgl.DGLGraph)
    # "meta": a device DGL cannot hold (as a GPU with PyPI's DGL): the index tensors go there instead
    moved = graph_to(blocks[0], "meta")
    assert isinstance(moved, IndexBlock) and all(t.device.type == "meta" for t in moved.tensors())
    assert moved.num_dst_nodes() == blocks[0].num_dst_nodes()
    g = power_law_graph(30)
    assert isinstance(graph_to(g, "meta"), IndexGraph)
