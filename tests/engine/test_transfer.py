"""dgl_oac.engine.transfer on CPU: the row-buffer pool (reuse, what it refuses) and its use by a loader; the CUDA
stream path (which stream waits on what, what is recorded where) through the ``CudaStreams`` seam with a
recording fake; the table is never pinned; the write log's sync-free patch (used on CUDA) equals the plain one."""

import dgl
import pytest
import torch

import dgl_oac
from dgl_oac.engine.table import WriteLog
from dgl_oac.engine.transfer import BufferPool, CudaStreams, Transfer

from fakes import RecordingStreams


def test_pool_reuses_a_given_back_buffer_and_ignores_foreign_tensors():
    pool = BufferPool(keep=2)
    a = pool.take(100, 7)
    assert a.shape == (100, 7) and a.dtype == torch.float32
    pool.give_back(a)
    b = pool.take(90, 7)  # fits in a's buffer (100 + 25 spare rows)
    assert b.data_ptr() == a.data_ptr() and b.shape == (90, 7)
    c = pool.take(90, 7)  # a's buffer is taken: a new one
    assert c.data_ptr() != b.data_ptr()
    pool.give_back(torch.empty(90, 7))  # not the pool's: ignored
    pool.give_back(c[:10])  # a view of a pooled buffer gives the whole buffer back
    pool.give_back(c)  # twice: kept once
    assert len(pool._free) == 1
    assert pool.take(200, 7).data_ptr() not in (b.data_ptr(), c.data_ptr())  # too small: a new one
    assert pool.take(5, 8).data_ptr() != c.data_ptr()  # other width: a new one


@pytest.mark.parametrize("mode", ["sync", "async", "oac"])
def test_cpu_loader_cycles_a_few_buffers(mode):
    """Gathered rows (and, in sync/async, the kernel's new rows) come from the pool and go back: 60 steps
    allocate only as many buffers as are in flight at once."""
    gen = torch.Generator().manual_seed(0)
    g = dgl.graph((torch.randint(0, 300, (3000,), generator=gen), torch.randint(0, 300, (3000,), generator=gen)),
                  num_nodes=300)
    emb = dgl_oac.NodeEmbedding(300, 4, "pool", init_func=lambda t: t.normal_())
    opt = dgl_oac.SparseAdam([emb], lr=0.01)
    loader = dgl_oac.DataLoader(g, torch.arange(300), dgl.dataloading.NeighborSampler([3]), embeddings=[emb],
                                mode=mode, prefetch=3, batch_size=10, shuffle=True, seed=0)
    steps = 0
    for _ in range(2):
        for batch in loader:
            (batch[-1][0].srcdata["pool"] ** 2).sum().backward()
            opt.step()
            steps += 1
    in_flight = loader.prefetch + 2 + (loader.writeback_depth + 2 if mode == "async" else 0)
    assert steps == 60 and 1 <= emb.pipeline.transfer.pool.created <= in_flight, emb.pipeline.transfer.pool.created
    emb.close()


# --- the CUDA stream path, through the CudaStreams seam with a recording fake (fakes.RecordingStreams) --------
def fake_transfer(pin=False):
    fake = RecordingStreams()
    return Transfer(torch.device("cpu"), pin, streams=fake), fake


def test_to_device_copies_on_the_h2d_stream_and_records_an_event_there():
    t, fake = fake_transfer()
    assert fake.made == [t.h2d_stream, t.d2h_stream] and t.h2d_stream is not t.d2h_stream
    rows, ids = torch.randn(5, 3), torch.arange(5)
    (rows_dev, ids_dev), event = t.to_device(rows, ids)
    assert torch.equal(rows_dev, rows) and torch.equal(ids_dev, ids)
    assert event.recorded_on == [t.h2d_stream]
    assert fake.log == [("enter", t.h2d_stream), ("event.record", t.h2d_stream), ("exit", t.h2d_stream)]


def test_wait_for_copy_makes_the_devices_current_stream_wait_and_records_tensors_on_it():
    t, fake = fake_transfer()
    tensors = [torch.randn(4, 2), torch.arange(4)]
    (_, _), event = t.to_device(*tensors)
    fake.log.clear()
    t.wait_for_copy(tensors, event)
    # the current stream OF THE TRANSFER'S DEVICE (the old code asked for the current device's stream)
    assert [e for e in fake.log if e[0] == "current"] == [("current", t.device)]
    compute = fake.currents[t.device]
    assert compute.waited_events == [event] and compute.waited_streams == []
    assert [e for e in fake.log if e[0] == "record"] == [("record", x.data_ptr(), compute, None) for x in tensors]
    assert t.h2d_stream.waited_events == [] and t.d2h_stream.waited_events == []


def test_wait_for_copy_without_an_event_touches_no_stream():
    t, fake = fake_transfer()
    t.wait_for_copy([torch.zeros(2)], None)
    assert fake.log == [] and fake.currents == {}


def test_to_host_waits_for_the_compute_stream_then_copies_on_the_d2h_stream():
    t, fake = fake_transfer()
    new = torch.randn(6, 4)
    (host,), event = t.to_host(new)
    assert torch.equal(host, new) and host.data_ptr() != new.data_ptr() and not host.is_pinned()
    compute = fake.currents[t.device]
    assert t.d2h_stream.waited_streams == [compute]  # after the commit kernels of the transfer's device
    assert fake.log[0] == ("current", t.device) and fake.log[1] == ("enter", t.d2h_stream)
    # the source is recorded on the d2h stream (its memory must outlive the copy), inside the stream context
    assert ("record", new.data_ptr(), t.d2h_stream, t.d2h_stream) in fake.log
    assert event.recorded_on == [t.d2h_stream]
    assert fake.log.index(("event.record", t.d2h_stream)) < fake.log.index(("exit", t.d2h_stream))


def test_cuda_events_are_blocking(monkeypatch):
    """A host wait on a copy's event must sleep, not spin a core (``torch.cuda.Event()`` defaults to spinning)."""
    made = []
    monkeypatch.setattr(torch.cuda, "Event", lambda **kwargs: made.append(kwargs) or "event")
    assert CudaStreams().new_event() == "event" and made == [{"blocking": True}]


def test_cpu_transfer_without_streams_is_the_identity():
    t = Transfer(torch.device("cpu"), False)
    x = torch.randn(3, 2)
    (y,), event = t.to_device(x)
    assert y is x and event is None
    (z,), event = t.to_host(x)
    assert z is x and event is None
    assert t.h2d_stream is None and t.d2h_stream is None


# --- item 14: the table is never pinned by the embedding ---------------------------------------------------------
def test_node_embedding_never_pins_its_table():
    emb = dgl_oac.NodeEmbedding(50, 4, "unpinned")
    assert not emb.store.table.is_pinned()
    with pytest.raises(TypeError, match="pin"):
        dgl_oac.NodeEmbedding(50, 4, "pinned", pin=True)
    dgl_oac.SparseAdam([emb], lr=0.1)  # widening the table for optimizer state keeps it unpinned
    assert not emb.store.table.is_pinned()
    emb.close()


# --- item 15: the sync-free patch (CUDA's) equals the plain one ---------------------------------------------------
@pytest.mark.parametrize("seed", range(6))
def test_sync_free_patch_equals_plain_patch(seed):
    """Random steps (overlapping ids, a small ring that wraps and grows), random batches read at random
    versions (with duplicate ids): both patch paths give the same rows and count, on garbage input."""
    gen = torch.Generator().manual_seed(seed)
    n, w = 30, 5
    logs = [WriteLog(n, w, torch.device("cpu"), capacity=8, sync_free=flag) for flag in (False, True)]
    assert [log.sync_free for log in logs] == [False, True]
    patched_any = 0
    for step in range(25):
        ids = torch.randperm(n, generator=gen)[: int(torch.randint(1, 9, (), generator=gen))]
        rows = torch.randn(ids.numel(), w, generator=gen)
        for log in logs:
            log.append(step, ids, rows)
            log.drop_through(step - 6)
        for _ in range(2):
            rv = max(step - int(torch.randint(0, 6, (), generator=gen)), -1)
            batch = torch.randint(0, n, (12,), generator=gen)
            read = torch.randn(12, w, generator=gen)
            out = [read.clone() for _ in logs]
            counts = [int(log.patch(batch, o, rv)) for log, o in zip(logs, out)]
            assert torch.equal(out[0], out[1]), f"step {step}, read version {rv}"
            assert counts[0] == counts[1]
            patched_any += counts[0]
    assert patched_any > 0
    assert logs[0].capacity == logs[1].capacity > 8  # the ring grew: patches read across a regrowth


def test_emb_ids_outside_a_loader_reuses_its_row_buffers():
    """emb(ids) + step() outside a loader takes its rows and the kernel's output from the table's own pool:
    two buffers in steady state, not a fresh tens-of-MB tensor (mapped and page-faulted in) per step. A
    batch still pending keeps its buffer: rows read later never land in it."""
    import dgl_oac

    emb = dgl_oac.NodeEmbedding(1000, 8, "pool_outside_loader", init_func=lambda t: t.uniform_(-1, 1))
    opt = dgl_oac.SparseAdagrad([emb], lr=0.1)
    gen = torch.Generator().manual_seed(0)
    for _ in range(20):
        emb(torch.randint(0, 1000, (300,), generator=gen)).sum().backward()
        opt.step()
    assert emb.pipeline.host_rows.created == 2  # the gathered rows and the kernel's output, reused
    held = emb(torch.tensor([1, 2, 3]))  # pending: no gradient yet
    before = held.detach().clone()
    rows_of_held = emb.pipeline.pending()[0].rows.clone()
    emb(torch.tensor([1, 2, 3, 4])).sum().backward()
    opt.step()  # commits the second read only: the first has no gradient
    assert torch.equal(emb.pipeline.pending()[0].rows, rows_of_held) and torch.equal(held.detach(), before)
    emb.close()


# --- pinned staging: the gather copies rows and ids from pinned memory (issue 35) ----------------------------------
def test_a_pinned_transfer_stages_ids_in_pinned_memory_and_leaves_pinned_ones_alone(monkeypatch):
    t, fake = fake_transfer(pin=True)
    ids = torch.tensor([4, 1, 7])
    staged = t.staged(ids)
    assert torch.equal(staged, ids) and staged.data_ptr() != ids.data_ptr()
    assert fake.log == [("pinned", (3,), torch.int64, staged.data_ptr())]
    monkeypatch.setattr(torch.Tensor, "is_pinned", lambda self: True)
    assert t.staged(ids) is ids  # already pinned: no second copy
    unpinned, _ = fake_transfer(pin=False)
    assert unpinned.staged(ids) is ids and Transfer(torch.device("cpu"), True).pin is False  # no streams, no pin


def test_the_gather_copies_rows_and_ids_from_the_pinned_pool_on_the_copy_stream():
    """A batch's ids ride with its rows: both from buffers the pinned allocator gave, both copied inside the h2d
    stream, behind one event (a copy from pageable memory could make the gather thread wait)."""
    from dgl_oac.engine.pipeline import gather_batch_rows, release_all

    emb = dgl_oac.NodeEmbedding(50, 4, "pinned_ids", init_func=lambda x: x.normal_())
    table = emb.pipeline
    table.prepare(torch.device("cpu"), False, "oac")
    table.transfer, fake = fake_transfer(pin=True)
    copied = []
    real = Transfer.to_device
    table.transfer.to_device = lambda *ts: copied.extend(ts) or real(table.transfer, *ts)
    ids = torch.tensor([3, 9, 27, 4])
    (rows,) = gather_batch_rows([table], [ids])
    pinned = {(shape, dtype): ptr for kind, shape, dtype, ptr in (e for e in fake.log if e[0] == "pinned")}
    assert pinned.keys() == {((4, table.store.width), torch.float32), ((4,), torch.int64)}
    assert [c.data_ptr() for c in copied] == [pinned[((4, table.store.width), torch.float32)],
                                              pinned[((4,), torch.int64)]]
    assert torch.equal(rows.ids_dev, ids) and rows.ids is ids  # the host keeps the CPU ids
    assert torch.equal(rows.rows, table.store.gather(ids))
    assert [e for e in fake.log if e[0] in ("enter", "exit")] == [("enter", t := table.transfer.h2d_stream),
                                                                  ("exit", t)]
    release_all([table], [rows])
    emb.close()


def test_to_device_now_is_the_identity_on_the_cpu():
    from dgl_oac.engine.transfer import to_device_now

    a, b = torch.arange(3), torch.ones(2, 2)
    assert all(x is y for x, y in zip(to_device_now(torch.device("cpu"), a, b), (a, b)))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_to_device_now_copies_from_pinned_memory_without_a_host_sync():
    from dgl_oac.engine.syncaudit import sync_debug
    from dgl_oac.engine.transfer import to_device_now

    a = torch.arange(1000)
    with sync_debug("error"):
        (out,) = to_device_now(torch.device("cuda"), a)
    assert torch.equal(out.cpu(), a)
