"""Memory bounds of a long oac run: the pipeline holds O(prefetch x batch rows x width) and the write log stays at
its initial capacity, so the process's RSS is flat after warm-up. A control in the same run (keeping every
batch's rows alive) shows the measurement would catch a leak of one batch per step.

The run happens in a fresh interpreter: in the test process, memory freed by earlier tests is reused by the
allocator without growing RSS, which would hide a leak (the control showed 0 MB there)."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.hang_timeout(180)
MB = 2**20
PREFETCH, DEPTH, WARMUP, STEADY, LEAKY = 4, 3, 100, 330, 390


def measure() -> dict:
    """The oac run; returns RSS per step and the pipeline's sizes (run by the test in a subprocess)."""
    import dgl
    import psutil
    import torch

    import dgl_oac
    from conftest import power_law_graph, seeded_init

    torch.set_num_threads(1)
    graph = power_law_graph(3000, seed=3)
    emb = dgl_oac.NodeEmbedding(graph.num_nodes(), 32, "e", seeded_init(0))
    opt = dgl_oac.SparseAdam([emb], lr=0.01)
    head = torch.nn.Linear(32, 4)
    dense = torch.optim.Adam(head.parameters(), lr=0.01)
    loader = dgl_oac.DataLoader(graph, torch.arange(graph.num_nodes()), dgl.dataloading.NeighborSampler([5, 5]),
                                embeddings=[emb], mode="oac", batch_size=32, shuffle=True, seed=1,
                                prefetch=PREFETCH, writeback_depth=DEPTH)
    proc = psutil.Process()
    out = {"rss": [], "entries": [], "queued": [], "capacity": [], "log_nbytes": []}
    kept = []  # the control phase keeps 8 x every batch's rows alive: a deliberate leak
    while len(out["rss"]) < LEAKY:
        for batch in loader:
            x = batch[-1][0].srcdata["e"]
            loss = torch.nn.functional.cross_entropy(head(x)[: batch[1].numel()], batch[1] % 4)
            dense.zero_grad()
            loss.backward()
            dense.step()
            opt.step()
            if len(out["rss"]) >= STEADY:
                kept.append((x.detach().repeat(1, 8), batch))
            out["entries"].append(len(emb.pipeline.log.entries))
            out["queued"].append(emb.pipeline.writer._worker.inbox.qsize())
            out["capacity"].append(emb.pipeline.log.capacity)
            out["log_nbytes"].append(emb.pipeline.log.nbytes())
            out["rss"].append(proc.memory_info().rss)
            if len(out["rss"]) == LEAKY:
                break
    out.update(max_in_flight=loader.stats.max_in_flight, rows_per_batch=loader.stats.rows_read / loader.stats.batches,
               width=emb.store.width, num_nodes=graph.num_nodes())
    loader.close()
    emb.close()
    return out


def test_rss_flat_and_write_log_bounded_over_a_long_oac_run():
    here = Path(__file__).resolve().parent
    code = f"import json, sys; sys.path[:0] = [{str(here)!r}, {str(here.parent)!r}]; import test_memory; " \
           f"print(json.dumps(test_memory.measure()))"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=170)
    assert run.returncode == 0, run.stderr[-3000:]
    m = json.loads(run.stdout.strip().splitlines()[-1])
    rss = m["rss"]
    growth = (max(rss[WARMUP:STEADY]) - rss[WARMUP]) / MB
    drift = (rss[STEADY - 1] - rss[WARMUP]) / MB
    assert growth < 8 and abs(drift) < 4, f"RSS grew {growth:.1f} MB (drift {drift:.1f} MB) after warm-up"
    assert len(set(m["capacity"])) == 1, f"the write log's ring grew during a steady run: {sorted(set(m['capacity']))}"
    assert max(m["log_nbytes"]) <= m["capacity"][0] * m["width"] * 4 + m["num_nodes"] * 8
    assert max(m["entries"]) <= PREFETCH + DEPTH + 2, f"write log kept {max(m['entries'])} steps"
    assert max(m["queued"]) <= DEPTH and m["max_in_flight"] <= PREFETCH
    # control: the same measurement sees 8 x one batch's rows kept per step
    expect = (LEAKY - STEADY) * m["rows_per_batch"] * 32 * 4 * 8 / MB
    leaked = (rss[LEAKY - 1] - rss[STEADY - 1]) / MB
    assert leaked > 0.5 * expect and leaked > 8, f"a deliberate leak of ~{expect:.0f} MB showed only {leaked:.1f} MB"
