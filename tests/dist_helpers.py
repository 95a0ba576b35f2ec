"""Run functions on N spawned gloo ranks, the way the distributed tests need it.

``RankPool(world)`` spawns ``world`` processes once (``spawn``: fresh interpreters, as torchrun gives; each
takes seconds to import torch and DGL, so a test module shares one pool). ``pool.run(target, *args)`` then
has every rank initialise ``torch.distributed`` (gloo unless ``backend=`` says otherwise, a ``file://`` rendezvous in
a new temp dir, never a fixed port; a collective timeout of ``collective_timeout`` s), call ``target(rank, world,
*args)`` with one torch
thread, and tear the process group down (a rank whose group could not connect, before the target ran, has the
run start again once on new ranks). Results come back in rank order. A rank that raises fails the test
with its traceback; a run that passes ``timeout`` has every child killed by pid (no hang in CI) and the pool
starts new ones for the next run. ``outcomes=True`` returns ``[(ok, value_or_traceback), ...]`` instead of
raising (tests where a rank is meant to fail). ``run_ranks`` is a one-off pool; the fixture ``pool`` (import it
into a test module) is a pool of 2 ranks shared by the module's tests. ``torchrun(...)`` runs a program under
``torchrun --standalone`` (it picks a free port) and kills it with its workers on timeout.
"""
from __future__ import annotations

import datetime
import json
import os
import queue
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from dgl_oac.checkpoint import CheckpointReader
from dgl_oac.distributed.report import report, value_of

#: how long one run of the ranks may take before it counts as hung: seconds alone, past 90 s under `-n 2` with
#: torch's CUDA build on 2 cores (the rank processes' imports), as at the torch floor (README's table)
RUN_S = 240.0


def _serve(rank: int, world: int, inbox: Any, out: Any) -> None:
    torch.set_num_threads(1)
    while True:
        task = inbox.get()
        if task is None:
            return
        target, init, collective_timeout, backend, args = task
        report(out, rank, _run, rank, world, init, collective_timeout, backend, target, args)


class SetupRace(RuntimeError):
    """gloo's connect between ranks failed while the group was being made, before the target ran."""


def _run(rank: int, world: int, init: str, collective_timeout: float, backend: str, target: Callable[..., Any],
         args: tuple) -> Any:
    try:
        dist.init_process_group(backend, init_method=init, rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=collective_timeout))
    except RuntimeError as exc:
        if "connectFullMesh failed" in str(exc):
            raise SetupRace(str(exc)) from exc
        raise
    return target(rank, world, *args)


class _Retry(AssertionError):
    """A rank failed with :class:`SetupRace`: :meth:`RankPool.run` starts new ranks and runs once more."""


class RankPool:
    def __init__(self, world: int) -> None:
        self.world = world
        self._ctx = mp.get_context("spawn")
        self._procs: List[Any] = []

    def _start(self) -> None:
        self._out = self._ctx.Queue()
        self._inboxes = [self._ctx.Queue() for _ in range(self.world)]
        self._procs = [self._ctx.Process(target=_serve, args=(r, self.world, self._inboxes[r], self._out),
                                         name=f"dgl-oac-test-rank{r}", daemon=True) for r in range(self.world)]
        for p in self._procs:
            p.start()

    def run(self, target: Callable[..., Any], *args: Any, timeout: float = RUN_S, collective_timeout: float = 30.0,
            outcomes: bool = False, backend: str = "gloo") -> List[Any]:
        for attempt in range(2):
            if not self._procs or not all(p.is_alive() for p in self._procs):
                self.close()
                self._start()
            with tempfile.TemporaryDirectory(prefix="dgl-oac-rdv-") as tmp:
                for box in self._inboxes:
                    box.put((target, f"file://{tmp}/rendezvous", collective_timeout, backend, args))
                try:
                    got = self._collect(timeout, outcomes)
                    break
                except _Retry:
                    # gloo failed to connect the ranks, before the target ran (seen with two gloo jobs side by
                    # side, which conftest.py's _one_gloo_job_at_a_time now keeps apart within the test run):
                    # once more with new ranks (_collect closed these), as a fresh torchrun would start
                    if attempt:
                        raise
        results = [got[r] for r in range(self.world)]
        return results if outcomes else [v for _, v in results]

    def _collect(self, timeout: float, outcomes: bool) -> dict:
        got: dict = {}
        deadline = time.monotonic() + timeout
        try:
            while len(got) < self.world:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"ranks {sorted(set(range(self.world)) - set(got))} did not finish within "
                                       f"{timeout}s; killed")
                try:
                    rank, ok, value = self._out.get(timeout=min(left, 0.5))
                except queue.Empty:
                    self._note_dead(got)
                    continue
                got[rank] = (ok, value_of(value) if ok else value)
                if not ok and f"{SetupRace.__module__}.SetupRace" in value:
                    raise _Retry(f"rank {rank} failed to join the group:\n{value}")
                if not ok and not outcomes:
                    raise AssertionError(f"rank {rank} failed:\n{value}")
        except BaseException:
            self.close()  # a run that did not finish leaves ranks mid-collective: never reuse them
            raise
        return got

    def _note_dead(self, got: dict) -> None:
        for r, p in enumerate(self._procs):
            if r not in got and not p.is_alive():
                time.sleep(0.2)  # its last message may still be in the pipe
                if self._out.empty():
                    got[r] = (False, f"rank {r} exited with code {p.exitcode}")

    def close(self, grace: Optional[float] = 0.0) -> None:
        for p, box in zip(self._procs, getattr(self, "_inboxes", [])):
            if p.is_alive() and grace:
                box.put(None)
        for p in self._procs:
            p.join(timeout=grace or 0.1)
            if p.is_alive():
                os.kill(p.pid, signal.SIGKILL)
                p.join(timeout=5)
        self._procs = []


def run_ranks(target: Callable[..., Any], world: int, *args: Any, **kwargs: Any) -> List[Any]:
    pool = RankPool(world)
    try:
        return pool.run(target, *args, **kwargs)
    finally:
        pool.close(grace=5.0)


def _env() -> dict:
    root = str(Path(__file__).resolve().parents[1])
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}


def _finish(procs: List[subprocess.Popen], timeout: float) -> List[str]:
    """Wait for every launcher; on timeout kill each with its workers (its own process group). Returns stdouts."""
    deadline = time.monotonic() + timeout
    outs = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
            assert proc.returncode == 0, err[-3000:]
            outs.append(out)
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.communicate()
    return outs


def torchrun(*args: str, nproc: int = 2, timeout: float = 240.0) -> str:
    """``torchrun --standalone --nproc_per_node=nproc *args`` with one OpenMP thread a process and this checkout
    first on ``PYTHONPATH``; returns its stdout (a non-zero exit fails with its stderr). On timeout torchrun and
    its workers (one process group) are killed."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", *args]
    return _finish([subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(),
                                     start_new_session=True)], timeout)[0]


# --- `dgl-oac train` under torchrun: its small task settings, and one launch's summary ---------------------
SMALL = {
    "node": ["--num-nodes", "600", "--batch-size", "64", "--fanouts", "5,5", "--dim", "16", "--hidden", "16"],
    "kg": ["--num-nodes", "300", "--batch-size", "256", "--dim", "16", "--negatives", "16", "--model", "complex"],
}
TABLE = {"node": "emb", "kg": "entity"}
TIMING = ("train_seconds", "epoch_seconds", "eval_seconds")


#: how long one 2-trainer launch may take before it counts as hung: 10-20 s alone, past 120 s under `-n 2` with
#: torch's CUDA build on 2 cores (its imports), as at the torch floor (README's table)
LAUNCH_S = 240


def torchrun_train(tmp: Path, name: str, task: str, mode: str, *extra: str, launch=torchrun) -> Dict:
    """Run 2 trainers (``launch``: dist_helpers' torchrun, or torchrun_nodes for two machines); returns rank 0's
    JSON summary, with its stdout and the trained table (value ‖ state)."""
    out, ckpt = tmp / f"{name}.json", tmp / name
    res = {"stdout": launch("-m", "dgl_oac", "train", "--task", task, "--mode", mode, "--epochs", "2", "--seed", "3",
                              "--threads", "1", "--no-progress", "--prefetch", "2", "--background-priority", "normal",
                              "--out", str(out), "--checkpoint-dir", str(ckpt), *SMALL[task], *extra,
                              timeout=LAUNCH_S)}
    res.update(json.loads(out.read_text()))
    res["table"] = CheckpointReader(ckpt / "checkpoint.ckpt").table(TABLE[task])
    return res


def metrics_of(curve: List[Dict]) -> List[Dict]:
    return [{k: v for k, v in p.items() if k not in TIMING} for p in curve]


def torchrun_nodes(*args: str, nodes: int = 2, timeout: float = 240.0) -> str:
    """``torchrun --nnodes=nodes --nproc_per_node=1 --node_rank=i *args`` for i = 0..nodes-1 on this host (static
    rendezvous on a free loopback port): one trainer per "machine"; returns node 0's stdout."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [subprocess.Popen([sys.executable, "-m", "torch.distributed.run", f"--nnodes={nodes}", "--nproc_per_node=1",
                               f"--node_rank={i}", "--master_addr=127.0.0.1", f"--master_port={port}", *args],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(),
                              start_new_session=True) for i in range(nodes)]
    return _finish(procs, timeout)[0]


@pytest.fixture(scope="module", name="pool")
def two_rank_pool() -> Any:
    pool = RankPool(2)
    yield pool
    pool.close(grace=5.0)
