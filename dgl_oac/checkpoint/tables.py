"""A checkpoint's tables through ``torch.distributed.checkpoint`` (DCP): each rank writes its own rows, any number
of ranks reads them back (resharding; which rows, and how they move: :mod:`dgl_oac.checkpoint.rows`).

A folder per checkpoint: one DCP file per chunk of a rank's rows (``__<rank>_<k>.distcp``, written and fsynced one
at a time: DCP keeps a file's tensors until the file is closed) and DCP's ``.metadata`` (rank 0: every chunk's
offset and file). DCP's collectives run on the tables' gloo group, never on the default group, which may refuse
CPU tensors (NCCL, ``cuda:gloo``).

Integrity: DCP keeps no checksums. :func:`save_tables` returns the sha256 of every file (the main file records
them, :mod:`dgl_oac.checkpoint.file`) and :func:`check_files` verifies the files a rank is about to read, naming
the file and the rank that wrote it, before anything is loaded. DCP's ``.metadata`` is a pickle: it is read only
after its sha256 matched, by an unpickler that builds DCP's metadata classes and nothing else (a checkpoint never
runs code).
"""
from __future__ import annotations

import hashlib
import pickle
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Set

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import Metadata
from torch.distributed.checkpoint.planner import SavePlan, SavePlanner

from ..distributed.group import Group
from .rows import (CheckpointError, RowBlock, TableLoadPlanner, TableSavePlanner, load_target, own_rows,
                   read_items)

if TYPE_CHECKING:
    from ..embedding import NodeEmbedding

METADATA = ".metadata"  # DCP's own file


class _Writer(dcp.FileSystemWriter):
    """DCP's writer, one file per chunk, every file fsynced; remembers the files this rank wrote."""

    def __init__(self, folder: Path) -> None:
        super().__init__(folder, single_file_per_rank=False, sync_files=True, overwrite=False)
        self.written: Set[str] = set()

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Any:
        done = super().write_data(plan, planner)
        self.written = {r.storage_data.relative_path for r in done.value()}
        return done


class _Reader(dcp.FileSystemReader):
    """DCP's reader, with the metadata read by :func:`read_metadata`."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        return read_metadata(Path(self.path))


_METADATA_CLASSES = {("torch.distributed.checkpoint.metadata", n) for n in (
    "Metadata", "TensorStorageMetadata", "BytesStorageMetadata", "ChunkStorageMetadata", "TensorProperties",
    "_MEM_FORMAT_ENCODING", "MetadataIndex", "StorageMeta")} | {
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"), ("torch", "Size"),
    ("torch.serialization", "_get_layout")} | {
    (module, name) for module in ("pathlib", "pathlib._local")  # PosixPath's module from Python 3.13 on
    for name in ("PosixPath", "WindowsPath")}


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _METADATA_CLASSES or (module == "torch" and isinstance(getattr(torch, name, None),
                                                                                   torch.dtype)):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"{module}.{name} is not part of DCP's metadata")


def read_metadata(folder: Path) -> Metadata:
    """DCP's ``.metadata`` of ``folder``, built from DCP's metadata classes only."""
    try:
        with open(folder / METADATA, "rb") as f:
            md = _MetadataUnpickler(f).load()
    except FileNotFoundError:
        raise CheckpointError(f"the checkpoint's tables folder {folder} has no {METADATA} (every machine must see "
                              f"the checkpoint's folder)") from None
    except Exception as exc:  # noqa: BLE001 - any unpickling failure is a damaged file
        raise CheckpointError(f"{folder / METADATA} is not DCP metadata: {type(exc).__name__}: {exc}") from None
    if not isinstance(md, Metadata):
        raise CheckpointError(f"{folder / METADATA} is not DCP metadata (it holds a {type(md).__name__})")
    return md


def file_sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _run(fn: Callable[..., Any], group: Optional[Group], what: str, **kwargs: Any) -> Any:
    """``fn`` (``dcp.save`` or ``dcp.load``) on the table group (its gloo group: DCP's collectives carry CPU
    objects, which a CUDA default group refuses), or in this process alone. DCP makes every rank raise when one
    fails; this rank re-raises its own error, or names the ranks that failed."""
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            return fn({}, process_group=None if group is None else group.group, no_dist=group is None, **kwargs)
    except CheckpointException as exc:
        rank = 0 if group is None else group.rank
        if rank in exc.failures:
            raise exc.failures[rank][0] from None
        first = next(iter(exc.failures.values()))[0]
        raise CheckpointError(f"{what} failed on rank(s) {sorted(exc.failures)} ({type(first).__name__}: {first}); "
                              f"rank {rank} stops too") from None


def save_tables(folder: Path, embs: "List[NodeEmbedding]", group: Optional[Group]) -> Dict[str, Dict[str, Any]]:
    """Collective: every rank's rows of every table of ``embs`` into the new folder ``folder``. Returns, on every
    rank, ``{file: {"sha256", "rank"}}`` for every file of the folder (``rank``: the one that wrote it)."""
    writer = _Writer(folder)
    _run(dcp.save, group, "checkpoint: writing the tables", storage_writer=writer,
         planner=TableSavePlanner([own_rows(e) for e in embs]))
    rank = 0 if group is None else group.rank
    mine = {f: {"sha256": file_sha256(folder / f), "rank": rank} for f in sorted(writer.written)}
    if rank == 0:
        mine[METADATA] = {"sha256": file_sha256(folder / METADATA), "rank": 0}
    files = {}
    for part in ([mine] if group is None else group.all_gather_object(mine, "checkpoint: the files' sha256")):
        files.update(part)
    return files


def check_files(folder: Path, files: Dict[str, Dict[str, Any]], embs: "List[NodeEmbedding]",
                group: Optional[Group], where: str) -> None:
    """Verify DCP's metadata and every file holding rows this rank is about to load; :class:`CheckpointError`
    naming the file and its writer if one is missing or its sha256 is not the one the main file records."""
    check_file(folder, METADATA, files, where)
    md = read_metadata(folder)
    need = {md.storage_data[item.storage_index].relative_path
            for e in embs for item in read_items(md, load_target(e, group))}
    for name in sorted(need):
        check_file(folder, name, files, where)


def check_file(folder: Path, name: str, files: Dict[str, Dict[str, Any]], where: str) -> None:
    record = files.get(name)
    if record is None:
        raise CheckpointError(f"{where}: {folder.name}/{name} is not among the files its main file records")
    path = folder / name
    if not path.is_file():
        raise CheckpointError(f"{where}: {folder.name}/{name}, written by rank {record['rank']}, is missing (every "
                              f"machine must see the checkpoint's folder)")
    got = file_sha256(path)
    if got != record["sha256"]:
        raise CheckpointError(f"{where}: {folder.name}/{name}, written by rank {record['rank']}, is corrupted: its "
                              f"sha256 is {got[:16]}..., the main file records {record['sha256'][:16]}...")


def load_tables(folder: Path, embs: "List[NodeEmbedding]", group: Optional[Group]) -> None:
    """Collective: each rank's range of rows of every table of ``embs``
    (:func:`~dgl_oac.checkpoint.rows.load_target`) from ``folder``; when it returns, every rank's rows are in place."""
    _run(dcp.load, group, "checkpoint: reading the tables", storage_reader=_Reader(folder),
         planner=TableLoadPlanner([load_target(e, group) for e in embs]))


def read_table(folder: Path, name: str, num_rows: int, width: int) -> torch.Tensor:
    """The whole table ``name``, ``float32[num_rows, width]``, in this process's memory (tests, small tables)."""
    out = torch.empty(num_rows, width)
    _run(dcp.load, None, f"reading table {name!r}", storage_reader=_Reader(folder),
         planner=TableLoadPlanner([RowBlock(name, num_rows, 0, out, None)]))
    return out
