"""DGL's DistGraph with dgl-oac embeddings: 1 local DistGraphServer and 2 gloo trainers
(:func:`dgl_oac.distributed.distgraph.launch_local`, a free port and a ``file://`` rendezvous, children killed by
pid on timeout).

- Smoke: ``examples/distgraph.py`` in one command (oac): it trains, its losses are finite and fall, every
  process exits cleanly.
- Exactness: DistGraph sampling runs on the servers with their own RNG, so the batches DGL samples in a sync run
  are recorded and replayed: oac at prefetch 4 on the replayed batches ends with tables, optimizer state and
  every rank's losses bitwise equal to sync's (SGD, Adagrad, Adam), with more than 10% of rows patched.
"""
from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, List

import dgl
import pytest
import torch

import dgl_oac
from dgl_oac.distributed.distgraph import launch_local

from conftest import power_law_graph
from helpers import loss_of

NODES, DIM = 100, 4
EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "distgraph.py"


class _Recorder:
    """A DGL sampler that keeps every batch it samples, in order."""

    def __init__(self, sampler: Any) -> None:
        self.sampler, self.batches = sampler, []

    def sample(self, g: Any, seeds: torch.Tensor) -> Any:
        batch = self.sampler.sample(g, seeds)
        self.batches.append(batch)
        return batch


class _Replay:
    """A DGL sampler that hands out recorded batches again, checking that they are asked for in the same order."""

    def __init__(self, batches: List[Any]) -> None:
        for _, _, blocks in batches:
            blocks[0].srcdata.pop("table", None)  # the rows the recording run attached
        self.batches = iter(batches)

    def sample(self, g: Any, seeds: torch.Tensor) -> Any:
        batch = next(self.batches)
        if not torch.equal(batch[1], seeds):
            raise RuntimeError(f"replay asked for seeds {seeds.tolist()}, recorded {batch[1].tolist()}")
        return batch


def _init(t: torch.Tensor) -> torch.Tensor:
    g = torch.Generator().manual_seed(5)
    return t.copy_(torch.rand(t.shape, generator=g) - 0.5)


def _run(g: Any, opt_name: str, mode: str, prefetch: int, sampler: Any) -> tuple:
    emb = dgl_oac.NodeEmbedding(g.num_nodes(), DIM, "table", init_func=_init)
    opt = getattr(dgl_oac.optim, opt_name)([emb], lr=0.05)
    loader = dgl_oac.DataLoader(g, torch.arange(g.num_nodes()), sampler, embeddings=[emb], batch_size=8,
                                shuffle=True, seed=2, use_ddp=True, mode=mode, prefetch=prefetch,
                                background_priority="normal")
    losses = []
    for _ in range(2):
        for _, _, blocks in loader:
            time.sleep(0.02)  # let the gather thread read the next batches now, before this step writes
            loss = loss_of(blocks[0].srcdata["table"])
            loss.backward()
            opt.step()
            losses.append(loss.item())
    s = loader.stats
    return emb.weight.clone(), emb.optm_state.clone(), losses, s.rows_patched, s.rows_read


def _record_and_replay(rank: int, world: int, g: Any) -> dict:
    recorder = _Recorder(dgl.dataloading.NeighborSampler([4, 4]))
    out = {"recorded": _run(g, "SparseAdagrad", "sync", 1, recorder)}
    for opt_name in ("SparseSGD", "SparseAdagrad", "SparseAdam"):
        for mode, prefetch in (("sync", 1), ("oac", 4)):
            out[opt_name, mode] = _run(g, opt_name, mode, prefetch, _Replay(recorder.batches))
    with pytest.raises(ValueError, match="num_workers > 0 with a dgl.distributed.DistGraph"):
        dgl_oac.DataLoader(g, torch.arange(4), recorder, num_workers=1)
    return out


def test_replayed_distgraph_batches_oac_equals_sync(tmp_path: Path) -> None:
    graph = power_law_graph(NODES, seed=1)
    dgl.distributed.partition_graph(graph, "powerlaw", 1, str(tmp_path))
    ranks = launch_local(_record_and_replay, str(tmp_path / "powerlaw.json"), timeout=100.0)
    for rank, out in enumerate(ranks):
        recorded, replayed = out["recorded"], out["SparseAdagrad", "sync"]
        assert torch.equal(recorded[0], replayed[0]) and recorded[2] == replayed[2], f"rank {rank}: replay"
        for opt_name in ("SparseSGD", "SparseAdagrad", "SparseAdam"):
            s, o = out[opt_name, "sync"], out[opt_name, "oac"]
            assert torch.equal(s[0], o[0]) and torch.equal(s[1], o[1]), f"rank {rank}, {opt_name}: table or state"
            assert s[2] == o[2] and len(s[2]) > 0, f"rank {rank}, {opt_name}: losses"
            assert o[3] > 0.1 * o[4], f"rank {rank}, {opt_name}: {o[3]} of {o[4]} rows patched"
    assert not torch.equal(ranks[0]["SparseSGD", "oac"][0], ranks[0]["SparseAdam", "oac"][0])  # runs differ


def test_example_trains_on_a_local_distgraph_and_exits() -> None:
    root = str(EXAMPLE.parents[1])
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, str(EXAMPLE), "--num-nodes", "2000", "--dim", "16", "--epochs", "2",
                             "--timeout", "90"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the script, its server and its trainers
        proc.communicate()
        raise
    assert proc.returncode == 0, err[-3000:]
    result = json.loads(out.strip().splitlines()[-1])
    losses = [e["mean_loss"] for e in result["epochs"]]
    assert result["mode"] == "oac" and result["trainers"] == 2 and len(losses) == 2
    assert all(math.isfinite(x) for x in losses) and losses[1] < losses[0], losses
    assert result["stats"]["committed"] == result["stats"]["batches"] > 0
