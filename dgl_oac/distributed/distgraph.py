"""DGL's distributed graph with dgl-oac's embeddings, and a DistGraph cluster on this machine.

A ``dgl.distributed.DistGraph`` is a graph ``dgl_oac.DataLoader`` takes like a DGLGraph::

    g = dgl.distributed.DistGraph(graph_name)                     # after dgl.distributed.initialize(ip_config)
    emb = dgl_oac.NodeEmbedding(g.num_nodes(), 64, "emb")        # after init_process_group: shared by the trainers
    loader = dgl_oac.DataLoader(g, train_ids, dgl.dataloading.NeighborSampler([10, 5]), embeddings=[emb],
                                mode="oac", batch_size=1024, shuffle=True, seed=0, use_ddp=True)

Each batch is ``graph_sampler.sample(g, seeds)``, what ``dgl.dataloading.DistNodeDataLoader`` computes per batch
(its collator makes the same call): the servers sample, ids are the DistGraph's (partition-relabelled) node
ids, and the embedding has a row for each. The seeds are dgl-oac's (its shuffle, its ``use_ddp`` split with
padding, so every rank takes the same number of steps, and its resumable position).

Threads. DGL's RPC is not thread-safe, so only the caller's thread calls it: the loader samples on the caller's
thread (``num_workers`` must be 0, :func:`dgl_oac.sampling.workers.check_num_workers`), and the user reads
``g.ndata`` there too; the gather and write-back threads touch only the embedding's table. The servers sample
with their own RNG, so a DistGraph's batch stream is not a function of ``seed``: exactness is tested by
replaying recorded batches (``tests/test_distgraph.py``).

:func:`launch_local` runs a partitioned graph on this machine: one ``DistGraphServer`` and ``num_trainers``
trainer processes, each with DGL's client and a gloo process group (``file://`` rendezvous; the servers' port
is picked free, never a fixed one). Across machines, DGL's launch tool or ``torchrun`` starts the same pieces
(README, "Graphs larger than one machine").
"""
from __future__ import annotations

import datetime
import io
import json
import os
import queue
import signal
import socket
import tempfile
import time
import traceback
from typing import Any, Callable, List

import dgl
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

EXIT_GRACE_S = 20.0  # how long the server may take to shut down once its trainers have exited


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _dist_env(num_servers: int) -> None:
    """What DGL's launch tool sets for every process of a cluster (its server and client roles read them)."""
    os.environ["DGL_DIST_MODE"] = "distributed"
    os.environ["DGL_NUM_SERVER"] = str(num_servers)


def _serve(ip_config: str, part_config: str, num_trainers: int) -> None:
    """The server process: serves partition 0 until every trainer has exited."""
    _dist_env(1)
    os.environ["DGL_ROLE"] = "server"
    # disable_shared_mem: trainers load the partition book from the file, so no /dev/shm names can clash
    # between clusters that run at once (tests)
    server = dgl.distributed.DistGraphServer(0, ip_config, 1, num_trainers, part_config, disable_shared_mem=True)
    server.start()


def _train(rank: int, world: int, ip_config: str, part_config: str, rendezvous: str, collective_timeout: float,
           target: Callable[..., Any], args: tuple, out: Any) -> None:
    """A trainer process: DGL's client (before torch.distributed, as DGL requires), the process group, the graph;
    then ``target(rank, world, g, *args)``, whose value (or traceback) goes to ``out``."""
    try:
        _dist_env(1)
        torch.set_num_threads(1)
        dgl.distributed.initialize(ip_config)
        dist.init_process_group("gloo", init_method=rendezvous, rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=collective_timeout))
        gpb, graph_name, _, _ = dgl.distributed.load_partition_book(part_config, 0)
        g = dgl.distributed.DistGraph(graph_name, gpb=gpb)
        value = target(rank, world, g, *args)
        dist.barrier()  # no rank disconnects from the server while another still samples
        buf = io.BytesIO()
        torch.save(value, buf)  # bytes, not shared-memory handles
        out.put((rank, True, buf.getvalue()))
    except BaseException:  # noqa: BLE001 - reported to the parent
        out.put((rank, False, traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def launch_local(target: Callable[..., Any], part_config: str, *args: Any, num_trainers: int = 2,
                 timeout: float = 120.0, collective_timeout: float = 30.0) -> List[Any]:
    """Serve the one-partition graph of ``part_config`` (``dgl.distributed.partition_graph(..., 1, ...)``) on
    this machine and run ``target(rank, world, g, *args)`` in ``num_trainers`` trainer processes (``spawn``;
    ``target`` must be importable, ``g`` is the DistGraph). Returns the trainers' values in rank order.

    A trainer that raises fails the launch with its traceback; a launch that passes ``timeout`` seconds is
    killed, every child by pid. The server exits when its trainers have exited."""
    with open(part_config) as f:
        if json.load(f)["num_parts"] != 1:
            raise ValueError(f"launch_local serves one partition; {part_config} has more (run one server per "
                             f"partition on its machine: README, 'Graphs larger than one machine')")
    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="dgl-oac-distgraph-") as tmp:
        ip_config = os.path.join(tmp, "ip_config.txt")
        with open(ip_config, "w") as f:
            f.write(f"127.0.0.1 {_free_port()}\n")
        out = ctx.Queue()
        server = ctx.Process(target=_serve, args=(ip_config, part_config, num_trainers),
                             name="dgl-oac-distgraph-server", daemon=True)
        trainers = [ctx.Process(target=_train, args=(r, num_trainers, ip_config, part_config,
                                                     f"file://{tmp}/rendezvous", collective_timeout, target, args,
                                                     out), name=f"dgl-oac-distgraph-trainer{r}", daemon=True)
                    for r in range(num_trainers)]
        procs = [server, *trainers]
        try:
            for p in procs:
                p.start()
            got = _collect(out, trainers, server, time.monotonic() + timeout)
            for p in procs:  # trainers exit after reporting; the server once they are gone
                p.join(timeout=EXIT_GRACE_S)
                if p.is_alive():
                    raise TimeoutError(f"{p.name} did not exit within {EXIT_GRACE_S}s after training; killed")
        finally:
            _kill(procs)
    return [got[r] for r in range(num_trainers)]


def _collect(out: Any, trainers: List[Any], server: Any, deadline: float) -> dict:
    """Every trainer's value, in a dict by rank; a failure or a dead process raises at once."""
    got: dict = {}
    while len(got) < len(trainers):
        left = deadline - time.monotonic()
        if left <= 0:
            missing = sorted(set(range(len(trainers))) - set(got))
            raise TimeoutError(f"trainers {missing} did not finish in time; killed")
        try:
            rank, ok, value = out.get(timeout=min(left, 0.5))
        except queue.Empty:
            dead = [p.name for r, p in enumerate(trainers) if r not in got and not p.is_alive()]
            if not server.is_alive() and server.exitcode != 0:
                dead.append(f"{server.name} (exit code {server.exitcode})")
            if dead and out.empty():
                raise RuntimeError(f"{', '.join(dead)} exited without a result")
            continue
        if not ok:
            raise RuntimeError(f"trainer {rank} failed:\n{value}")
        got[rank] = torch.load(io.BytesIO(value), weights_only=False)
    return got


def _kill(procs: List[Any]) -> None:
    for p in procs:
        if p.is_alive():
            os.kill(p.pid, signal.SIGKILL)
            p.join(timeout=5)
