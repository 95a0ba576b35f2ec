"""The checkpoint file: sections with sha256 checksums, written atomically, tables streamed in chunks.

Layout (little-endian)::

    MAGIC (8 bytes) | section 0 | section 1 | ... | footer (JSON) | footer length (u64) | sha256(footer) | END

Sections: ``meta`` (bytes from :mod:`dgl_oac.checkpoint`) and one ``table/<name>`` per embedding, the raw
``float32[N, D + S]`` rows. The footer lists every section's offset, size and sha256, so every byte of the file
is under a check (magic, section checksums, footer checksum, end marker). Tables move in chunks of
:data:`CHUNK_BYTES`; a file-backed table is read with ``read()`` from its file, not through its memory map, so
writing it adds about one chunk to the process's memory (the page cache is shared with the map: what the
write-back wrote through the map is what ``read()`` returns).

Writes are atomic: a temporary file beside the target, fsync, rename, fsync of the directory; a process killed
while writing leaves the previous file intact.

A checkpoint of several trainers is a main file (``meta`` only, naming its ``shards``) and one file per owner,
:func:`shard_path`, holding that owner's rows (ids ``owner, owner + world, ...``) of every table, in the same
layout (:mod:`dgl_oac.distributed.shards` writes and loads them); :meth:`CheckpointReader.table` reassembles a
table from them.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import struct
import sys
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import torch

from .engine.store import RowStore

MAGIC = b"DGLOACK1"
END = b"DGLOACND"
TRAILER = struct.Struct("<Q32s8s")  # footer length, sha256 of the footer, END
FORMAT = 1
CHUNK_BYTES = 64 << 20  # table rows move in chunks of this size (bounds the extra memory of save and load)
PathLike = Union[str, os.PathLike]


class CheckpointError(ValueError):
    """A checkpoint file that is truncated, corrupted, not a checkpoint, or does not fit the objects."""


def write_file(path: Path, meta: memoryview, tables: Sequence[Tuple[str, RowStore]]) -> None:
    """Write ``meta`` and each ``(name, store)``'s rows to ``path``, atomically."""
    tmp = path.with_name(path.name + ".tmp")  # one writer per path; a stale one from a killed run is replaced
    sections: List[Dict[str, Any]] = []
    try:
        with open(tmp, "wb") as f:
            f.write(MAGIC)
            _write_section(f, sections, "meta", [meta])
            for name, store in tables:
                _write_section(f, sections, f"table/{name}", _table_chunks(store))
            footer = json.dumps({"format": FORMAT, "byteorder": sys.byteorder, "sections": sections}).encode()
            f.write(footer)
            f.write(TRAILER.pack(len(footer), hashlib.sha256(footer).digest(), END))
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def _write_section(f: Any, sections: List[Dict[str, Any]], name: str, chunks: Any) -> None:
    h, start = hashlib.sha256(), f.tell()
    for chunk in chunks:
        h.update(chunk)
        f.write(chunk)
    sections.append({"name": name, "offset": start, "nbytes": f.tell() - start, "sha256": h.hexdigest()})


def shard_path(main: Path, checkpoint_id: str, owner: int, world: int) -> Path:
    """The file of owner ``owner``'s rows of checkpoint ``checkpoint_id`` (main file ``main``), of ``world``
    trainers."""
    return main.with_name(f"{main.name}.{checkpoint_id}.owner{owner}of{world}")


def _table_chunks(store: RowStore) -> Iterator[memoryview]:
    """The table's bytes, row-major, in chunks; a file-backed table is read from its file, not its map. A table
    whose rows are strided (an owner's rows of a shared table) is copied a chunk at a time."""
    rows_per = max(1, CHUNK_BYTES // (store.width * 4))
    if store.path is None:
        for lo in range(0, store.num_rows, rows_per):
            yield memoryview(store.table[lo:lo + rows_per].contiguous().numpy()).cast("B")
        return
    total = store.num_rows * store.width * 4
    buf = memoryview(bytearray(min(total, rows_per * store.width * 4)))
    with open(store.path, "rb", buffering=0) as src:
        done = 0
        while done < total:
            want = min(len(buf), total - done)
            got = src.readinto(buf[:want])
            if not got:
                raise CheckpointError(f"table file {store.path} is shorter than its {total:,} bytes")
            done += got
            yield buf[:got]


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class CheckpointReader:
    """Parse and check a checkpoint's structure on open; :meth:`verify` checks every section's sha256.

    The file stays open: a reader keeps reading the same file even if a newer checkpoint replaces its path."""

    def __init__(self, path: PathLike) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise FileNotFoundError(f"no checkpoint at {self.path}")
        self._file = open(self.path, "rb", buffering=0)
        try:
            self._parse(os.fstat(self._file.fileno()).st_size)
        except BaseException:
            self.close()
            raise
        self._meta: Optional[Dict[str, Any]] = None
        self.verified = False

    def close(self) -> None:
        """Close the file (idempotent)."""
        self._file.close()

    def __enter__(self) -> "CheckpointReader":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        if hasattr(self, "_file"):
            self._file.close()

    def _parse(self, size: int) -> None:
        f = self._file
        head = f.read(len(MAGIC))
        if head != MAGIC[:len(head)] or (head != MAGIC and size >= len(MAGIC)):
            raise CheckpointError(f"{self.path} is not a dgl-oac checkpoint (its first bytes are not {MAGIC!r})")
        if size < len(MAGIC) + TRAILER.size:
            raise CheckpointError(f"checkpoint {self.path} is truncated ({size} bytes)")
        f.seek(size - TRAILER.size)
        flen, fsha, end = TRAILER.unpack(f.read(TRAILER.size))
        if end != END:
            raise CheckpointError(f"checkpoint {self.path} is truncated or incomplete: no end marker "
                                  f"({size:,} bytes; was the writer killed or the copy cut short?)")
        self.footer_start = size - TRAILER.size - flen
        if flen > size or self.footer_start < len(MAGIC):
            raise CheckpointError(f"checkpoint {self.path} is corrupted: footer length {flen} does not fit "
                                  f"in {size:,} bytes")
        f.seek(self.footer_start)
        raw = f.read(flen)
        if hashlib.sha256(raw).digest() != fsha:
            raise CheckpointError(f"checkpoint {self.path} is corrupted: the footer's sha256 does not match")
        footer = json.loads(raw)
        if footer.get("format") != FORMAT:
            raise CheckpointError(f"checkpoint {self.path} has format {footer.get('format')}, this dgl-oac reads "
                                  f"format {FORMAT}")
        if footer["byteorder"] != sys.byteorder:
            raise CheckpointError(f"checkpoint {self.path} was written on a {footer['byteorder']}-endian machine")
        self.sections = {s["name"]: s for s in footer["sections"]}
        for s in footer["sections"]:
            if s["offset"] < len(MAGIC) or s["offset"] + s["nbytes"] > self.footer_start:
                raise CheckpointError(f"checkpoint {self.path} is corrupted: section {s['name']!r} lies outside "
                                      f"the payload")

    def _chunks(self, name: str) -> Iterator[memoryview]:
        s = self.sections[name]
        buf = memoryview(bytearray(min(CHUNK_BYTES, s["nbytes"]) or 1))
        pos, end = s["offset"], s["offset"] + s["nbytes"]
        while pos < end:
            got = os.preadv(self._file.fileno(), [buf[:min(len(buf), end - pos)]], pos)
            if not got:
                raise CheckpointError(f"checkpoint {self.path} is truncated inside section {name!r}")
            pos += got
            yield buf[:got]

    def verify(self) -> None:
        """Check every section's sha256 (reads the whole file once)."""
        for name, s in self.sections.items():
            h = hashlib.sha256()
            for chunk in self._chunks(name):
                h.update(chunk)
            if h.hexdigest() != s["sha256"]:
                raise CheckpointError(f"checkpoint {self.path} is corrupted: section {name!r} has sha256 "
                                      f"{h.hexdigest()[:16]}..., its footer says {s['sha256'][:16]}...")
        self.verified = True

    @property
    def meta(self) -> Dict[str, Any]:
        """The small state (everything but the tables), checksum-verified."""
        if self._meta is None:
            raw = b"".join(bytes(c) for c in self._chunks("meta"))
            if hashlib.sha256(raw).hexdigest() != self.sections["meta"]["sha256"]:
                raise CheckpointError(f"checkpoint {self.path} is corrupted: section 'meta' checksum mismatch")
            self._meta = torch.load(io.BytesIO(raw), map_location="cpu", weights_only=True)
        return self._meta

    def table_info(self, name: str) -> Dict[str, Any]:
        """``{"name", "num_rows", "dim", "state_width"}`` of the table ``name``; :class:`CheckpointError` naming
        the tables it holds when there is none by that name."""
        for info in self.meta["embeddings"]:
            if info["name"] == name:
                return info
        raise CheckpointError(f"checkpoint {self.path} holds no embedding {name!r} (it holds "
                              f"{[e['name'] for e in self.meta['embeddings']]})")

    def table(self, name: str) -> torch.Tensor:
        """The full rows ``float32[N, D + S]`` of embedding ``name``, in memory (for small tables and tests); a
        checkpoint of several trainers is read from its owners' shard files."""
        info = self.table_info(name)
        out = torch.empty(info["num_rows"], info["dim"] + info["state_width"], dtype=torch.float32)
        shards = self.meta.get("shards")
        if shards is None:
            self._read_into(name, out, None)
            return out
        world, lo = shards["world"], 0
        for owner in range(world):  # owners hold consecutive ranges of rows, in rank order
            with CheckpointReader(shard_path(self.path, shards["id"], owner, world)) as part:
                rows = out[lo:lo + part.table_info(name)["num_rows"]]
                part._read_into(name, rows, None)
                lo += rows.shape[0]
        return out

    def _read_into(self, name: str, table: torch.Tensor, file: Optional[Path]) -> None:
        """Copy section ``table/name`` into ``table`` (or with ``pwrite`` into ``file``, the table's own file)."""
        sec = f"table/{name}"
        if self.sections[sec]["nbytes"] != table.numel() * 4:
            raise CheckpointError(f"checkpoint {self.path}: section {sec!r} has {self.sections[sec]['nbytes']:,} "
                                  f"bytes, the table {table.numel() * 4:,}")
        if file is None:
            flat = memoryview(table.view(-1).numpy()).cast("B")
            pos = 0
            for chunk in self._chunks(sec):
                flat[pos:pos + len(chunk)] = chunk
                pos += len(chunk)
            return
        fd = os.open(file, os.O_WRONLY)
        try:
            pos = 0
            for chunk in self._chunks(sec):
                done = 0
                while done < len(chunk):
                    done += os.pwrite(fd, chunk[done:], pos + done)
                pos += len(chunk)
        finally:
            os.close(fd)
