"""One training run on emulated machines (``scripts/netns.py``): a ``torchrun --nnodes=M`` agent per namespace,
its rendezvous on machine 0's address, gloo and TensorPipe on the namespace's interface; while it runs, each
machine's PSS (summed over its processes, ``/proc/<pid>/smaps_rollup``) is sampled; before and after, each
machine's interface counters.

Used by ``scale_out_net.py`` (dgl-oac's trainer) and ``dgl_dist_embedding.py`` (DGL's).
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Dict, List, Sequence

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO / "scripts"))
import netns  # noqa: E402


def pss_kib(pid: int) -> int:
    """The proportional set size of ``pid`` in KiB (0 if it is gone)."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


class PeakPss:
    """Samples every ``period`` s, in a thread named ``netrun-pss``, the PSS of each machine (its namespace's
    processes, summed) and keeps the peak per machine (bytes). ``with PeakPss(net) as p: ...; p.peak``."""

    def __init__(self, net: Any, period: float = 0.5) -> None:
        self.net, self.period = net, period
        self.peak = [0] * net.machines
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="netrun-pss", daemon=True)

    def __enter__(self) -> "PeakPss":
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _loop(self) -> None:
        while not self._stop.wait(self.period):
            for i in range(self.net.machines):
                pids = subprocess.run(["ip", "netns", "pids", self.net.ns(i)], capture_output=True, text=True,
                                      timeout=10).stdout.split()
                self.peak[i] = max(self.peak[i], 1024 * sum(pss_kib(int(p)) for p in pids))
            self.samples += 1


def env(net: Any) -> Dict[str, str]:
    """The trainers' environment: this checkout first on PYTHONPATH, one OpenMP thread a process (as the other
    scale-out runs), gloo and TensorPipe on the machine's interface."""
    return {**os.environ, **net.env(), "OMP_NUM_THREADS": "1",
            "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}


def torchrun(net: Any, i: int, port: int, program: Sequence[str]) -> List[str]:
    """Machine ``i``'s torchrun agent (one trainer), static rendezvous at machine 0's ``port``."""
    return net.cmd(i, [sys.executable, "-m", "torch.distributed.run", f"--nnodes={net.machines}",
                       "--nproc_per_node=1", f"--node_rank={i}", f"--master_addr={net.addr(0)}",
                       f"--master_port={port}", *program])


def launch(net: Any, cmds: List[List[str]], timeout: float, what: str, servers: int = 0,
           grace: float = 30.0) -> Dict[str, Any]:
    """Run ``cmds`` at once (the first ``servers`` of them serve the others and exit once those have: they get
    ``grace`` s more) and wait for all; returns the peak PSS per machine, the bytes each machine's interface sent
    and received, the wall seconds. The first process to fail kills the others and raises with its output; on
    ``timeout`` every process group is killed."""
    before = [net.counters(i) for i in range(net.machines)]
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="netrun-") as tmp:
        logs = [open(Path(tmp, f"p{k}.log"), "w+") for k in range(len(cmds))]
        procs = [subprocess.Popen(c, stdout=f, stderr=subprocess.STDOUT, text=True, env=env(net), cwd=REPO,
                                  start_new_session=True) for c, f in zip(cmds, logs)]
        try:
            with PeakPss(net) as pss:
                _wait(procs, logs, servers, time.monotonic() + timeout, grace, what)
        finally:
            for p in procs:
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()
            for f in logs:
                f.close()
    after = [net.counters(i) for i in range(net.machines)]
    return {"wall_s": time.perf_counter() - t0, "pss_peak_bytes": pss.peak, "pss_samples": pss.samples,
            "wire": [{k: a[k] - b[k] for k in a} for a, b in zip(after, before)]}


def _wait(procs: List[Any], logs: List[Any], servers: int, deadline: float, grace: float, what: str) -> None:
    """Until every process has exited 0 (servers: within ``grace`` s of the last other); raise at the first
    failure, with its output."""
    last = None
    while True:
        codes = [p.poll() for p in procs]
        bad = next((k for k, c in enumerate(codes) if c not in (None, 0)), None)
        if bad is not None:
            logs[bad].seek(0)
            raise RuntimeError(f"{what}: process {bad} ({' '.join(procs[bad].args[-12:])[:300]}) exited "
                               f"{codes[bad]}:\n{logs[bad].read()[-4000:]}")
        if all(c == 0 for c in codes):
            return
        if all(c == 0 for c in codes[servers:]):
            last = last or time.monotonic()
            if time.monotonic() - last > grace:
                raise RuntimeError(f"{what}: the servers did not exit within {grace}s of their clients")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: ran past its timeout; killed")
        time.sleep(0.2)
