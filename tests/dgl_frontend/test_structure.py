"""dgl_oac.dgl_frontend.structure on CPU: a batch's graphs, seeds and input nodes travel on the side stream, started
by the gather thread and handed to the compute stream at hand-out (through the ``CudaStreams`` seam with the recording
fake of test_transfer), for node and link batches; input nodes copied once; ``structure``, ``pin_prefetcher``
and ``use_alternate_streams`` resolved or refused by name."""
import threading

import dgl
import pytest
import torch

import dgl_oac
from dgl_oac.dgl_frontend.loader import DataLoader
from dgl_oac.dgl_frontend.blocks import IndexBlock, IndexGraph
from dgl_oac.app.models.sage import SAGE
from dgl_oac.dgl_frontend.sampling.edge import EdgeBatchSampler
from dgl_oac.dgl_frontend.structure import Carried, StructureCopy, dgl_stream_options, resolve_structure

from conftest import power_law_graph
from fakes import RecordingStreams

CPU, CUDA = torch.device("cpu"), torch.device("cuda")


def test_resolve_structure():
    assert resolve_structure("auto", CPU, False) == "dgl"
    assert resolve_structure("auto", CUDA, False) == "index"  # PyPI's DGL: index tensors
    assert resolve_structure("auto", CUDA, True) == "dgl"  # a CUDA build of DGL: its own graphs and kernels
    assert resolve_structure("index", CPU, False) == "index"
    with pytest.raises(ValueError, match="needs a CUDA build of DGL"):
        resolve_structure("dgl", CUDA, False)
    with pytest.raises(ValueError, match="structure must be one of"):
        resolve_structure("torch", CPU, False)


def test_dgl_stream_options_are_honoured_or_refused():
    kw = {"use_alternate_streams": True, "pin_prefetcher": False, "other": 1}
    assert dgl_stream_options("auto", kw) is False and kw == {"other": 1}
    assert dgl_stream_options(True, {"pin_prefetcher": True}) is True
    assert dgl_stream_options("auto", {}) == "auto"
    with pytest.raises(ValueError, match="use_alternate_streams=False"):
        dgl_stream_options("auto", {"use_alternate_streams": False})
    with pytest.raises(ValueError, match="contradicts pin=True"):
        dgl_stream_options(True, {"pin_prefetcher": False})
    g = power_law_graph(30)
    with pytest.raises(ValueError, match="use_alternate_streams=False"):
        DataLoader(g, torch.arange(30), dgl.dataloading.NeighborSampler([2]), use_alternate_streams=False)
    DataLoader(g, torch.arange(30), dgl.dataloading.NeighborSampler([2]), use_alternate_streams=True)


def _copy(skip_input_nodes=True):
    fake = RecordingStreams()
    return StructureCopy(CPU, "index", False, skip_input_nodes, streams=fake), fake


def test_node_batch_structure_is_copied_on_the_side_stream_and_recorded_at_hand_out():
    g = power_law_graph(100, seed=1)
    result = dgl.dataloading.NeighborSampler([3, 3]).sample(g, torch.arange(10))
    sc, fake = _copy()
    carried = sc.start(result)
    assert isinstance(carried, Carried)
    input_nodes, seeds, blocks = carried.result
    assert input_nodes is result[0], "input nodes are not copied here: the tables' device ids are handed out"
    assert all(isinstance(b, IndexBlock) for b in blocks)
    want = [seeds] + [t for b in blocks for t in b.tensors()]
    assert [t.data_ptr() for t in carried.tensors] == [t.data_ptr() for t in want]
    side = sc.transfer.h2d_stream
    assert fake.log[0] == ("enter", side) and fake.log[-2:] == [("event.record", side), ("exit", side)]
    out = sc.finish(carried)
    current = fake.currents[CPU]
    assert out is carried.result and current.waited_events == [carried.event]
    recorded = [(e[1], e[2]) for e in fake.log if e[0] == "record"]
    assert recorded == [(t.data_ptr(), current) for t in want], "every copied tensor recorded on compute"


def test_link_batch_pair_graphs_become_index_graphs():
    g = power_law_graph(80, seed=2)
    g.edata["etype"] = torch.arange(g.num_edges()) % 3  # a KG's relations travel with the pairs
    result = EdgeBatchSampler(num_negatives=2).sample(g, torch.arange(20))
    sc, _ = _copy(skip_input_nodes=False)
    out = sc.finish(sc.start(result))
    assert isinstance(out[1], IndexGraph) and isinstance(out[2], IndexGraph)
    assert torch.equal(out[1].src, result[1].edges()[0]) and out[1].num_nodes() == result[1].num_nodes()
    assert torch.equal(out[0], result[0])
    for key in (dgl.EID, "etype"):
        assert torch.equal(out[1].edata[key], result[1].edata[key])
    assert torch.equal(out[2].edata["etype"], result[2].edata["etype"])
    assert torch.equal(out[1].ndata[dgl.NID], result[1].ndata[dgl.NID])


def test_cpu_structure_copy_is_the_identity():
    sc = StructureCopy(CPU, "dgl", False, True)
    result = (torch.arange(3), torch.arange(2), [])
    assert sc.start(result) is result and sc.finish(result) is result


def _epoch(mode, patched, monkeypatch):
    """One epoch (trained): each batch's (input nodes, blocks, SAGE output); ``patched``: the structure copy is
    the recording fake (the CUDA path on CPU), and the threads that started each batch's copy are returned."""
    threads = []
    if patched:
        real_start = StructureCopy.start

        def start(self, result):
            threads.append(threading.current_thread().name)
            return real_start(self, result)

        monkeypatch.setattr(StructureCopy, "start", start)
        monkeypatch.setattr(DataLoader, "_structure_copy",
                            lambda self: StructureCopy(CPU, "index", False, True, streams=RecordingStreams()))
    g = power_law_graph(120, seed=3)
    emb = dgl_oac.NodeEmbedding(120, 6, "x", init_func=lambda t: t.copy_(torch.linspace(-1, 1, t.numel()).view_as(t)))
    opt = dgl_oac.optim.SparseAdagrad([emb], lr=0.1)
    torch.manual_seed(0)
    model = SAGE(6, 8, 3)
    loader = DataLoader(g, torch.arange(120), dgl.dataloading.NeighborSampler([3, 3]), embeddings=[emb],
                        batch_size=20, shuffle=True, seed=1, mode=mode, prefetch=2)
    seen = []
    for input_nodes, seeds, blocks in loader:
        out = model(blocks, blocks[0].srcdata["x"])
        seen.append((input_nodes, blocks, out.detach()))
        out.sum().backward()
        opt.step()
    monkeypatch.undo()
    emb.close()
    return seen, threads


@pytest.mark.parametrize("mode", ["sync", "oac"])
def test_loader_starts_the_copy_on_the_gather_thread_and_models_train_on_index_blocks(monkeypatch, mode):
    """oac starts every batch's copy on the gather thread, sync at hand-out; the handed-out IndexBlocks carry
    the batch's structure, and SAGE over them equals SAGE over DGL's blocks within 1e-6 at every step."""
    want, _ = _epoch(mode, False, monkeypatch)
    got, threads = _epoch(mode, True, monkeypatch)
    assert len(got) == len(want) == len(threads) == 6
    for (n0, b0, o0), (n1, b1, o1) in zip(want, got):
        assert torch.equal(n0, n1) and all(isinstance(b, IndexBlock) for b in b1)
        for d, i in zip(b0, b1):
            ref = IndexBlock.from_dgl(d)
            assert torch.equal(ref.src, i.src) and torch.equal(ref.dst, i.dst) and ref.num_src == i.num_src
        assert torch.allclose(o0, o1, rtol=0, atol=1e-5), (o0 - o1).abs().max()
    gather = [t for t in threads if t.startswith("dgl-oac-gather")]
    assert (len(gather) == len(threads)) if mode == "oac" else not gather, threads


def test_dgl_graphs_move_on_the_compute_stream_after_the_wait(monkeypatch):
    """structure="dgl" (a CUDA build of DGL): the seeds take the side stream and are recorded on compute; the
    graphs are moved at hand-out on the compute stream, after it waits for the copy, because DGL's arrays cannot
    be recorded on it (memory they took on the side stream could be reused under a running kernel)."""
    g = power_law_graph(60, seed=4)
    result = dgl.dataloading.NeighborSampler([3]).sample(g, torch.arange(8))
    fake = RecordingStreams()
    sc = StructureCopy(CPU, "dgl", False, True, streams=fake)
    moved_on = []
    real_to = dgl.DGLGraph.to

    def to(self, device, **kw):
        moved_on.append((fake.active, len(fake.log)))
        return real_to(self, device, **kw)

    monkeypatch.setattr(dgl.DGLGraph, "to", to)
    carried = sc.start(result)
    assert moved_on == [] and carried.result[2][0] is result[2][0]  # nothing moved on the side stream
    seeds = carried.result[1]
    out = sc.finish(carried)
    current = fake.currents[CPU]
    assert current.waited_events == [carried.event]
    assert [(e[1], e[2]) for e in fake.log if e[0] == "record"] == [(seeds.data_ptr(), current)]
    wait_at = max(i for i, e in enumerate(fake.log) if e[0] == "record")
    assert [active for active, _ in moved_on] == [None] and moved_on[0][1] > wait_at  # compute stream, after
    assert isinstance(out[2][0], dgl.DGLGraph)
