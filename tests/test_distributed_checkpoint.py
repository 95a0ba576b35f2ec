"""dgl_oac.checkpoint with several trainers (2 gloo ranks): saving is a collective in which rank 0 writes the whole
shared table (every owner's rows and optimizer state) and every rank's RNG state; a file that fails its checks
on rank 0 makes every rank raise (none waits for the others). Resuming ``dgl-oac train`` bitwise, and a file
written by 2 trainers refused by 1: tests/test_train_torchrun.py."""
from __future__ import annotations

import shutil
from pathlib import Path

import torch

import dgl_oac
from dgl_oac.checkpoint import CheckpointError, CheckpointReader, load_checkpoint, save_checkpoint

from dist_helpers import RankPool, two_rank_pool  # noqa: F401 - the fixture "pool": the module's 2 ranks


def _program(rank: int, world: int, folder: str):
    path = Path(folder) / "ckpt"
    emb = dgl_oac.NodeEmbedding(40, 4, "emb", init_func=lambda t: t.normal_(generator=torch.Generator().manual_seed(0)))
    opt = dgl_oac.SparseAdagrad([emb], lr=0.1)
    torch.manual_seed(100 + rank)  # each rank's RNG differs: each must get its own back
    for step in range(3):  # every rank updates rows of both owners
        ids = torch.arange(rank + step, 40, 3)
        emb(ids).pow(2).sum().backward()
        opt.step()
    save_checkpoint(path, emb, opt)
    saved = (emb.weight.clone(), emb.optm_state.clone(), torch.rand(3))
    emb.group.barrier("every rank has read the table")  # before rank 0 overwrites it
    torch.manual_seed(7)
    emb.all_set_embedding(torch.zeros(40, 4))
    load_checkpoint(path, emb, opt)
    loaded = (emb.weight.clone(), emb.optm_state.clone(), torch.rand(3))
    emb.group.barrier("loaded")
    if rank == 0:  # keep the file as written, then corrupt one byte of its table section
        shutil.copy(path, Path(folder) / "written")
        reader = CheckpointReader(path)
        offset = reader.sections["table/emb"]["offset"] + 5
        reader.close()
        with open(path, "r+b") as f:
            f.seek(offset)
            byte = f.read(1)
            f.seek(offset)
            f.write(bytes([byte[0] ^ 0xFF]))
    emb.group.barrier("corrupted")
    try:
        load_checkpoint(path, emb, opt)
        error = ""
    except CheckpointError as exc:
        error = str(exc)
    return saved, loaded, error


def test_rank0_writes_every_owners_rows_and_every_rank_resumes(pool: RankPool, tmp_path: Path) -> None:
    (saved0, loaded0, err0), (saved1, loaded1, err1) = pool.run(_program, str(tmp_path))
    reader = CheckpointReader(tmp_path / "written")
    assert reader.meta["world_size"] == 2 and len(reader.meta["rank_rng"]) == 2
    table = reader.table("emb")
    reader.close()
    # the file is the shared table whole (both owners' rows), values and Adagrad state
    assert torch.equal(table, torch.cat([saved0[0], saved0[1]], 1)) and torch.equal(saved0[0], saved1[0])
    assert bool((saved0[1] > 0).all())  # every row was updated (state > 0): both owners' rows are in the file
    for saved, loaded in ((saved0, loaded0), (saved1, loaded1)):
        assert torch.equal(loaded[0], saved[0]) and torch.equal(loaded[1], saved[1])
        assert torch.equal(loaded[2], saved[2])  # each rank's own RNG state came back
    assert not torch.equal(saved0[2], saved1[2])
    assert "section 'table/emb' has sha256" in err0  # rank 0 checked the file
    assert "failed on rank(s) [0]" in err1  # rank 1 did not wait for it

