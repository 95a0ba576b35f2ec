"""dgl_oac.checkpoint: a run resumed from a mid-epoch checkpoint ends bitwise equal to an uninterrupted run (table
values, optimizer state, dense model); a checkpoint (main file + tables folder written through
torch.distributed.checkpoint) is replaced atomically, also when the saving process is SIGKILLed at random moments,
and every byte is covered by a checksum, so truncation and bit flips raise CheckpointError naming the file and
leave the objects untouched; the CLI's --checkpoint-dir/--checkpoint-every/--resume, including a SIGKILL
mid-training (scripts/kill_resume.py)."""
import json
import os
import re
import shutil
import signal
import subprocess
import threading
import sys
import time
from pathlib import Path

import dgl
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dgl_oac
from dgl_oac.checkpoint import rows as ckpt_rows
from dgl_oac.checkpoint import CheckpointError, CheckpointReader, load_checkpoint, save_checkpoint

from conftest import is_pipeline_thread, power_law_graph, seeded_init

pytestmark = pytest.mark.hang_timeout(120)
ROOT = Path(__file__).resolve().parents[2]
GRAPH = power_law_graph(300, seed=1)
OPTS = {"sgd": (dgl_oac.SparseSGD, {"lr": 0.3}), "adagrad": (dgl_oac.SparseAdagrad, {"lr": 0.1}),
        "adam": (dgl_oac.SparseAdam, {"lr": 0.05})}


def live_threads():
    """The dgl-oac background threads alive now (objects: names repeat across loaders)."""
    return {t for t in threading.enumerate() if is_pipeline_thread(t)}


def started_since(before):
    """Names of dgl-oac threads alive now that were not alive at ``before`` (other tests' leftovers ignored)."""
    return sorted(t.name for t in live_threads() - before)


class Run:
    """One training setup: embedding + sparse optimizer + a dense model with dropout (uses the torch RNG) +
    its Adam + a shuffled loader. Built from ``init_seed`` so a resumed run starts from different values."""

    def __init__(self, mode, opt_name="adam", init_seed=0, storage="memory", name="emb", prefetch=3):
        torch.manual_seed(init_seed)
        self.emb = dgl_oac.NodeEmbedding(GRAPH.num_nodes(), 6, name, seeded_init(init_seed), storage=storage)
        cls, kw = OPTS[opt_name]
        self.sparse = cls([self.emb], **kw)
        self.model = torch.nn.Sequential(torch.nn.Dropout(0.3), torch.nn.Linear(6, 3))
        self.dense = torch.optim.Adam(self.model.parameters(), lr=0.01)
        self.loader = dgl_oac.DataLoader(GRAPH, torch.arange(GRAPH.num_nodes()),
                                         dgl.dataloading.NeighborSampler([3, 3]), embeddings=[self.emb],
                                         mode=mode, batch_size=20, shuffle=True, seed=7, prefetch=prefetch)

    def parts(self):
        return dict(embeddings=[self.emb], sparse_opt=self.sparse, dense_modules={"model": self.model},
                    dense_optimizers={"dense": self.dense}, loader=self.loader)

    def step(self, batch):
        x = batch[-1][0].srcdata[self.emb.name]
        loss = torch.nn.functional.cross_entropy(self.model(x), (batch[0] % 3))
        self.dense.zero_grad()
        loss.backward()
        self.dense.step()
        self.sparse.step()

    def finish(self, epochs=2):
        while self.loader.state_dict()["epoch"] < epochs:
            for batch in self.loader:
                self.step(batch)
        return self.result()

    def result(self):
        self.emb.flush()
        return self.emb.store.table.clone(), [p.detach().clone() for p in self.model.parameters()]

    def close(self):
        self.loader.close()
        self.emb.close()


def assert_same(a, b):
    (ta, pa), (tb, pb) = a, b
    assert torch.equal(ta, tb), f"tables differ by up to {(ta - tb).abs().max().item()}"
    assert all(torch.equal(x, y) for x, y in zip(pa, pb))


# --- resume equals uninterrupted -------------------------------------------------------------------------------
@pytest.mark.parametrize("mode,opt_name,where", [("sync", "adagrad", "after_step"), ("oac", "adam", "after_step"),
                                                  ("oac", "sgd", "after_step"), ("oac", "adam", "between_next_and_step"),
                                                  ("sync", "adam", "between_next_and_step")])
def test_mid_epoch_resume_equals_uninterrupted(tmp_path, mode, opt_name, where):
    path = tmp_path / "run.ckpt"
    ref = Run(mode, opt_name)
    saved_at = None
    while ref.loader.state_dict()["epoch"] < 2:
        for i, batch in enumerate(ref.loader):
            if ref.loader.state_dict()["epoch"] == 0 and i == 6 and where == "between_next_and_step":
                save_checkpoint(path, **ref.parts(), extra={"note": "before step 6"})  # batch 6 not stepped
                saved_at = ref.loader.state_dict()
            ref.step(batch)
            if ref.loader.state_dict()["epoch"] == 0 and i == 6 and where == "after_step":
                save_checkpoint(path, **ref.parts(), extra={"note": "after step 6"})
                saved_at = ref.loader.state_dict()
    expect = ref.result()
    ref.close()
    assert saved_at == {"seed": 7, "epoch": 0, "position": 6 if where == "between_next_and_step" else 7}

    resumed = Run(mode, opt_name, init_seed=99)  # different initial values and RNG: all must come from the file
    extra = load_checkpoint(path, **resumed.parts())
    assert extra == {"note": "before step 6" if where == "between_next_and_step" else "after step 6"}
    assert resumed.loader.state_dict() == saved_at
    assert_same(resumed.finish(), expect)
    assert resumed.loader.state_dict() == {"seed": 7, "epoch": 2, "position": 0}
    resumed.close()


def test_resume_into_file_backed_table(tmp_path):
    """Saved from an in-memory table, resumed into a file-backed one (load writes the file, not the map)."""
    path = tmp_path / "run.ckpt"
    ref = Run("oac", "adagrad")
    for i, batch in enumerate(ref.loader):
        ref.step(batch)
        if i == 4:
            save_checkpoint(path, **ref.parts())
    expect = ref.finish()
    ref.close()
    resumed = Run("oac", "adagrad", init_seed=5, storage=tmp_path / "table.bin")
    load_checkpoint(path, **resumed.parts())
    assert_same(resumed.finish(), expect)
    resumed.close()


def test_chunked_streaming_round_trip(tmp_path, monkeypatch):
    """Chunks that do not divide the table (rows of 6+13 floats, 1000-byte chunks: 13 rows, one file each)
    round-trip exactly, from and into memory and file-backed tables."""
    monkeypatch.setattr(ckpt_rows, "CHUNK_BYTES", 1000)
    for storage in ("memory", tmp_path / "t.bin"):
        r = Run("sync", "adam", storage=storage)
        r.emb.store.state()[:] = torch.randn(r.emb.store.state().shape)
        save_checkpoint(tmp_path / "c.ckpt", **r.parts())
        reader = CheckpointReader(tmp_path / "c.ckpt")
        assert len(list(reader.folder.glob("*.distcp"))) == -(-300 // 13)
        table = r.emb.store.table.clone()
        assert torch.equal(reader.table("emb"), table)
        r.emb.store.table.zero_()
        load_checkpoint(tmp_path / "c.ckpt", **r.parts())
        assert torch.equal(r.emb.store.table, table)
        r.close()


# --- atomic writes ----------------------------------------------------------------------------------------------
def listing(folder):
    return sorted(p.name for p in folder.iterdir())


def test_failed_save_keeps_previous_checkpoint(tmp_path, monkeypatch):
    r = Run("oac")
    path = tmp_path / "c.ckpt"
    save_checkpoint(path, **r.parts(), extra={"n": 1})
    before, first = path.read_bytes(), listing(tmp_path)
    old = CheckpointReader(path).folder

    def broken(self, start, n):
        raise OSError("disk full while saving")

    monkeypatch.setattr(ckpt_rows.RowBlock, "read", broken)
    with pytest.raises(OSError, match="disk full while saving"):
        save_checkpoint(path, **r.parts(), extra={"n": 2})
    assert path.read_bytes() == before and listing(tmp_path) == first  # the new folder was removed
    monkeypatch.undo()
    assert load_checkpoint(path, **r.parts()) == {"n": 1}
    (tmp_path / "c.ckpt.tmp").write_bytes(b"left by a writer killed mid-save")
    (tmp_path / f"c.ckpt.{'0' * 32}.dcp").mkdir()  # a killed save's tables folder
    other = save_checkpoint(tmp_path / "c.ckpt.best", **r.parts())  # another checkpoint beside it: kept
    save_checkpoint(path, **r.parts(), extra={"n": 3})  # replaces the stale .tmp, removes every older folder
    reader = CheckpointReader(path)
    assert listing(tmp_path) == sorted(["c.ckpt", reader.folder.name, "c.ckpt.best",
                                        CheckpointReader(other).folder.name]) and reader.folder != old
    CheckpointReader(other).verify()
    assert reader.meta["extra"] == {"n": 3}
    r.close()


KILLED_SAVER = """
import sys, torch, dgl_oac
from dgl_oac.checkpoint import save_checkpoint
emb = dgl_oac.NodeEmbedding(200_000, 16, "emb")
opt = dgl_oac.SparseAdagrad([emb], lr=0.1)
for k in range(1, 10_000):
    emb.store.table.fill_(float(k))  # every value and state column of save k is k
    save_checkpoint(sys.argv[1], emb, opt, extra={"k": k})
    print(k, flush=True)
"""


def test_save_killed_at_any_moment_leaves_a_whole_checkpoint(tmp_path):
    """SIGKILL a process that saves over and over (25 MB a save) at moments spread over its saves; the checkpoint
    left is always whole and loads: every row is the value of the save its main file records."""
    path = tmp_path / "c.ckpt"
    for delay in (0.0, 0.013, 0.031, 0.057, 0.089):
        proc = subprocess.Popen([sys.executable, "-c", KILLED_SAVER, str(path)], stdout=subprocess.PIPE, text=True)
        try:
            assert proc.stdout.readline().strip() == "1" or path.exists()  # one save done (or a previous run's)
            time.sleep(delay)
        finally:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
            proc.stdout.close()
        emb = dgl_oac.NodeEmbedding(200_000, 16, "emb")
        opt = dgl_oac.SparseAdagrad([emb], lr=0.1)
        k = load_checkpoint(path, emb, opt)["k"]
        assert bool((emb.store.table == float(k)).all()), f"killed after {delay}s: rows differ from save {k}"
        emb.close()
    assert len(list(tmp_path.glob("c.ckpt.*.dcp"))) <= 2  # the main file's folder, and a killed save's at most


# --- corruption -------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A checkpoint of a trained Adam table, and the run it came from (its table is the reference)."""
    folder = tmp_path_factory.mktemp("ckpt")
    r = Run("oac", "adam")
    for i, batch in enumerate(r.loader):
        r.step(batch)
        if i == 3:
            break
    path = save_checkpoint(folder / "c.ckpt", **r.parts())
    r.close()
    return path, path.read_bytes()


def copy_checkpoint(path, to):
    """The checkpoint at ``path`` (main file and tables folder) copied into the folder ``to``; its main file."""
    shutil.copytree(CheckpointReader(path).folder, to / CheckpointReader(path).folder.name)
    shutil.copy(path, to / path.name)
    return to / path.name


def flip(file, where, bit=4):
    data = bytearray(file.read_bytes())
    data[int(where * len(data)) if isinstance(where, float) else where] ^= 1 << bit
    file.write_bytes(bytes(data))


@settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cut=st.floats(0.0, 0.9999))
def test_truncated_checkpoint_is_refused(saved, tmp_path, cut):
    _, data = saved
    bad = tmp_path / "cut.ckpt"
    bad.write_bytes(data[: int(cut * len(data))])
    with pytest.raises(CheckpointError, match="is truncated"):
        CheckpointReader(bad)


@settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(where=st.floats(0.0, 0.9999), bit=st.integers(0, 7))
def test_any_flipped_bit_of_the_main_file_is_detected(saved, tmp_path, where, bit):
    """Every byte of the main file is under a check: the magic, the payload's sha256, its length, the end marker."""
    _, data = saved
    bad = tmp_path / "flip.ckpt"
    bad.write_bytes(data)
    flip(bad, where, bit)
    with pytest.raises(CheckpointError, match="corrupted|truncated|not a dgl-oac checkpoint"):
        CheckpointReader(bad)


@settings(max_examples=20, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(which=st.integers(0, 1), where=st.floats(0.0, 0.9999), bit=st.integers(0, 7))
def test_any_flipped_bit_of_a_table_file_is_named(saved, tmp_path_factory, which, where, bit):
    """Every byte of the tables folder is under a sha256 the main file records: a flip names its file."""
    path = copy_checkpoint(saved[0], tmp_path_factory.mktemp("flip"))
    reader = CheckpointReader(path)
    name = sorted(reader.meta["tables"]["files"])[which]  # DCP's .metadata, the rows' __0_0.distcp
    flip(reader.folder / name, where, bit)
    with pytest.raises(CheckpointError, match=re.escape(f"{reader.folder.name}/{name}, written by rank 0, is corrupted")):
        reader.verify()


def test_a_format_1_checkpoint_is_refused_by_name(tmp_path):
    (tmp_path / "old.ckpt").write_bytes(b"DGLOACK1" + bytes(100))
    with pytest.raises(CheckpointError, match="format-1 dgl-oac checkpoint"):
        CheckpointReader(tmp_path / "old.ckpt")


@pytest.mark.parametrize("region", ["magic", "meta", "trailer", "table", "metadata", "missing"])
def test_corrupted_load_raises_and_changes_nothing(saved, tmp_path, region):
    bad = copy_checkpoint(saved[0], tmp_path)
    folder = CheckpointReader(bad).folder
    if region in ("magic", "meta", "trailer"):
        flip(bad, {"magic": 2, "meta": 40, "trailer": len(saved[1]) - 20}[region])
    elif region == "missing":
        (folder / "__0_0.distcp").unlink()
    else:
        flip(folder / {"table": "__0_0.distcp", "metadata": ".metadata"}[region], 0.5)
    r = Run("oac", "adam", init_seed=3)
    before = r.emb.store.table.clone(), [p.clone() for p in r.model.parameters()], r.loader.state_dict()
    rng = torch.get_rng_state()
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(bad, **r.parts())
    msg = str(err.value)
    assert str(bad) in msg
    expect = {"magic": "not a dgl-oac checkpoint", "meta": "the main file's sha256 does not match",
              "trailer": "sha256 does not match|truncated|corrupted",
              "table": f"{folder.name}/__0_0.distcp, written by rank 0, is corrupted",
              "metadata": f"{folder.name}/.metadata, written by rank 0, is corrupted",
              "missing": f"{folder.name}/__0_0.distcp, written by rank 0, is missing"}[region]
    assert re.search(re.escape(expect) if region in ("table", "metadata", "missing") else expect, msg), msg
    assert torch.equal(r.emb.store.table, before[0]) and r.loader.state_dict() == before[2]
    assert all(torch.equal(p, q) for p, q in zip(r.model.parameters(), before[1]))
    assert torch.equal(torch.get_rng_state(), rng)
    r.close()


def test_mismatched_objects_are_refused_by_name(saved, tmp_path):
    path, _ = saved
    cases = [(dict(name="other"), "holds no embedding 'other'"),
             (dict(opt_name="adagrad"), r"saved as \(rows, dim, state columns\) = \(300, 6, 13\).*\(300, 6, 6\)")]
    for kw, msg in cases:
        r = Run("oac", **kw)
        with pytest.raises(CheckpointError, match=msg):
            load_checkpoint(path, **r.parts())
        r.close()
    r = Run("oac")
    parts = r.parts()
    with pytest.raises(CheckpointError, match="holds no dense_modules \\['head'\\]"):
        load_checkpoint(path, **{**parts, "dense_modules": {"head": r.model}})
    with pytest.raises(CheckpointError, match="dense module 'model' does not match"):
        load_checkpoint(path, **{**parts, "dense_modules": {"model": torch.nn.Linear(6, 4)}})
    r.close()
    emb = dgl_oac.NodeEmbedding(GRAPH.num_nodes(), 6, "emb")
    opt = dgl_oac.SparseAdagrad([emb], lr=0.1)
    with pytest.raises(CheckpointError, match="rows, dim, state columns"):
        load_checkpoint(path, [emb], opt)
    bare = save_checkpoint(tmp_path / "bare.ckpt", [emb])
    with pytest.raises(CheckpointError, match="holds no loader position"):
        load_checkpoint(bare, [emb], loader=Run("oac", name="emb2").loader)
    with pytest.raises(FileNotFoundError, match="no checkpoint at"):
        load_checkpoint(tmp_path / "missing.ckpt", [emb])
    (tmp_path / "junk.ckpt").write_bytes(b"PK\x03\x04" + bytes(100))
    with pytest.raises(CheckpointError, match="not a dgl-oac checkpoint"):
        load_checkpoint(tmp_path / "junk.ckpt", [emb])


def test_load_refuses_batches_in_flight(saved):
    path, _ = saved
    before = live_threads()
    r = Run("oac")
    it = iter(r.loader)
    next(it)
    with pytest.raises(RuntimeError, match="while batches are in flight"):
        load_checkpoint(path, embeddings=[r.emb])  # the loader not passed: its prefetched reads are open
    load_checkpoint(path, **r.parts())  # passing the loader closes its epoch first
    assert r.loader.state_dict()["position"] == 4
    r.close()
    assert not [t for t in started_since(before) if "gather" in t]


# --- the CLI ----------------------------------------------------------------------------------------------------
def test_cli_checkpoint_options_are_checked(tmp_path, capsys):
    from dgl_oac.app.cli import main

    for argv, msg in [(["--checkpoint-every", "5"], "need --checkpoint-dir"),
                      (["--resume"], "need --checkpoint-dir"),
                      (["--checkpoint-dir", str(tmp_path), "--checkpoint-every", "0"], "--checkpoint-every must be"),
                      (["--checkpoint-dir", str(tmp_path), "--mode", "dgl"], "checkpoints need a dgl-oac mode")]:
        assert main(["train", "--num-nodes", "500"] + argv) == 2
        assert msg in capsys.readouterr().err


@pytest.mark.slow
def test_kill_resume_script():
    """scripts/kill_resume.py --small: SIGKILL `dgl-oac train` after a mid-epoch checkpoint, resume, compare."""
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "kill_resume.py"), "--small"], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["kills"][0]["killed"] and 13 <= report["resumed_at_step"] < report["steps"]
    assert report["table_and_state_equal"] and report["dense_model_equal"] and report["final_metrics_equal"]


def test_dcp_metadata_reader_takes_paths_pickled_by_python_3_13():
    """Regression (Python 3.13): PosixPath's module there is ``pathlib._local``, which the metadata reader refused,
    so no checkpoint could be read back on 3.13 ('pathlib._local.PosixPath is not part of DCP's metadata'). A
    class outside DCP's metadata is still refused."""
    import io
    import pickle

    from dgl_oac.checkpoint.tables import _MetadataUnpickler

    def load_global(module: str, name: str):
        data = b"\x80\x02c" + f"{module}\n{name}\n".encode() + b"."  # protocol 2: GLOBAL module name, STOP
        return _MetadataUnpickler(io.BytesIO(data)).load()

    assert load_global("pathlib", "PosixPath").__name__ == "PosixPath"
    if sys.version_info >= (3, 13):
        assert load_global("pathlib._local", "PosixPath").__name__ == "PosixPath"
    else:  # allowed, and only the import fails where the module does not exist
        with pytest.raises(ModuleNotFoundError):
            load_global("pathlib._local", "PosixPath")
    with pytest.raises(pickle.UnpicklingError, match="os.system is not part of DCP's metadata"):
        load_global("os", "system")
