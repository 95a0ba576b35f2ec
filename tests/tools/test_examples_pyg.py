"""examples/pyg_metapath2vec.py: PyG's MetaPath2Vec, its import-only port (dgl_oac.nn.swap_embeddings +
SparseAdam) and BatchLoader over its loader. Every variant draws PyG's own batches (the swap draws nothing;
BatchLoader(generators="global") keeps the global stream); oac == sync bit for bit; the port ends within float
rounding of torch's table (rows read several times in a step sum their gradients in another order)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("torch_geometric")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
import pyg_metapath2vec as example  # noqa: E402

STEPS = 30


@pytest.fixture(scope="module")
def runs():
    graph = example.make_graph(authors=600, papers=1200, venues=20)
    return {v: example.train(v, steps=STEPS, dim=16, batch_size=64, prefetch=4, graph=graph)
            for v in example.VARIANTS}


def test_every_variant_draws_pygs_own_batches(runs):
    assert len({r["batches_sha256"] for r in runs.values()}) == 1
    assert all(len(r["losses"]) == STEPS for r in runs.values())


def test_oac_equals_sync_bitwise(runs):
    assert torch.equal(runs["oac"]["table"], runs["sync"]["table"])
    assert runs["oac"]["losses"] == runs["sync"]["losses"]


def test_the_port_trains_torchs_table_to_float_rounding(runs):
    torch.testing.assert_close(runs["swap"]["table"], runs["torch"]["table"], rtol=0, atol=1e-5)
    torch.testing.assert_close(runs["sync"]["table"], runs["swap"]["table"], rtol=0, atol=1e-5)
    assert runs["swap"]["losses"] == pytest.approx(runs["torch"]["losses"], abs=1e-5)
    assert runs["torch"]["losses"][-1] < runs["torch"]["losses"][0]  # it trained


def test_the_script_runs(capsys):
    example.main(["--variant", "oac", "--steps", "5", "--dim", "8"])
    assert '"final_loss"' in capsys.readouterr().out
