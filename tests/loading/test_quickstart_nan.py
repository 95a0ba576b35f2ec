"""README's Quickstart loop, as written there, keeps both the dense model and the table intact when a batch is not
finite (issue 38): ``sparse_opt.step()`` (which raises ``FloatingPointError`` and writes nothing) runs before
``dense_opt.step()``. With the two steps the other way round the dense model would already hold NaN."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Dict, List

import pytest
import torch

import dgl_oac
import dgl_oac.app.models as models

ORIGINAL_SAGE = models.SAGE
README = Path(__file__).resolve().parents[2] / "README.md"
BAD_BATCH = 2  # the forward pass (0-based) whose output is made NaN


def quickstart() -> str:
    """The python block under README's "## Quickstart" heading."""
    text = README.read_text(encoding="utf-8")
    section = text.split("## Quickstart", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


class Recorder:
    """Wraps the Quickstart's SAGE: records the dense parameters and the table just before the bad batch's
    forward, and makes that batch's output NaN."""

    def __init__(self) -> None:
        self.calls, self.before, self.emb = 0, {}, None  # emb: the Quickstart's table, once made

    def make(self, *args, **kwargs):
        model = ORIGINAL_SAGE(*args, **kwargs)
        forward = model.forward

        def patched(blocks, x):
            out = forward(blocks, x)
            if self.calls == BAD_BATCH:
                self.before = {"dense": [p.detach().clone() for p in model.parameters()], "model": model,
                               "table": self.emb.weight.clone()}
                out = out * float("nan")
            self.calls += 1
            return out

        model.forward = patched
        return model



def run_quickstart(code: str, monkeypatch: pytest.MonkeyPatch) -> Dict[str, object]:
    recorder = Recorder()
    monkeypatch.setattr(models, "SAGE", recorder.make)
    made: List[dgl_oac.NodeEmbedding] = []
    original = dgl_oac.NodeEmbedding

    def node_embedding(*args, **kwargs):
        emb = original(*args, **kwargs)
        made.append(emb)
        recorder.emb = emb
        return emb

    monkeypatch.setattr(dgl_oac, "NodeEmbedding", node_embedding)
    namespace: Dict[str, object] = {"__name__": "__main__"}
    try:
        with pytest.raises(FloatingPointError, match="NaN or Inf"):
            exec(compile(code, str(README), "exec"), namespace)
        before = recorder.before
        return {**before, "dense_after": [p.detach().clone() for p in before["model"].parameters()],
                "table_after": recorder.emb.weight.clone()}
    finally:
        for emb in made:
            emb.close()


def test_quickstart_order_keeps_model_and_table_intact(monkeypatch):
    code = quickstart()
    assert code.index("sparse_opt.step()") < code.index("dense_opt.step()")  # the order under test
    run = run_quickstart(code, monkeypatch)
    assert all(torch.equal(a, b) for a, b in zip(run["dense_after"], run["dense"]))  # the model as before the batch
    assert torch.equal(run["table_after"], run["table"])  # the table as before the batch: nothing written
    assert torch.isfinite(run["table_after"]).all()


def test_the_other_order_leaves_nan_in_the_model(monkeypatch):
    """What the order prevents: stepping the dense optimizer first writes the NaN batch into the model (the
    table is still kept: the sparse step refuses the batch)."""
    code = quickstart().replace(
        "dense_opt.zero_grad(); loss.backward()\n", "dense_opt.zero_grad(); loss.backward(); dense_opt.step()\n")
    code = re.sub(r"\n    dense_opt\.step\(\)[^\n]*", "", code)
    assert code.index("dense_opt.step()") < code.index("sparse_opt.step()")
    run = run_quickstart(code, monkeypatch)
    assert any(not torch.isfinite(p).all() for p in run["dense_after"])
    assert torch.equal(run["table_after"], run["table"])
