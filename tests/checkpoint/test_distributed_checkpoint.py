"""dgl_oac.checkpoint with several trainers (2 gloo ranks): saving is a collective in which each rank writes its own
rows (value and optimizer state) through torch.distributed.checkpoint and rank 0 then writes the main file (dense
state, every rank's RNG state, every table file's sha256) naming the tables folder; a table file that fails its
check on one rank names the file and its writer, and makes every rank raise (none waits for the others); a save
killed before the main file leaves the previous checkpoint whole. The tables' collectives run on the tables' gloo
group: a default group that refuses CPU tensors (``cuda:gloo``, as NCCL) does not matter. Resuming ``dgl-oac
train`` bitwise: tests/app/test_train_torchrun.py; another number of trainers:
tests/checkpoint/test_checkpoint_reshard.py."""
from __future__ import annotations

import shutil
from pathlib import Path

import torch

import dgl_oac
from dgl_oac.checkpoint import CheckpointError, CheckpointReader, load_checkpoint, save_checkpoint
from dgl_oac.checkpoint.file import tables_folder
from dgl_oac.checkpoint.tables import save_tables

from dist_helpers import RankPool, two_rank_pool  # noqa: F401 - the fixture "pool": the module's 2 ranks

KILLED = "b" * 32  # the id of a save killed before its main file


def _program(rank: int, world: int, folder: str):
    path = Path(folder) / "ckpt"
    emb = dgl_oac.NodeEmbedding(40, 4, "emb", init_func=lambda t: t.normal_(generator=torch.Generator().manual_seed(0)))
    opt = dgl_oac.SparseAdagrad([emb], lr=0.1)
    torch.manual_seed(100 + rank)  # each rank's RNG differs: each must get its own back

    def train(steps: int) -> None:
        for step in range(steps):  # every rank updates rows of both owners
            ids = torch.arange(rank + step, 40, 3)
            emb(ids).pow(2).sum().backward()
            opt.step()

    train(3)
    save_checkpoint(path, emb, opt)
    saved = (emb.weight.clone(), emb.optm_state.clone(), torch.rand(3))
    emb.group.barrier("every rank has read the table")  # before rank 0 overwrites it
    # a later save killed after the ranks wrote their rows, before rank 0's main file: the next load is the first
    train(1)
    save_tables(tables_folder(path, KILLED), [emb], emb.group)
    emb.group.barrier("the killed save's rows are written")
    torch.manual_seed(7)
    emb.all_set_embedding(torch.zeros(40, 4))
    load_checkpoint(path, emb, opt)
    loaded = (emb.weight.clone(), emb.optm_state.clone(), torch.rand(3))
    emb.group.barrier("loaded")
    save_checkpoint(path, emb, opt)  # a complete save removes every earlier folder, the killed one's too
    emb.group.barrier("saved again")
    if rank == 0:  # keep the checkpoint as written, then corrupt one byte of rank 1's rows
        reader = CheckpointReader(path)
        shutil.copytree(reader.folder, Path(folder) / "written" / reader.folder.name)
        shutil.copy(path, Path(folder) / "written" / "ckpt")
        [mine] = [f for f, r in reader.meta["tables"]["files"].items() if r["rank"] == 1]
        with open(reader.folder / mine, "r+b") as f:
            f.seek(100)
            byte = f.read(1)
            f.seek(100)
            f.write(bytes([byte[0] ^ 0xFF]))
    emb.group.barrier("corrupted")
    try:
        load_checkpoint(path, emb, opt)
        error = ""
    except CheckpointError as exc:
        error = str(exc)
    return saved, loaded, error


def test_each_rank_writes_its_rows_and_every_rank_resumes(pool: RankPool, tmp_path: Path) -> None:
    (saved0, loaded0, err0), (saved1, loaded1, err1) = pool.run(_program, str(tmp_path))
    reader = CheckpointReader(tmp_path / "written" / "ckpt")
    files = reader.meta["tables"]["files"]
    assert reader.meta["world_size"] == 2 and len(reader.meta["rank_rng"]) == 2
    assert sorted(files) == [".metadata", "__0_0.distcp", "__1_0.distcp"]  # one chunk of 20 rows each
    assert [files[f]["rank"] for f in sorted(files)] == [0, 0, 1]
    reader.verify()
    table = reader.table("emb")  # reassembled from both ranks' files
    # the whole shared table (both owners' rows), values and Adagrad state; every row was updated (state > 0)
    assert torch.equal(table, torch.cat([saved0[0], saved0[1]], 1)) and torch.equal(saved0[0], saved1[0])
    assert bool((saved0[1] > 0).all())
    for saved, loaded in ((saved0, loaded0), (saved1, loaded1)):  # the killed save changed nothing
        assert torch.equal(loaded[0], saved[0]) and torch.equal(loaded[1], saved[1])
        assert torch.equal(loaded[2], saved[2])  # each rank's own RNG state came back
    assert not torch.equal(saved0[2], saved1[2])
    assert not list(tmp_path.glob(f"ckpt.{KILLED}.dcp"))  # the next complete save removed the killed one's folder
    # rank 1 loads rows 20..39 (its half of the machine's table), which rank 1 wrote: it checked them
    assert f"{reader.folder.name}/__1_0.distcp, written by rank 1, is corrupted" in err1
    assert "failed on rank(s) [1]" in err0  # rank 0 did not wait for it


def _cuda_gloo_default(rank: int, world: int, folder: str):
    """The default group is ``cuda:gloo`` (refuses CPU tensors); the tables' own gloo group carries DCP."""
    emb = dgl_oac.NodeEmbedding(30, 3, "emb", init_func=lambda t: t.fill_(rank + 1.0))
    opt = dgl_oac.SparseSGD([emb], lr=0.1)
    save_checkpoint(Path(folder) / "ckpt", emb, opt)
    emb.all_set_embedding(torch.zeros(30, 3))
    load_checkpoint(Path(folder) / "ckpt", emb, opt)
    return emb.weight.clone()


def test_a_default_group_without_cpu_tensors_is_not_used(tmp_path: Path) -> None:
    from dist_helpers import run_ranks

    got = run_ranks(_cuda_gloo_default, 2, str(tmp_path), backend="cuda:gloo")
    assert torch.equal(got[0], torch.ones(30, 3)) and torch.equal(got[1], got[0])  # rank 0's initial values
