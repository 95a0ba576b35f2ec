"""A checkpoint on disk: a main file, written last and atomically, naming a folder of tables.

A checkpoint at ``path`` is:

- ``path``, the main file: ``MAGIC | payload | trailer`` (the payload's length, its sha256, ``END``). The payload
  is ``torch.save`` of plain data, read back with ``weights_only=True``: the small state
  (:mod:`dgl_oac.checkpoint`), and ``tables``: the folder's name and the sha256 and writer rank of its every file;
- ``<path>.<id>.dcp/``, the tables, written through ``torch.distributed.checkpoint``
  (:mod:`dgl_oac.checkpoint.tables`).

Atomic as a whole: the folder is written first (every file fsynced, then the folder), then ``path`` through a
temporary file, fsync, rename, fsync of the directory. A save killed at any moment leaves ``path`` naming the
previous checkpoint's folder, which is removed only once the new ``path`` is in place (:func:`remove_stale`).
Every byte is under a check: the main file's magic, sha256 and end marker; each table file's sha256.
"""
from __future__ import annotations

import glob
import hashlib
import io
import os
import re
import shutil
import struct
import warnings
from pathlib import Path
from typing import Any, Dict, Union

import torch

from .tables import CheckpointError, check_file, read_table

MAGIC = b"DGLOACK2"
OLD_MAGIC = b"DGLOACK1"  # format 1: one file holding the tables (dgl-oac before torch.distributed.checkpoint)
END = b"DGLOACND"
TRAILER = struct.Struct("<Q32s8s")  # payload length, sha256 of the payload, END
FORMAT = 2
PathLike = Union[str, os.PathLike]


def tables_folder(path: Path, checkpoint_id: str) -> Path:
    """The tables folder of checkpoint ``checkpoint_id`` (32 hex digits) whose main file is ``path``."""
    if not re.fullmatch(r"[0-9a-f]{32}", checkpoint_id):
        raise ValueError(f"a checkpoint id is 32 hex digits, got {checkpoint_id!r}")
    return path.with_name(f"{path.name}.{checkpoint_id}.dcp")


def fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_main(path: Path, meta: Dict[str, Any]) -> None:
    """Write the main file ``path`` holding ``meta``, atomically (a killed writer leaves the old one)."""
    buf = io.BytesIO()
    torch.save(meta, buf)
    payload = buf.getbuffer()
    tmp = path.with_name(path.name + ".tmp")  # one writer per path; a stale one from a killed run is replaced
    try:
        with open(tmp, "wb") as f:
            f.write(MAGIC)
            f.write(payload)
            f.write(TRAILER.pack(len(payload), hashlib.sha256(payload).digest(), END))
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, path)
    fsync_dir(path.parent)


def remove_stale(path: Path, keep: Path) -> None:
    """Remove the tables folders of earlier checkpoints at ``path`` (and of saves killed midway), all but
    ``keep``, the one ``path`` now names."""
    for old in path.parent.glob(f"{glob.escape(path.name)}.*.dcp"):
        # exactly <name>.<id>.dcp: the folders of a checkpoint at <name>.best (say) are not this one's
        if old != keep and re.fullmatch(re.escape(path.name) + r"\.[0-9a-f]{32}\.dcp", old.name):
            try:
                shutil.rmtree(old)
            except OSError as exc:  # a leftover costs disk, not correctness: the main file names its folder
                warnings.warn(f"could not remove the old checkpoint folder {old}: {exc}", RuntimeWarning)


class CheckpointReader:
    """A checkpoint's main file, parsed and checked on open (magic, length, sha256, format): :attr:`meta` is
    its small state; :meth:`verify` checks every table file's sha256; :meth:`table` reads a table back whole.

    The main file is read once, on open; the tables folder it names is read when asked (a later save at the same
    path removes it)."""

    def __init__(self, path: PathLike) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise FileNotFoundError(f"no checkpoint at {self.path}")
        self.meta: Dict[str, Any] = self._parse(self.path.read_bytes())
        self.folder = self.path.parent / self.meta["tables"]["folder"]
        self.verified = False

    def _parse(self, data: bytes) -> Dict[str, Any]:
        head = data[:len(MAGIC)]
        if head == OLD_MAGIC:
            raise CheckpointError(f"{self.path} is a format-1 dgl-oac checkpoint (one file, written before "
                                  f"torch.distributed.checkpoint); this dgl-oac reads format {FORMAT}")
        if head != MAGIC[:len(head)] or (head != MAGIC and len(data) >= len(MAGIC)):
            raise CheckpointError(f"{self.path} is not a dgl-oac checkpoint (its first bytes are not {MAGIC!r})")
        if len(data) < len(MAGIC) + TRAILER.size or data[-len(END):] != END:
            raise CheckpointError(f"checkpoint {self.path} is truncated or incomplete: no end marker "
                                  f"({len(data):,} bytes; was the writer killed or the copy cut short?)")
        size, sha, _ = TRAILER.unpack(data[-TRAILER.size:])
        if size != len(data) - len(MAGIC) - TRAILER.size:
            raise CheckpointError(f"checkpoint {self.path} is truncated or corrupted: its payload has "
                                  f"{len(data) - len(MAGIC) - TRAILER.size:,} bytes, its trailer says {size:,}")
        payload = data[len(MAGIC):len(MAGIC) + size]
        if hashlib.sha256(payload).digest() != sha:
            raise CheckpointError(f"checkpoint {self.path} is corrupted: the main file's sha256 does not match")
        meta = torch.load(io.BytesIO(payload), map_location="cpu", weights_only=True)
        if meta.get("format") != FORMAT:
            raise CheckpointError(f"checkpoint {self.path} has format {meta.get('format')}, this dgl-oac reads "
                                  f"format {FORMAT}")
        return meta

    def close(self) -> None:
        """Nothing stays open (kept so that ``with CheckpointReader(path) as r:`` reads as before)."""

    def __enter__(self) -> "CheckpointReader":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def verify(self) -> None:
        """Check every table file's sha256 (reads the whole folder once)."""
        files = self.meta["tables"]["files"]
        for name in sorted(files):
            check_file(self.folder, name, files, f"checkpoint {self.path}")
        self.verified = True

    def table_info(self, name: str) -> Dict[str, Any]:
        """``{"name", "num_rows", "dim", "state_width"}`` of the table ``name``; :class:`CheckpointError` naming
        the tables it holds when there is none by that name."""
        for info in self.meta["embeddings"]:
            if info["name"] == name:
                return info
        raise CheckpointError(f"checkpoint {self.path} holds no embedding {name!r} (it holds "
                              f"{[e['name'] for e in self.meta['embeddings']]})")

    def table(self, name: str) -> torch.Tensor:
        """The full rows ``float32[N, D + S]`` of embedding ``name``, in memory (for small tables and tests),
        whatever number of trainers wrote them."""
        info = self.table_info(name)
        return read_table(self.folder, name, info["num_rows"], info["dim"] + info["state_width"])
