"""A checkpoint written by N trainers resumes with M (torch.distributed.checkpoint reshards the tables): N=2 -> M=1
and N=1 -> M=2, each bitwise equal to the run of M trainers that starts from the same tables (values and Adam
state), dense model and optimizer, and epoch; the table files are cut into chunks whose bounds are not the M
trainers' ranges. What cannot carry over to another number of trainers is refused by name: each rank's RNG
state (``restore_rng`` must be False) and a mid-epoch loader position."""
from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Dict

import dgl
import pytest
import torch
import torch.distributed as dist

import dgl_oac
from dgl_oac.checkpoint import rows as ckpt_rows
from dgl_oac.checkpoint import CheckpointError, CheckpointReader, load_checkpoint, save_checkpoint

from conftest import power_law_graph, seeded_init
from dist_helpers import RankPool, two_rank_pool  # noqa: F401 - the fixture "pool": the module's 2 ranks
from helpers import loss_of

pytestmark = pytest.mark.hang_timeout(180)
NODES, DIM, CHUNK = 100, 4, 1000  # 1000-byte chunks: 19 rows of 4 + 9 floats (Adam), across the ranges


class Trainer:
    """One trainer of ``world``: a table with Adam rows, a dense Linear with Adam (gradients averaged over the
    trainers, as DDP), an oac loader over its share of the nodes (``use_ddp`` with several trainers)."""

    def __init__(self, world: int, init_seed: int = 0, sharding: str = "replicated") -> None:
        self.world = world
        self.emb = dgl_oac.NodeEmbedding(NODES, DIM, "table", seeded_init(init_seed), sharding=sharding)
        self.sparse = dgl_oac.SparseAdam([self.emb], lr=0.05)
        torch.manual_seed(init_seed)
        self.model = torch.nn.Sequential(torch.nn.Dropout(0.2), torch.nn.Linear(DIM, 3))
        self.dense = torch.optim.Adam(self.model.parameters(), lr=0.01)
        self.loader = dgl_oac.DataLoader(power_law_graph(NODES, seed=1), torch.arange(NODES),
                                         dgl.dataloading.NeighborSampler([3, 3]), embeddings=[self.emb],
                                         mode="oac", prefetch=2, batch_size=8, shuffle=True, seed=2,
                                         use_ddp=world > 1, background_priority="normal")

    def parts(self) -> Dict[str, Any]:
        return dict(embeddings=[self.emb], sparse_opt=self.sparse, dense_modules={"model": self.model},
                    dense_optimizers={"dense": self.dense}, loader=self.loader)

    def epoch(self) -> list:
        """One epoch; every trainer's RNG is seeded from its rank first (dropout draws from it)."""
        torch.manual_seed(50 + (dist.get_rank() if self.world > 1 else 0))
        losses = []
        for batch in self.loader:
            x = batch[-1][0].srcdata["table"]
            loss = loss_of(x) + self.model(x).square().mean()
            self.dense.zero_grad()
            loss.backward()
            for p in self.model.parameters():
                if self.world > 1:
                    dist.all_reduce(p.grad)
                    p.grad /= self.world
            self.dense.step()
            self.sparse.step()
            losses.append(loss.item())
        return losses

    def state(self) -> Dict[str, Any]:
        self.emb.flush()
        table = self.emb.store.all_rows() if self.emb.sharded else self.emb.store.table.clone()  # (collective)
        return {"table": table, "model": {k: v.clone() for k, v in self.model.state_dict().items()},
                "dense": self.dense.state_dict()}

    def close(self) -> None:
        self.loader.close()
        self.emb.close()


def write(world: int, path: str, sharding: str = "replicated") -> Dict[str, Any]:
    """N trainers: epoch 0, a checkpoint at its end, and one mid-epoch 1 (3 batches in); the state at the first."""
    saved, chunk = ckpt_rows.CHUNK_BYTES, CHUNK
    ckpt_rows.CHUNK_BYTES = chunk
    try:
        t = Trainer(world, sharding=sharding)
        t.epoch()
        save_checkpoint(path, **t.parts())
        state = t.state()
        for i, batch in enumerate(t.loader):  # a few steps into epoch 1: a mid-epoch checkpoint
            loss_of(batch[-1][0].srcdata["table"]).backward()
            t.sparse.step()
            if i == 2:
                break
        save_checkpoint(path + ".mid", **t.parts())
        t.close()
        return state
    finally:
        ckpt_rows.CHUNK_BYTES = saved


def resume(world: int, path: str, state: Dict[str, Any], sharding: str = "replicated") -> Dict[str, Any]:
    """M trainers, twice: resumed from the checkpoint, and from ``state`` set by hand; epoch 1 of each."""
    out: Dict[str, Any] = {}
    t = Trainer(world, init_seed=99, sharding=sharding)  # other initial values: every row from the checkpoint
    if CheckpointReader(path).meta["world_size"] != world:  # resharding: what cannot carry over is refused
        with pytest.raises(CheckpointError, match="this run has .*RNG state cannot be carried"):
            load_checkpoint(path, **t.parts())
        with pytest.raises(CheckpointError, match="saved mid-epoch .*loader cannot resume there"):
            load_checkpoint(path + ".mid", **t.parts(), restore_rng=False)
    load_checkpoint(path, **t.parts(), restore_rng=False)
    out["loaded"] = t.state()
    out["loader"] = t.loader.state_dict()
    out["resumed_losses"] = t.epoch()
    out["resumed"] = t.state()
    t.close()

    ref = Trainer(world, init_seed=7, sharding=sharding)  # the M-trainer run from the same tables, state, epoch
    if ref.emb.sharded:  # each rank its own rows
        lo, rows = ref.emb._owned_rows()
        rows.copy_(state["table"][lo:lo + rows.shape[0]])
    elif world == 1 or dist.get_rank() == 0:
        ref.emb.store.table.copy_(state["table"])  # the shared table: rank 0 writes it, before any read
    if world > 1:
        dist.barrier()
    ref.model.load_state_dict(state["model"])
    # a copy: tensors sent to the ranks by torch.multiprocessing share memory, and Adam steps its state in place
    ref.dense.load_state_dict(copy.deepcopy(state["dense"]))
    ref.loader.load_state_dict({"seed": 2, "epoch": 1, "position": 0})
    out["reference_losses"] = ref.epoch()
    out["reference"] = ref.state()
    ref.close()
    return out


def _write_ranks(rank: int, world: int, path: str, sharding: str = "replicated") -> Dict[str, Any]:
    return write(world, path, sharding)


def _resume_ranks(rank: int, world: int, path: str, state: Dict[str, Any],
                  sharding: str = "replicated") -> Dict[str, Any]:
    return resume(world, path, state, sharding)


def assert_resumed_equals_reference(got: Dict[str, Any], state: Dict[str, Any]) -> None:
    assert torch.equal(got["loaded"]["table"], state["table"])  # every row, value and Adam state, in place
    assert got["loaded"]["model"].keys() == state["model"].keys()
    assert all(torch.equal(got["loaded"]["model"][k], v) for k, v in state["model"].items())
    assert got["loader"] == {"seed": 2, "epoch": 1, "position": 0}
    assert got["resumed_losses"] == got["reference_losses"] and got["resumed_losses"]
    assert torch.equal(got["resumed"]["table"], got["reference"]["table"])
    assert not torch.equal(got["resumed"]["table"], state["table"])  # epoch 1 trained
    assert all(torch.equal(got["resumed"]["model"][k], v) for k, v in got["reference"]["model"].items())


def test_two_trainers_resume_as_one(pool: RankPool, tmp_path: Path) -> None:
    path = str(tmp_path / "two.ckpt")
    state0, state1 = pool.run(_write_ranks, path, timeout=120)
    assert torch.equal(state0["table"], state1["table"])  # one shared table
    reader = CheckpointReader(path)
    assert reader.meta["world_size"] == 2
    assert {f["rank"] for f in reader.meta["tables"]["files"].values()} == {0, 1}  # each rank wrote its rows
    assert torch.equal(reader.table("table"), state0["table"])
    assert_resumed_equals_reference(resume(1, path, state0), state0)


def test_one_trainer_resumes_as_two(pool: RankPool, tmp_path: Path) -> None:
    path = str(tmp_path / "one.ckpt")
    state = write(1, path)
    assert CheckpointReader(path).meta["world_size"] == 1
    got = pool.run(_resume_ranks, path, state, timeout=120)
    for rank_got in got:
        assert_resumed_equals_reference(rank_got, state)
    assert got[0]["resumed_losses"] != got[1]["resumed_losses"]  # each trainer its own share of the batches


def test_sharded_tables_reshard(pool: RankPool, tmp_path: Path) -> None:
    """Issue 24: 2 trainers with sharded tables (each saves the rows it holds) resume as 1 trainer and as 2
    sharded trainers, each equal to the run from the same tables (the sharded resume: a resume with the same N,
    bitwise the uninterrupted run's continuation)."""
    path = str(tmp_path / "sharded.ckpt")
    state0, state1 = pool.run(_write_ranks, path, "rows", timeout=120)
    assert torch.equal(state0["table"], state1["table"])
    assert torch.equal(CheckpointReader(path).table("table"), state0["table"])
    assert_resumed_equals_reference(resume(1, path, state0), state0)
    for got in pool.run(_resume_ranks, path, state0, "rows", timeout=120):
        assert_resumed_equals_reference(got, state0)
