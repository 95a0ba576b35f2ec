"""DGL's distributed graph with dgl-oac's embeddings, and a DistGraph cluster on this machine.

A ``dgl.distributed.DistGraph`` is a graph ``dgl_oac.DataLoader`` takes like a DGLGraph:

    g = dgl.distributed.DistGraph(graph_name)                     # after dgl.distributed.initialize(ip_config)
    emb = dgl_oac.NodeEmbedding(g.num_nodes(), 64, "emb")        # after init_process_group: shared by the trainers
    loader = dgl_oac.DataLoader(g, train_ids, dgl.dataloading.NeighborSampler([10, 5]), embeddings=[emb],
                                mode="oac", batch_size=1024, shuffle=True, seed=0, use_ddp=True)

Each batch is ``graph_sampler.sample(g, seeds)``, what ``dgl.dataloading.DistNodeDataLoader`` computes per batch
(its collator makes the same call): the servers sample, ids are the DistGraph's (partition-relabelled) node
ids, and the embedding has a row for each. The seeds are dgl-oac's (its shuffle, its ``use_ddp`` split with
padding, so every rank takes the same number of steps).

Threads. DGL's RPC is not thread-safe, so only the caller's thread calls it: the loader samples on the caller's
thread (``num_workers`` must be 0, :func:`dgl_oac.dgl_frontend.sampling.workers.check_num_workers`), and the user reads
``g.ndata`` there too; the gather and write-back threads touch only the embedding's table. The servers sample
with their own RNG, so a DistGraph's batch stream is not a function of ``seed`` (a resumed run re-samples its
batches): exactness is tested by replaying recorded batches (``tests/dgl_frontend/test_distgraph.py``).

:func:`launch_local` runs a partitioned graph on this machine: a ``DistGraphServer`` per partition (each as its
own machine in ``ip_config``) and ``num_trainers`` trainer processes, each made a trainer by :func:`connect`
(DGL's client, a gloo process group with a ``file://`` rendezvous; the servers' ports are picked free, never a
fixed one). Across machines the servers are started as DGL starts them and the trainers under ``torchrun``
(README, "Graphs larger than one machine"). :class:`DistEdgePredictionSampler` gives edge batches as
``DistEdgeDataLoader`` makes them.
"""
from __future__ import annotations

import datetime
import json
import os
import queue
import signal
import socket
import tempfile
import time
import warnings
from typing import Any, Callable, List, Optional

import dgl
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ..distributed.group import current_group
from ..distributed.report import report, value_of

EXIT_GRACE_S = 20.0  # how long the server may take to shut down once its trainers have exited


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _dist_env(num_servers: int) -> None:
    """What DGL's launch tool sets for every process of a cluster (its server and client roles read them)."""
    os.environ["DGL_DIST_MODE"] = "distributed"
    os.environ["DGL_NUM_SERVER"] = str(num_servers)


def _serve(server_id: int, ip_config: str, part_config: str, num_trainers: int) -> None:
    """A server process: serves partition ``server_id`` (the machine of line ``server_id`` of ``ip_config``)
    until every trainer has exited."""
    _dist_env(1)
    os.environ["DGL_ROLE"] = "server"
    # disable_shared_mem: trainers load the partition book from the file, so no /dev/shm names can clash
    # between clusters that run at once (tests)
    server = dgl.distributed.DistGraphServer(server_id, ip_config, 1, num_trainers, part_config,
                                             disable_shared_mem=True)
    server.start()


def connect(ip_config: str, part_config: str, init_method: str = "env://",
            collective_timeout: float = 1800.0) -> Any:
    """Make this process a trainer of the DistGraph cluster of ``ip_config`` and return the graph: DGL's client
    first (as DGL requires), then the gloo process group (``init_method``: ``env://`` under ``torchrun``), then
    ``dgl.distributed.DistGraph`` with the partition book read from ``part_config`` (no shared memory needed).
    ``RANK`` and ``WORLD_SIZE`` come from the environment (``torchrun`` sets them)."""
    _dist_env(int(os.environ.get("DGL_NUM_SERVER", "1")))
    dgl.distributed.initialize(ip_config)
    dist.init_process_group("gloo", init_method=init_method, rank=int(os.environ["RANK"]),
                            world_size=int(os.environ["WORLD_SIZE"]),
                            timeout=datetime.timedelta(seconds=collective_timeout))
    # the book as this machine's partition sees it (torchrun's node rank = the partition a machine serves): DGL
    # registers a DistTensor's partition policy on the servers of the book's partition only
    part = int(os.environ.get("GROUP_RANK", "0") or 0)
    gpb, graph_name, _, _ = dgl.distributed.load_partition_book(part_config, part)
    return dgl.distributed.DistGraph(graph_name, gpb=gpb)


def row_partition(g: Any) -> Optional[List[int]]:
    """The rows each trainer owns for a table over ``g``'s nodes (``NodeEmbedding(partition=...)``): machine
    ``m``'s trainers own the node ID range of partition ``m`` (DGL relabels a DistGraph's nodes so that each
    partition is one range), split evenly among them, so a trainer's rows are its machine's nodes, which its
    sampler mostly reads: with ``sharding="rows"`` they are read locally. None (even ranges) unless there is one
    machine per partition, machines in partition order, each machine's ranks consecutive (``torchrun``'s)."""
    group = current_group()
    gpb = g.get_partition_book()
    if group is None or gpb.num_partitions() != len(group.machines):
        return None
    bounds = [0]
    for part, ranks in enumerate(group.machines):
        nids = gpb.partid2nids(part)
        lo, hi = int(nids.min()), int(nids.max()) + 1
        if lo != bounds[-1] or hi - lo != nids.numel() or ranks != list(range(ranks[0], ranks[0] + len(ranks))):
            return None
        k = len(ranks)
        bounds += [lo + (hi - lo) * (i + 1) // k for i in range(k)]
    return bounds


def _train(rank: int, world: int, ip_config: str, part_config: str, rendezvous: str, collective_timeout: float,
           target: Callable[..., Any], args: tuple, out: Any) -> None:
    """A trainer process of :func:`launch_local`: :func:`connect`, then ``target(rank, world, g, *args)``, whose
    value (or traceback) goes to ``out``."""
    def run() -> Any:
        torch.set_num_threads(1)
        os.environ["RANK"], os.environ["WORLD_SIZE"] = str(rank), str(world)
        g = connect(ip_config, part_config, rendezvous, collective_timeout)
        value = target(rank, world, g, *args)
        dist.barrier()  # no rank disconnects from the servers while another still samples
        return value

    report(out, rank, run)


def launch_local(target: Callable[..., Any], part_config: str, *args: Any, num_trainers: int = 2,
                 timeout: float = 120.0, collective_timeout: float = 30.0) -> List[Any]:
    """Serve the partitions of ``part_config`` (``dgl.distributed.partition_graph``) on this machine, one
    ``DistGraphServer`` each, as if each were a machine of its own (a line of ``ip_config``, its own free port),
    and run ``target(rank, world, g, *args)`` in ``num_trainers`` trainer processes (``spawn``; ``target`` must
    be importable, ``g`` is the DistGraph). Returns the trainers' values in rank order.

    A trainer that raises fails the launch with its traceback; a launch that passes ``timeout`` seconds is
    killed, every child by pid. The servers exit when their trainers have exited.

    Several partitions on one host: sampling is right (``tests/dgl_frontend/test_distgraph.py`` checks every edge),
    but node data is not: with DGL 1.1.3, ``g.ndata[...]`` read at partition 0's nodes returned partition 1's rows (the
    servers' data share names on one host; with or without shared memory), so this warns."""
    with open(part_config) as f:
        num_parts = int(json.load(f)["num_parts"])
    if num_parts > 1:
        warnings.warn(f"{part_config}: {num_parts} partitions served on one host: DGL's node data reads "
                      f"(g.ndata) of partition 0 return another partition's rows; sampling is right", stacklevel=2)
    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="dgl-oac-distgraph-") as tmp:
        ip_config = os.path.join(tmp, "ip_config.txt")
        with open(ip_config, "w") as f:
            f.writelines(f"127.0.0.1 {_free_port()}\n" for _ in range(num_parts))
        out = ctx.Queue()
        servers = [ctx.Process(target=_serve, args=(i, ip_config, part_config, num_trainers),
                               name=f"dgl-oac-distgraph-server{i}", daemon=True) for i in range(num_parts)]
        trainers = [ctx.Process(target=_train, args=(r, num_trainers, ip_config, part_config,
                                                     f"file://{tmp}/rendezvous", collective_timeout, target, args,
                                                     out), name=f"dgl-oac-distgraph-trainer{r}", daemon=True)
                    for r in range(num_trainers)]
        procs = [*servers, *trainers]
        try:
            for p in procs:
                p.start()
            got = _collect(out, trainers, servers, time.monotonic() + timeout)
            for p in [*trainers, *servers]:  # trainers exit after reporting; the servers once they are gone
                p.join(timeout=EXIT_GRACE_S)
                if p.is_alive():
                    raise TimeoutError(f"{p.name} did not exit within {EXIT_GRACE_S}s after training; killed")
        finally:
            _kill(procs)
    return [got[r] for r in range(num_trainers)]


#: after a trainer's failure, how long the others may take to report theirs: the failure that came first in
#: fact may reach the queue after a peer's failure it caused (a peer's collective sees the connection close)
FAILURE_GRACE_S = 3.0
#: the last line of a trainer's traceback when it failed because a peer went away, not of its own accord
_PEER_LOSS = ("Connection closed by peer", "Connection reset by peer", "PeerFailure")


def _collect(out: Any, trainers: List[Any], servers: List[Any], deadline: float,
             grace: float = FAILURE_GRACE_S) -> dict:
    """Every trainer's value, in a dict by rank. A process that died without a report raises at once; a failure
    raises once the other trainers have reported or ``grace`` s have passed, so that :func:`_failure` names the
    one that failed first."""
    got: dict = {}
    failed: List[tuple] = []  # (rank, traceback) in arrival order
    failed_at = 0.0
    while len(got) + len(failed) < len(trainers):
        now = time.monotonic()
        if failed and now >= failed_at + grace:
            break
        left = deadline - now
        if left <= 0:
            if failed:
                break
            missing = sorted(set(range(len(trainers))) - set(got))
            raise TimeoutError(f"trainers {missing} did not finish in time; killed")
        try:
            rank, ok, value = out.get(timeout=min(left, 0.5))
        except queue.Empty:
            reported = set(got) | {r for r, _ in failed}
            dead = [p.name for r, p in enumerate(trainers) if r not in reported and not p.is_alive()]
            dead += [f"{p.name} (exit code {p.exitcode})" for p in servers if not p.is_alive() and p.exitcode != 0]
            if dead and out.empty() and not failed:
                raise RuntimeError(f"{', '.join(dead)} exited without a result")
            continue
        if not ok:
            if not failed:
                failed_at = time.monotonic()
            failed.append((rank, value))
            continue
        got[rank] = value_of(value)
    if failed:
        raise RuntimeError(_failure(failed))
    return got


def _failure(failed: List[tuple]) -> str:
    """The launch's error from its trainers' failures ``[(rank, traceback), ...]`` in arrival order: the first
    that did not fail because a peer went away, with its traceback, then the others in a line each."""
    def peer_loss(tb: str) -> bool:
        last = tb.strip().splitlines()[-1] if tb.strip() else ""
        return any(mark in last for mark in _PEER_LOSS)

    first = next((f for f in failed if not peer_loss(f[1])), failed[0])
    text = f"trainer {first[0]} failed:\n{first[1]}"
    for rank, tb in failed:
        if rank != first[0]:
            last = tb.strip().splitlines()[-1] if tb.strip() else "?"
            text += f"\n(then trainer {rank} failed too: {last})"
    return text


def _kill(procs: List[Any]) -> None:
    for p in procs:
        if p.is_alive():
            os.kill(p.pid, signal.SIGKILL)
            p.join(timeout=5)


class DistEdgePredictionSampler:
    """``dgl.dataloading.as_edge_prediction_sampler`` for a DistGraph, which DGL 1.1.3's own does not take
    (``DistGraph.edge_subgraph`` has no ``output_device``): each batch is what ``DistEdgeDataLoader`` makes, its
    ``EdgeCollator``'s ``collate(seed_edges)``, i.e. ``(input_nodes, pair_graph, neg_pair_graph, blocks)`` with a
    ``negative_sampler``, else ``(input_nodes, pair_graph, blocks)``. For ``dgl_oac.DataLoader(g, edge_ids, ...)``.

    g: the DistGraph it samples; graph_sampler: a block sampler (``NeighborSampler``); the other arguments are
    ``EdgeCollator``'s (``exclude``, ``reverse_eids``, ``negative_sampler``)."""

    samples_edges = True  # its seeds are edge ids (dgl_oac.dgl_frontend.inputs.samples_edges)

    def __init__(self, g: Any, graph_sampler: Any, negative_sampler: Any = None, exclude: Any = None,
                 reverse_eids: Any = None) -> None:
        if not isinstance(g, dgl.distributed.DistGraph):
            raise TypeError(f"DistEdgePredictionSampler samples a dgl.distributed.DistGraph, got {type(g).__name__}: "
                            f"on a DGLGraph use dgl.dataloading.as_edge_prediction_sampler")
        self.g = g
        self.negative_sampler = negative_sampler
        # the collator's own edge set is DistEdgeDataLoader's dataset, unused here: the loader passes each batch
        self.collator = dgl.dataloading.EdgeCollator(g, torch.zeros(0, dtype=torch.int64), graph_sampler,
                                                     exclude=exclude, reverse_eids=reverse_eids,
                                                     negative_sampler=negative_sampler)

    def sample(self, g: Any, seed_edges: torch.Tensor) -> tuple:
        """The batch of ``seed_edges: int64[b], CPU`` (edge ids of ``g``, the graph given at construction)."""
        if g is not self.g:
            raise ValueError("DistEdgePredictionSampler was built for another graph than the loader's")
        return self.collator.collate(seed_edges)
