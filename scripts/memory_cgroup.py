"""A cgroup v1 memory cgroup for one child process: create, limit, join (from the child), remove.

Used by ``big_table.py --memory-limit``: the page cache of a process in the group is charged to it, so a table
file larger than the limit cannot stay cached, as if it were larger than RAM.
"""
from __future__ import annotations

import errno
import os
import re
import time
from pathlib import Path
from types import TracebackType
from typing import Optional, Type

ROOT = Path("/sys/fs/cgroup/memory")
_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def parse_size(text: str) -> int:
    """``"1.6G"`` -> bytes (K/M/G/T are powers of 1024; a plain number is bytes)."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([KMGT]?)i?B?\s*", text, flags=re.IGNORECASE)
    if m is None or float(m.group(1)) <= 0:
        raise ValueError(f"memory limit {text!r}: expected a positive size such as 1.6G, 1600M or 1717986918")
    return int(float(m.group(1)) * _UNITS[m.group(2).upper()])


class MemoryCgroup:
    """``with MemoryCgroup(name, limit) as g: subprocess.run(..., preexec_fn=g.join_preexec)``."""

    def __init__(self, name: str, limit: int, root: Path = ROOT) -> None:
        self.path = root / name
        self.limit = limit
        self.root = root

    def __enter__(self) -> "MemoryCgroup":
        if not (self.root / "memory.limit_in_bytes").exists():
            raise SystemExit(f"memory cgroup: no cgroup v1 memory controller is mounted at {self.root} (cgroup v2 "
                             f"or a container without it); run without --memory-limit, or on a cgroup v1 host")
        try:
            self.path.mkdir()
        except PermissionError:
            raise SystemExit(f"memory cgroup: no rights to create {self.path}: --memory-limit needs root "
                             f"(sudo) or write access to {self.root}") from None
        except OSError as exc:
            if exc.errno in (errno.EROFS, errno.EACCES):
                raise SystemExit(f"memory cgroup: cannot create {self.path} ({exc.strerror}): --memory-limit "
                                 f"needs a writable cgroup v1 memory hierarchy and root") from None
            raise
        try:
            (self.path / "memory.limit_in_bytes").write_text(str(self.limit))
        except BaseException:
            self.remove()
            raise
        return self

    def join_preexec(self) -> None:
        """In the forked child before exec: move this process into the group (its page cache is charged)."""
        (self.path / "cgroup.procs").write_text(str(os.getpid()))

    def peak_bytes(self) -> int:
        return int((self.path / "memory.max_usage_in_bytes").read_text())

    def remove(self) -> None:
        """Remove the group once its processes have left (rmdir retried briefly: the last exit is asynchronous)."""
        for _ in range(50):
            try:
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError as exc:
                if exc.errno != errno.EBUSY:
                    raise
                time.sleep(0.1)
        raise RuntimeError(f"memory cgroup {self.path} is still busy; remove it with: rmdir {self.path}")

    def __exit__(self, exc_type: Optional[Type[BaseException]], exc: Optional[BaseException],
                 tb: Optional[TracebackType]) -> None:
        self.remove()
