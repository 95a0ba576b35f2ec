"""dgl-oac without DGL (issue 37): in a child process where ``import dgl`` fails (a ``sys.meta_path`` finder
refuses ``dgl`` and ``dgl.*``, installed by a ``sitecustomize`` on the child's path), the tables, ``dgl_oac.nn``,
``BatchLoader``, checkpoints and ``dgl-oac train --task kg`` run, and every DGL entry point raises the one
ImportError of :mod:`dgl_oac.needs_dgl`. Runs on Python 3.12+ (no DGL there) as well as beside DGL.
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Dict, List

import pytest

import dgl_oac
from dgl_oac.needs_dgl import INSTALL_HINT

REPO = Path(dgl_oac.__file__).resolve().parent.parent
BLOCKER = '''
import sys


class _NoDGL:
    """Refuses dgl and dgl.*, as an interpreter without DGL installed does."""

    def find_spec(self, name, path=None, target=None):
        if name == "dgl" or name.startswith("dgl."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, _NoDGL())
'''
NO_DGL = "No module named 'dgl'"
KG_ARGS = ["--task", "kg", "--mode", "oac", "--epochs", "2", "--seed", "3", "--threads", "1", "--no-progress",
           "--num-nodes", "300", "--batch-size", "256", "--dim", "8", "--negatives", "8", "--model", "distmult"]


@pytest.fixture(scope="module")
def no_dgl(tmp_path_factory: pytest.TempPathFactory):
    """``run(*argv)``: a child Python, DGL blocked, in the repository root; returns its stdout (asserts exit 0)."""
    site = tmp_path_factory.mktemp("site")
    (site / "sitecustomize.py").write_text(BLOCKER)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(REPO)])}

    def run(*argv: str) -> str:
        proc = subprocess.run([sys.executable, *argv], cwd=REPO, env=env, capture_output=True, text=True,
                              timeout=120)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return proc.stdout
    return run


def script(body: str) -> List[str]:
    return ["-c", textwrap.dedent(body)]


def test_without_dgl_the_tables_train_and_dgl_entry_points_say_how_to_install_dgl(no_dgl, tmp_path):
    """One child: the nn drop-in, BatchLoader and a checkpoint round trip train; DGL's entry points raise
    :func:`dgl_oac.needs_dgl.require_dgl`'s message, exactly."""
    out = no_dgl(*script(f"""
        import json, sys
        import torch
        import dgl_oac
        from dgl_oac.app.tasks import TrainConfig, build_task

        errors = {{}}
        try:
            import dgl
        except ImportError as err:
            errors["dgl"] = str(err)
        try:
            dgl_oac.DataLoader
        except ImportError as err:
            errors["loader"] = str(err)
        try:
            build_task(TrainConfig(task="node", mode="oac", num_nodes=100))
        except ImportError as err:
            errors["node"] = str(err)
        try:
            import dgl_oac.dgl_frontend.blocks
        except ImportError as err:
            errors["frontend"] = str(err)
        import contextlib, io
        from dgl_oac.app.cli import main

        stderr = io.StringIO()
        with contextlib.redirect_stderr(stderr):
            status = main(["train", "--task", "node", "--num-nodes", "100"])
        errors["cli"] = [status, stderr.getvalue()]

        torch.manual_seed(0)
        # torch's nn.Embedding(sparse=True) drop-in, a few steps
        emb = dgl_oac.nn.Embedding(50, 4, sparse=True)
        opt = dgl_oac.nn.SparseAdam(emb.parameters(), lr=0.1)
        nn_losses = []
        for _ in range(3):
            loss = emb(torch.tensor([1, 2, 2, 7])).pow(2).sum()
            opt.zero_grad()
            loss.backward()
            opt.step()
            nn_losses.append(float(loss))
        # BatchLoader over a plain list of id batches, oac, then a checkpoint round trip
        table = dgl_oac.NodeEmbedding(50, 4, "t", init_func=lambda t: t.uniform_(-1, 1))
        sparse = dgl_oac.SparseAdagrad([table], lr=0.1)
        batches = [torch.randint(0, 50, (8,)) for _ in range(6)]
        losses = []
        with dgl_oac.BatchLoader(batches, ids={{table: lambda b: b}}, mode="oac", prefetch=2, seed=1) as loader:
            for b in loader:
                loss = table(b).pow(2).sum()
                loss.backward()
                sparse.step()
                losses.append(float(loss))
        from dgl_oac.checkpoint import load_checkpoint, save_checkpoint
        save_checkpoint(r"{tmp_path / 'ckpt'}", embeddings=[table], sparse_opt=sparse)
        saved = table.weight.clone()
        table.all_set_embedding(torch.zeros(50, 4))
        load_checkpoint(r"{tmp_path / 'ckpt'}", embeddings=[table], sparse_opt=sparse)
        print(json.dumps({{"nn": nn_losses, "loader": losses, "restored": bool(torch.equal(table.weight, saved)),
                          "dgl_loaded": "dgl" in sys.modules, "errors": errors}}))
    """))
    got = json.loads(out.strip().splitlines()[-1])
    cause = f"(ModuleNotFoundError: {NO_DGL}); "
    assert got["errors"] == {
        "dgl": NO_DGL,
        "loader": "dgl_oac.DataLoader needs DGL, which did not import " + cause + INSTALL_HINT,
        "node": "dgl-oac train --task node needs DGL, which did not import " + cause + INSTALL_HINT,
        "frontend": "dgl_oac.dgl_frontend (dgl_oac.DataLoader, DGL's samplers, blocks and heterographs) needs DGL, "
                    "which did not import " + cause + INSTALL_HINT,
        # the command line: one line and exit status 2 (a usage error), no traceback
        "cli": [2, "dgl-oac: error: dgl-oac train --task node needs DGL, which did not import " + cause + INSTALL_HINT
                + "\n"],
    }
    assert 'pip install "dgl-oac[dgl]"' in INSTALL_HINT and "pip install dgl==1.1.3" in INSTALL_HINT
    assert "Python >= 3.12" in INSTALL_HINT and "DGL_FFI=ctypes" in INSTALL_HINT
    assert len(got["nn"]) == 3 and all(math.isfinite(x) for x in got["nn"])
    assert got["nn"][-1] < got["nn"][0]  # the drop-in's steps moved the rows
    assert len(got["loader"]) == 6 and all(math.isfinite(x) for x in got["loader"])
    assert got["restored"] and not got["dgl_loaded"]


def kg_curve(summary: Dict) -> List[Dict]:
    timing = {"train_seconds", "epoch_seconds", "eval_seconds"}
    return [{k: v for k, v in point.items() if k not in timing} for point in summary["curve"]]


@pytest.fixture(scope="module")
def kg_without_dgl(no_dgl, tmp_path_factory: pytest.TempPathFactory) -> Dict:
    """The summary of ``python -m dgl_oac train --task kg`` (``KG_ARGS``) in a child without DGL."""
    out = tmp_path_factory.mktemp("kg") / "kg.json"
    no_dgl("-m", "dgl_oac", "train", *KG_ARGS, "--out", str(out))
    return json.loads(out.read_text())


def test_kg_task_trains_without_dgl(kg_without_dgl):
    """Without DGL the KG task runs on BatchLoader over :class:`dgl_oac.sampling.edge_batch.EdgeBatches`."""
    curve = kg_curve(kg_without_dgl)
    assert kg_without_dgl["steps"] >= 4 and len(curve) == 2
    assert all(math.isfinite(p["train_loss"]) and math.isfinite(p["valid_mrr"]) for p in curve)
    assert kg_without_dgl["loader_stats"]["rows_read"] > 0  # dgl-oac's loader fed the table


def test_kg_without_dgl_equals_the_dgl_loaders_run(kg_without_dgl, tmp_path):
    """Where DGL is installed, the same run on dgl_oac.DataLoader (DGL's EdgeBatchSampler) gives the same curve,
    bit for bit: the batches are the same (same shuffle, same per-batch seeds)."""
    pytest.importorskip("dgl")
    from dgl_oac.app.cli import main

    with_dgl = tmp_path / "kg-dgl.json"
    assert main(["train", *KG_ARGS, "--out", str(with_dgl)]) == 0
    assert kg_curve(json.loads(with_dgl.read_text())) == kg_curve(kg_without_dgl)
