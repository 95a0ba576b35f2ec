"""dgl_oac.transfer on CPU: the row-buffer pool (reuse, what it refuses) and its use by a loader."""
import dgl
import pytest
import torch

import dgl_oac
from dgl_oac.transfer import BufferPool


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
