"""dgl_oac.checkpoint with several trainers (2 gloo ranks): saving is a collective in which each owner writes its
rows (value and optimizer state) to a shard of its own and rank 0 then writes the main file (dense state, every
rank's RNG state) naming them; a shard that fails its checks on one rank makes every rank raise (none waits for
the others); a save killed before the main file leaves the previous checkpoint whole. Resuming ``dgl-oac train``
bitwise, and a file written by 2 trainers refused by 1: tests/test_train_torchrun.py."""
from __future__ import annotations

import shutil
from pathlib import Path

import torch

import dgl_oac
from dgl_oac.checkpoint import CheckpointError, CheckpointReader, load_checkpoint, save_checkpoint
from dgl_oac.ckptfile import shard_path
from dgl_oac.distributed import shards

from dist_helpers import RankPool, two_rank_pool  # noqa: F401 - the fixture "pool": the module's 2 ranks


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
    # a later save killed after the owners wrote their rows, before rank 0's main file: the next load is the first
    train(1)
    shards.save_shard(path, "killed", [emb], emb.group)
    emb.group.barrier("the killed save's shards are written")
    torch.manual_seed(7)
    emb.all_set_embedding(torch.zeros(40, 4))
    load_checkpoint(path, emb, opt)
    loaded = (emb.weight.clone(), emb.optm_state.clone(), torch.rand(3))
    emb.group.barrier("loaded")
    save_checkpoint(path, emb, opt)  # a complete save removes every earlier shard, the killed one's too
    emb.group.barrier("saved again")
    if rank == 0:  # keep the files as written, then corrupt one byte of rank 1's rows
        for f in Path(folder).glob("ckpt*"):
            shutil.copy(f, Path(folder) / f"written-{f.name}")
        sid = CheckpointReader(path).meta["shards"]["id"]
        reader = CheckpointReader(shard_path(path, sid, 1, 2))
        offset = reader.sections["table/emb"]["offset"] + 5
        reader.close()
        with open(shard_path(path, sid, 1, 2), "r+b") as f:
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


def test_each_owner_writes_its_rows_and_every_rank_resumes(pool: RankPool, tmp_path: Path) -> None:
    (saved0, loaded0, err0), (saved1, loaded1, err1) = pool.run(_program, str(tmp_path))
    written = sorted(f.name for f in tmp_path.glob("written-*"))
    reader = CheckpointReader(tmp_path / "written-ckpt")
    sid = reader.meta["shards"]["id"]
    assert written == sorted(["written-ckpt", f"written-ckpt.{sid}.owner0of2", f"written-ckpt.{sid}.owner1of2"])
    assert reader.meta["world_size"] == 2 and len(reader.meta["rank_rng"]) == 2
    assert "table/emb" not in reader.sections  # the main file holds the small state only
    for owner in (0, 1):  # each shard holds its owner's rows (its range: 20 rows each) and nothing else
        with CheckpointReader(tmp_path / f"written-ckpt.{sid}.owner{owner}of2") as part:
            assert part.meta["owner"] == owner and part.meta["embeddings"][0]["num_rows"] == 20
            assert torch.equal(part.table("emb"), torch.cat([saved0[0], saved0[1]], 1)[20 * owner:20 * owner + 20])
    table = reader.table("emb")  # reassembled from the shards beside the main file
    reader.close()
    # the whole shared table (both owners' rows), values and Adagrad state; every row was updated (state > 0)
    assert torch.equal(table, torch.cat([saved0[0], saved0[1]], 1)) and torch.equal(saved0[0], saved1[0])
    assert bool((saved0[1] > 0).all())
    for saved, loaded in ((saved0, loaded0), (saved1, loaded1)):  # the killed save changed nothing
        assert torch.equal(loaded[0], saved[0]) and torch.equal(loaded[1], saved[1])
        assert torch.equal(loaded[2], saved[2])  # each rank's own RNG state came back
    assert not torch.equal(saved0[2], saved1[2])
    assert not list(tmp_path.glob("ckpt.killed.*"))  # the next complete save removed the killed one's shards
    assert "section 'table/emb' has sha256" in err1  # rank 1 checked its rows
    assert "failed on rank(s) [1]" in err0  # rank 0 did not wait for it
