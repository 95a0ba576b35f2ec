"""Sharded tables (``NodeEmbedding(..., sharding="rows")``, issue 24): each rank holds only its range of rows and
reads the others' from their owners' row servers.

2 gloo ranks, on one machine and as 2 machines (torchrun's ``GROUP_RANK``): for SGD, Adagrad and Adam, node and
link batches, and a heterograph with two tables, sharded oac == sharded sync == replicated sync, bitwise (tables,
optimizer state, every rank's losses), with rows patched; each rank holds its share only; reads on one rank
alone (evaluation) work; what a sharded table refuses is named."""
from __future__ import annotations

import json
import os
import time

import dgl
import pytest
import torch

import dgl_oac
from dgl_oac.dgl_frontend.sampling.edge import EdgeBatchSampler

from conftest import power_law_graph
from dist_helpers import RankPool, two_rank_pool  # noqa: F401 - the fixture "pool": the module's 2 ranks
from helpers import loss_of

NODES, DIM = 100, 4


def _values(n: int, d: int, seed: int) -> torch.Tensor:
    return torch.rand(n, d, generator=torch.Generator().manual_seed(seed)) - 0.5


def _full(emb: dgl_oac.NodeEmbedding) -> torch.Tensor:
    """The whole table, value ‖ state (collective when sharded)."""
    return emb.store.all_rows() if emb.sharded else emb.store.table.clone()


def _train(rank: int, world: int, task: str, opt_name: str, mode: str, sharding: str, machines: int):
    os.environ["GROUP_RANK"] = str(rank % machines)
    g = power_law_graph(NODES, seed=1)
    emb = dgl_oac.NodeEmbedding(NODES, DIM, "table", sharding=sharding)
    emb.all_set_embedding(_values(NODES, DIM, 5))
    opt = getattr(dgl_oac.optim, opt_name)([emb], lr=0.05)
    if mode == "oac" and sharding == "rows":  # reads slower than the model: the gather thread is always reading,
        inner = emb.store.gather              # so some reads open while a step runs (as with a slow network)

        def slow_gather(ids, out=None, at=None):
            time.sleep(0.02)
            return inner(ids, out, at)
        emb.store.gather = slow_gather
    if task == "node":
        sampler, indices = dgl.dataloading.NeighborSampler([4, 4]), torch.arange(NODES)
    else:
        sampler, indices = EdgeBatchSampler(num_negatives=3), torch.arange(g.num_edges())
    loader = dgl_oac.DataLoader(g, indices, sampler, embeddings=[emb], batch_size=8 if task == "node" else 40,
                                shuffle=True, seed=2, use_ddp=True, mode=mode, prefetch=4,
                                background_priority="normal")
    losses = []
    for _ in range(2):
        for batch in loader:
            time.sleep(0.01)  # let the gather thread read the next batches now, before this step writes
            x = batch[-1][0].srcdata["table"] if task == "node" else batch[1].ndata["table"]
            loss = loss_of(x)
            loss.backward()
            opt.step()
            losses.append(loss.item())
    shard_rows = emb.store.table.shape[0]
    sent = dict(emb.group.sent, opened_during_steps=emb.pipeline.dist.registry.opened_during_steps)
    full = _full(emb)
    emb.close()
    return full, losses, loader.stats.rows_patched, shard_rows, sent


CASES = [("node", "SparseSGD"), ("node", "SparseAdagrad"), ("node", "SparseAdam"), ("edge", "SparseAdam")]


@pytest.mark.parametrize("task,opt_name", CASES)
def test_sharded_equals_replicated_and_oac_equals_sync(pool: RankPool, task: str, opt_name: str) -> None:
    base = pool.run(_train, task, opt_name, "sync", "replicated", 1)
    for mode, machines in (("sync", 2), ("oac", 2), ("oac", 1)):
        got = pool.run(_train, task, opt_name, mode, "rows", machines)
        for rank, (b, s) in enumerate(zip(base, got)):
            assert torch.equal(b[0], s[0]), f"rank {rank}: {mode} on {machines} machine(s)"
            assert b[1] == s[1], f"rank {rank}'s losses: {mode} on {machines} machine(s)"
            assert s[3] == NODES // 2 and b[3] == NODES  # each rank holds its half; replicated: all of it
            # nothing mirrored (no replicas); the other owner's rows were read from its row server
            assert s[4].get("mirror", 0) == 0 and s[4]["fetch"] > 0 and b[4].get("fetch", 0) == 0
        if mode == "oac":
            assert all(s[2] > 0 for s in got), "no row was patched: the test would not show exactness"
            # the gather thread read ahead while steps ran (a replicated table holds reads back instead)
            assert sum(s[4]["opened_during_steps"] for s in got) > 0
    assert all(b[4]["opened_during_steps"] == 0 for b in base)


def _hetero(rank: int, world: int, mode: str, sharding: str):
    os.environ["GROUP_RANK"] = str(rank)
    gen = torch.Generator().manual_seed(0)
    u, i = torch.randint(0, 60, (600,), generator=gen), (torch.rand(600, generator=gen) ** 3 * 40).long()
    g = dgl.heterograph({("user", "clicks", "item"): (u, i), ("item", "clicked_by", "user"): (i, u)},
                        num_nodes_dict={"user": 60, "item": 40})
    embs = {nt: dgl_oac.NodeEmbedding(g.num_nodes(nt), DIM, f"emb_{nt}", sharding=sharding) for nt in g.ntypes}
    for k, (nt, e) in enumerate(sorted(embs.items())):
        e.all_set_embedding(_values(g.num_nodes(nt), DIM, k))
    opt = dgl_oac.optim.SparseAdagrad(list(embs.values()), lr=0.1)
    sampler = dgl.dataloading.as_edge_prediction_sampler(
        dgl.dataloading.NeighborSampler([3]), negative_sampler=dgl.dataloading.negative_sampler.Uniform(2))
    loader = dgl_oac.DataLoader(g, {"clicks": torch.arange(600)}, sampler, embeddings=embs, batch_size=30,
                                shuffle=True, seed=3, use_ddp=True, mode=mode, prefetch=3,
                                background_priority="normal")
    losses = []
    for _, pos, neg, blocks in loader:
        h = {nt: blocks[0].srcdata[e.name][nt][: pos.num_nodes(nt)] for nt, e in embs.items()}

        def score(pair: dgl.DGLGraph) -> torch.Tensor:
            s, d = pair.edges(etype="clicks")
            return (h["user"].index_select(0, s) * h["item"].index_select(0, d)).sum(1)

        loss = torch.nn.functional.softplus(-score(pos)).mean() + torch.nn.functional.softplus(score(neg)).mean()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    out = {nt: _full(e) for nt, e in embs.items()}
    for e in embs.values():
        e.close()
    return out, losses


def test_a_heterograph_with_two_sharded_tables(pool: RankPool) -> None:
    base = pool.run(_hetero, "sync", "replicated")
    for mode in ("sync", "oac"):
        got = pool.run(_hetero, mode, "rows")
        for b, s in zip(base, got):
            assert b[0].keys() == s[0].keys() and all(torch.equal(b[0][k], s[0][k]) for k in b[0]), mode
            assert b[1] == s[1], mode


def _reads(rank: int, world: int):
    emb = dgl_oac.NodeEmbedding(10, 3, "t", sharding="rows", init_func=lambda t: t.fill_(float(rank + 1)))
    lo, mine = emb.local_rows()
    errors = []
    for what in ("weight", "optm_state"):
        try:
            getattr(emb, what)
        except RuntimeError as exc:
            errors.append(str(exc))
    with torch.no_grad():  # only rank 0 reads (an evaluation on one rank): no collective, no hang
        seen = emb(torch.tensor([9, 0, 5, 4])) if rank == 0 else None
    emb.group.barrier("rank 0 has read")
    whole = emb.all_get_embedding()
    emb.close()
    return lo, mine.clone(), errors, seen, whole


def test_reads_on_one_rank_and_what_a_sharded_table_refuses(pool: RankPool) -> None:
    (lo0, mine0, err0, seen, whole0), (lo1, mine1, _, _, whole1) = pool.run(_reads)
    # each owner ran init_func on its own rows (as DGL's DistEmbedding does on each server's part)
    assert (lo0, lo1) == (0, 5) and bool((mine0 == 1).all()) and bool((mine1 == 2).all())
    assert torch.equal(seen, torch.tensor([[2.0] * 3, [1.0] * 3, [2.0] * 3, [1.0] * 3]))
    assert torch.equal(whole0, whole1) and torch.equal(whole0, torch.cat([mine0, mine1]))
    assert len(err0) == 2 and all("is sharded (sharding='rows')" in e and "all_get_embedding" in e for e in err0)


def test_an_unknown_sharding_is_named() -> None:
    with pytest.raises(ValueError, match="sharding must be 'replicated' or 'rows', got 'cols'"):
        dgl_oac.NodeEmbedding(4, 2, "t", sharding="cols")


def _owner_dies(rank: int, world: int):
    emb = dgl_oac.NodeEmbedding(10, 3, "t", sharding="rows")
    emb.group.barrier("both serve")
    if rank == 1:
        os._exit(3)  # this owner dies; its row server with it
    time.sleep(0.5)
    t0 = time.monotonic()
    try:
        with torch.no_grad():
            emb(torch.tensor([7]))
    except Exception as exc:  # noqa: BLE001 - what the reader saw, and when
        return type(exc).__name__, str(exc), time.monotonic() - t0
    return "", "", time.monotonic() - t0


def test_a_dead_owner_is_named_by_its_readers_at_once(pool: RankPool) -> None:
    (ok, got), (ok1, _) = pool.run(_owner_dies, outcomes=True, collective_timeout=120)
    assert ok and not ok1
    kind, message, seconds = got
    assert kind == "PeerFailure" and "rank 1" in message and seconds < 10, got


@pytest.mark.slow
@pytest.mark.hang_timeout(300)
def test_dgl_oac_train_with_sharded_tables_under_torchrun(tmp_path) -> None:
    """``dgl-oac train --sharding rows`` under torchrun: every evaluation, and the table with its optimizer state
    (each rank's rows, from the checkpoint), equal the replicated sync run's."""
    from dgl_oac.checkpoint import CheckpointReader
    from dist_helpers import torchrun
    from dist_helpers import SMALL, metrics_of

    def run(name: str, mode: str, sharding: str) -> dict:
        out = tmp_path / f"{name}.json"
        torchrun("-m", "dgl_oac", "train", "--task", "node", "--mode", mode, "--epochs", "2", "--seed", "3",
                 "--threads", "1", "--no-progress", "--prefetch", "2", "--background-priority", "normal",
                 "--sharding", sharding, "--out", str(out), "--checkpoint-dir", str(tmp_path / name),
                 *SMALL["node"], timeout=120)
        return {**json.loads(out.read_text()),
                "table": CheckpointReader(tmp_path / name / "checkpoint.ckpt").table("emb")}

    base, sharded = run("base", "sync", "replicated"), run("sharded", "oac", "rows")
    assert sharded["config"]["sharding"] == "rows" and sharded["trainers"] == 2
    assert metrics_of(sharded["curve"]) == metrics_of(base["curve"]) and len(base["curve"]) == 2
    assert torch.equal(sharded["table"], base["table"])
    assert sharded["loader_stats"]["rows_patched"] > 0


@pytest.mark.slow
def test_naive_async_with_several_trainers_registers_and_forwards_nothing(pool: RankPool) -> None:
    """mode="async" with several trainers (the staleness baseline of the scale-out benchmark): batches read ahead
    are used stale, never patched, so their reads are not registered and owners forward nothing; the update is
    the N-trainer step on the owners' rows. It trains (finite tables, every step taken)."""
    sync = pool.run(_train, "node", "SparseAdam", "sync", "rows", 2)
    got = pool.run(_train, "node", "SparseAdam", "async", "rows", 2)
    for s, a in zip(sync, got):
        assert bool(a[0].isfinite().all()) and len(a[1]) == len(s[1]) and a[2] == 0
        assert a[4].get("registration", 0) == a[4].get("forwarding", 0) == 0 and a[4]["gradients"] > 0
    assert not torch.equal(sync[0][0], got[0][0])  # stale reads: not sync's result


def _waiting_read(rank: int, world: int):
    import threading
    emb = dgl_oac.NodeEmbedding(10, 3, "t", sharding="rows", init_func=lambda t: t.fill_(float(rank + 1)))
    out = {}
    if rank == 0:
        def read_ahead() -> None:
            try:
                out["ahead"] = emb.store.gather(torch.tensor([7]), at=2)
            except Exception as exc:  # noqa: BLE001 - reported below
                out["ahead"] = exc
        ahead = threading.Thread(target=read_ahead)
        ahead.start()  # a read at step 2, which rank 1 has not applied: it waits at rank 1's server
        time.sleep(0.3)
        t0 = time.monotonic()
        now = emb.store.gather(torch.tensor([8]), at=-1)  # answered meanwhile, not queued behind it
        out["now_s"] = time.monotonic() - t0
        out["waiting"] = ahead.is_alive()
    emb.group.barrier("rank 0 read while its other read waited")
    for step in range(3):  # as if both applied steps 0..2 (nothing written: the rows are unchanged)
        emb.pipeline.clock.publish(step)
    if rank == 0:
        ahead.join(timeout=10)
        out["ahead_done"] = not ahead.is_alive()
        assert isinstance(out["ahead"], torch.Tensor), out["ahead"]
        out["rows"] = (now[0, :3].tolist(), out["ahead"][0, :3].tolist())
    emb.group.barrier("done")
    emb.close()
    return out


def test_a_read_waiting_for_a_step_does_not_hold_up_other_reads(pool: RankPool) -> None:
    """Regression: a row server answered one request at a time and waited in it for the step it asked for, so
    a read at an applied version queued behind it; when that read was the one the step needed, nothing moved."""
    out, _ = pool.run(_waiting_read)
    assert out["waiting"] and out["now_s"] < 1.0 and out["ahead_done"], out
    assert out["rows"] == ([2.0] * 3, [2.0] * 3)
