"""Heterographs on a device without DGL's CUDA build (issue 23): a heterogeneous block as index tensors
(:class:`dgl_oac.dgl_frontend.blocks.HeteroIndexBlock`), R-GCN over it equal to R-GCN over DGL's blocks, and the
loader's structure copy (the CUDA path, through the recording fake streams on CPU) handing out HeteroIndexBlocks that
the
tables' rows are attached to and the model trains on."""
import dgl
import pytest
import torch

import dgl_oac
from dgl_oac.app.data import load
from dgl_oac.app.models.rgcn import RGCN
from dgl_oac.dgl_frontend.blocks import HeteroIndexBlock, IndexBlock, graph_to, index_structure
from dgl_oac.dgl_frontend.structure import StructureCopy
from dgl_oac.dgl_frontend.loader import DataLoader

from fakes import RecordingStreams

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def mag():
    return load("synthetic-mag")


def _sample(g, n=48, fanouts=(3, 3)):
    seeds = {"paper": torch.arange(0, 30 * n, 30)}
    return dgl.dataloading.NeighborSampler(list(fanouts)).sample(g, seeds)


def test_hetero_index_block_carries_every_relation(mag):
    _, _, blocks = _sample(mag.graph)
    for b in blocks:
        ib = index_structure(b)
        assert isinstance(ib, HeteroIndexBlock) and ib.canonical_etypes == b.canonical_etypes
        for c, rel in ib.rels.items():
            src, dst = b[c].edges()
            assert sorted(zip(rel.src.tolist(), rel.dst.tolist())) == sorted(zip(src.tolist(), dst.tolist()))
            assert torch.equal(rel.in_deg, b[c].in_degrees()) and rel.num_src == b.num_src_nodes(c[0])
        for t in b.srctypes:
            assert torch.equal(ib.srcdata[dgl.NID][t], b.srcnodes[t].data[dgl.NID])
        moved = ib.with_tensors([t.clone() for t in ib.tensors()])
        assert all(torch.equal(moved.rels[c].src, ib.rels[c].src) for c in ib.rels)
        assert torch.equal(moved.srcdata[dgl.NID]["paper"], ib.srcdata[dgl.NID]["paper"])
    with pytest.raises(TypeError, match="HeteroIndexBlock"):
        IndexBlock.from_dgl(blocks[0])
    assert isinstance(graph_to(blocks[0], "cpu"), dgl.DGLGraph), "on the CPU a model gets DGL's own block"


def test_attached_rows_reach_the_type_view(mag):
    ib = index_structure(_sample(mag.graph)[2][0])
    rows = torch.randn(ib.num_src_nodes("author"), 4)
    ib.srcnodes["author"].data["emb_author"] = rows
    assert ib.srcdata["emb_author"]["author"] is rows and "emb_author" in ib.srcnodes["author"].data
    assert "emb_author" not in ib.srcnodes["paper"].data


def test_rgcn_over_index_blocks_equals_rgcn_over_dgl_blocks(mag):
    g = mag.graph
    input_nodes, _, blocks = _sample(g)
    torch.manual_seed(0)
    dims = {"paper": mag.features["paper"].shape[1], "author": 8, "institution": 8, "field_of_study": 8}
    model = RGCN(dims, 16, mag.num_classes, g.etypes, num_layers=2)
    gen = torch.Generator().manual_seed(1)
    x = {nt: torch.randn(ids.numel(), dims[nt], generator=gen) for nt, ids in input_nodes.items() if ids.numel()}
    want = model(blocks, x)["paper"]
    want.square().sum().backward()
    grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    model.zero_grad()
    got = model([index_structure(b) for b in blocks], x)["paper"]
    got.square().sum().backward()
    assert got.shape == want.shape and torch.allclose(got, want, rtol=0, atol=1e-5), (got - want).abs().max()
    for a, b in zip(grads, [p.grad for p in model.parameters() if p.grad is not None]):
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-4)


def _epoch(mag, index, monkeypatch, mode="oac"):
    """A few trained steps of the hetero task's shape: per batch the R-GCN output; ``index``: the structure copy
    is the recording fake (the CUDA path on CPU: HeteroIndexBlocks handed out)."""
    if index:
        monkeypatch.setattr(DataLoader, "_structure_copy",
                            lambda self: StructureCopy(CPU, "index", False, True, streams=RecordingStreams()))
    g = mag.graph
    embs = {nt: dgl_oac.NodeEmbedding(g.num_nodes(nt), 8, f"hb_{nt}_{index}",
                                      init_func=lambda t: t.copy_(torch.linspace(-1, 1, t.numel()).view_as(t)))
            for nt in ("author", "institution", "field_of_study")}
    opt = dgl_oac.SparseAdagrad(list(embs.values()), lr=0.1)
    torch.manual_seed(0)
    dims = {"paper": mag.features["paper"].shape[1], **{nt: 8 for nt in embs}}
    model = RGCN(dims, 16, mag.num_classes, g.etypes, num_layers=2)
    loader = DataLoader(g, {"paper": mag.train_idx[:160]}, dgl.dataloading.NeighborSampler([3, 3]),
                        embeddings=embs, batch_size=40, shuffle=True, seed=1, mode=mode, prefetch=2)
    outs, kinds = [], set()
    for input_nodes, seeds, blocks in loader:
        kinds.add(type(blocks[0]).__name__)
        x = {nt: blocks[0].srcdata[f"hb_{nt}_{index}"][nt] for nt in embs if input_nodes[nt].numel()}
        x["paper"] = mag.features["paper"][input_nodes["paper"].cpu()]
        out = model(blocks, x)["paper"]
        outs.append(out.detach())
        out.square().mean().backward()
        opt.step()
    monkeypatch.undo()
    tables = {nt: e.weight.clone() for nt, e in embs.items()}
    for e in embs.values():
        e.close()
    return outs, tables, kinds


def test_loader_hands_out_hetero_index_blocks_that_train_like_dgl_blocks(mag, monkeypatch):
    want, want_tables, kinds0 = _epoch(mag, False, monkeypatch)
    got, got_tables, kinds1 = _epoch(mag, True, monkeypatch)
    assert kinds0 == {"DGLBlock"} and kinds1 == {"HeteroIndexBlock"} and len(got) == len(want) == 4
    for a, b in zip(want, got):
        assert torch.allclose(a, b, rtol=0, atol=1e-4), (a - b).abs().max()
    for nt in want_tables:
        assert torch.allclose(want_tables[nt], got_tables[nt], rtol=0, atol=1e-4)
