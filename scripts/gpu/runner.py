"""Running the steps so that whatever happens is on disk: each step in its own process group with a time limit
(the whole group is killed when it runs past it), its output appended to one log as it comes, and the summary
rewritten atomically whenever a step starts or ends."""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List

REPO = Path(__file__).resolve().parents[2]
TAIL_BYTES = 3000
GRACE_S = 3.0


class Budget:
    """The seconds left until the deadline, shared out over the steps not yet run: a step's limit is its share of
    what is left, against its own and the later steps' shares, so time one step leaves unused passes on."""

    def __init__(self, seconds: float, clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self.deadline = clock() + seconds

    def left(self) -> float:
        return max(0.0, self.deadline - self.clock())

    def limit(self, share: float, later_shares: float) -> float:
        return self.left() * share / (share + later_shares)


class Stopped(BaseException):
    """The suite got SIGTERM or SIGINT: the step running is killed, the summary says so, and the suite exits."""


class StopSignals:
    """SIGTERM and SIGINT (``handler``) raise :class:`Stopped` at once, except while a step's process is being
    started (``deferred()``): raised inside ``Popen`` the exception would leave that process running with no one
    holding it, so it is raised as the block ends, once the process can be killed."""

    def __init__(self) -> None:
        self.pending = ""
        self.deferring = False

    def handler(self, signum: int, frame: Any) -> None:  # noqa: ARG002 - a signal handler's signature
        self.pending = signal.Signals(signum).name
        if not self.deferring:
            raise Stopped(self.pending)

    @contextlib.contextmanager
    def deferred(self) -> Iterator[None]:
        self.deferring = True
        try:
            yield
        finally:
            self.deferring = False
        if self.pending:
            raise Stopped(self.pending)


STOP = StopSignals()


def kill_group(proc: subprocess.Popen) -> None:
    """SIGTERM to the step's whole process group (sampling workers, pytest's children), SIGKILL after a grace."""
    for sig, wait in ((signal.SIGTERM, GRACE_S), (signal.SIGKILL, None)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def run_step(name: str, argv: List[str], log: Path, env: Dict[str, str], limit: float) -> Dict[str, Any]:
    """Run ``argv`` from the repository root, its stdout and stderr appended to ``log`` under a header; killed
    past ``limit`` seconds. Returns ``status`` (ok, failed: a non-zero exit, timeout), ``rc``, ``seconds``,
    ``limit_s``, ``log`` (the step's byte range in ``log``) and ``tail`` (its last bytes, for the summary)."""
    t0 = time.monotonic()
    with open(log, "ab", buffering=0) as f:
        start = f.tell()
        f.write(f"\n===== {name} (limit {limit:.0f} s): {' '.join(argv)}\n".encode())
        proc = None
        try:
            with STOP.deferred():
                proc = subprocess.Popen(argv, cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=f,
                                        stderr=subprocess.STDOUT, start_new_session=True)
            rc = proc.wait(timeout=limit)
            status = "ok" if rc == 0 else "failed"
        except subprocess.TimeoutExpired:
            kill_group(proc)
            rc, status = proc.returncode, "timeout"
        except BaseException:  # the suite itself is being stopped: leave no step running behind it
            if proc is not None:
                kill_group(proc)
            raise
        seconds = time.monotonic() - t0
        f.write(f"===== {name}: {status}, rc {rc}, {seconds:.1f} s\n".encode())
        end = f.tell()
    with open(log, "rb") as f:
        f.seek(max(start, end - TAIL_BYTES))
        tail = f.read(end - f.tell()).decode(errors="replace")
    return {"status": status, "rc": rc, "seconds": round(seconds, 1), "limit_s": round(limit, 1),
            "log": {"file": log.name, "offset": start, "bytes": end - start}, "tail": tail}


def write_json(path: Path, obj: Any) -> None:
    """Write ``obj`` to ``path`` atomically (a reader, or a kill, never sees half a file)."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(obj, indent=2, default=str) + "\n")
    os.replace(tmp, path)
