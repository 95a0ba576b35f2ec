"""Hole 4 of issue 22: sampling workers (``num_workers > 0``) add no copy of the table.

Workers are forked when an epoch starts. A table in private memory is then copy-on-write: every page the
write-back writes while a worker lives is copied, and the worker's private dirty memory grew by the table's
size (215 MiB for a 195 MiB table). The table lives in shared memory (``dgl_oac.engine.table.shared_zeros``)."""
import multiprocessing

import dgl
import pytest
import torch

import dgl_oac

from conftest import power_law_graph

pytestmark = pytest.mark.hang_timeout(120)
MIB = 1 << 20


def table_private_dirty_mib(pid: int, table: torch.Tensor) -> float:
    """Private dirty MiB of process ``pid`` in the mapping that holds ``table``'s memory.

    Only that mapping is counted: a worker forked from a large process (the whole test suite's) also copies
    pages of the parent's Python heap as its garbage collector touches them, which says nothing about the
    table. A private table left behind in the worker by copy on write is private dirty memory of this mapping."""
    addr = table.data_ptr()
    inside, total = False, 0
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and ":" not in head:  # a mapping's header line: "start-end perms ..."
                lo, hi = (int(x, 16) for x in head.split("-"))
                inside = lo <= addr < hi
            elif inside and line.startswith("Private_Dirty:"):
                total += int(line.split()[1])
    return total / 1024


def test_a_worker_does_not_copy_the_table_written_while_it_lives(make_emb):
    rows, dim = 1 << 17, 128  # 64 MiB
    graph = power_law_graph(rows, seed=0, edges_per_node=1)
    emb = make_emb(rows, dim, init=lambda t: t.fill_(0.5))  # every page resident before the fork
    dgl_oac.SparseSGD([emb], lr=0.1)
    loader = dgl_oac.DataLoader(graph, torch.arange(rows), dgl.dataloading.NeighborSampler([2]), embeddings=[emb],
                                mode="sync", batch_size=256, num_workers=1)
    it = iter(loader)
    next(it)  # the epoch runs: its worker was forked
    (worker,) = [p for p in multiprocessing.active_children() if p.name.startswith("dgl-oac-sampling")]
    before = table_private_dirty_mib(worker.pid, emb.store.table)
    ids = torch.arange(rows)
    emb.write_rows(ids, torch.full((rows, dim), 2.0))  # every row of the table written
    emb.flush()
    grown = table_private_dirty_mib(worker.pid, emb.store.table) - before
    loader.close()
    table_mib = rows * dim * 4 / MIB
    assert torch.equal(emb.weight[ids[:: rows // 8]], torch.full((8, dim), 2.0))
    # before the fix: grown ~ 64 MiB (every written page copied for the worker)
    assert grown < table_mib / 8, \
        f"the worker's private dirty memory in the table's mapping grew by {grown:.1f} MiB ({table_mib:.0f} MiB table)"
