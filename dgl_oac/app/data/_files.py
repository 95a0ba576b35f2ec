"""File access shared by the loaders: data-root resolution, gz-transparent lookup, and error translation.

Every loader reads through :func:`reading`, so a truncated gzip, a bad pickle or a wrong column count
surfaces as :class:`DatasetFormatError` naming the file, what was expected and how to obtain it.
"""
from __future__ import annotations

import contextlib
import io
import os
import pickle
import tarfile
import zipfile
import zlib
from pathlib import Path
from typing import Iterator, List, Optional, Sequence, Union

import numpy as np
import pandas as pd

from .errors import DatasetFormatError, DatasetNotFoundError

PathLike = Union[str, "os.PathLike[str]"]

DATA_ENV = "DGL_OAC_DATA"
# <repo>/dgl_oac/app/data/_files.py -> parents[3] is the repository root; shared data sits beside the checkout.
_DEFAULT_DATA_ROOT = Path(__file__).resolve().parents[3] / ".." / "shared" / "data"
#: the one rule for where every named dataset is looked for, as messages and docs say it
ROOT_RULE = (f"the data root is --root DIR (Python: root=DIR), else ${DATA_ENV}, else ../shared/data beside "
             f"the checkout")


def data_root(root: Optional[PathLike] = None) -> Path:
    """The data root, where every named dataset (shared files and OGB) is looked for: ``root``, else env
    ``DGL_OAC_DATA``, else ``<repo>/../shared/data`` (:data:`ROOT_RULE`)."""
    if root is not None:
        return Path(root).expanduser()
    env = os.environ.get(DATA_ENV)
    return Path(env).expanduser() if env else _DEFAULT_DATA_ROOT.resolve()


def where(base: Path) -> str:
    """The end of a not-found message: which data root was looked in and how to point at another."""
    return f"Looked in the data root {base}; {ROOT_RULE}."


def find_file(folder: Path, names: Sequence[str]) -> Optional[Path]:
    """First existing ``folder/name`` or ``folder/name.gz`` (sources are shipped plain or gzip-compressed)."""
    for name in names:
        for cand in (folder / name, folder / (name + ".gz")):
            if cand.is_file():
                return cand
    return None


def require_file(folder: Path, names: Sequence[str], what: str, how: str) -> Path:
    """Like :func:`find_file` but raises :class:`DatasetNotFoundError` listing the names tried."""
    found = find_file(folder, names)
    if found is None:
        tried = ", ".join(f"{n}[.gz]" for n in names)
        raise DatasetNotFoundError(f"{folder}: no {what} file found (looked for {tried}). {how}")
    return found


# Exceptions that mean "this file is damaged or not in the expected format" (never FileNotFoundError).
_FORMAT_EXCEPTIONS = (
    EOFError, zlib.error, pickle.UnpicklingError, tarfile.TarError, zipfile.BadZipFile, UnicodeDecodeError,
    ValueError, KeyError, IndexError, TypeError, AttributeError, OSError, pd.errors.ParserError,
)


@contextlib.contextmanager
def reading(path: PathLike, expected: str, how: str = "") -> Iterator[None]:
    """Turn parse failures inside the block into :class:`DatasetFormatError` naming ``path``."""
    try:
        yield
    except (DatasetFormatError, DatasetNotFoundError):
        raise
    except FileNotFoundError as exc:
        raise DatasetNotFoundError(f"{path}: missing ({exc}); expected {expected}. {how}".rstrip()) from exc
    except _FORMAT_EXCEPTIONS as exc:
        msg = f"{path}: malformed or truncated, expected {expected} ({type(exc).__name__}: {exc}). {how}"
        raise DatasetFormatError(msg.rstrip()) from exc


def format_error(path: PathLike, problem: str, how: str = "") -> DatasetFormatError:
    return DatasetFormatError(f"{path}: {problem}. {how}".rstrip())


def read_bytes(path: Path) -> bytes:
    """Whole file, gunzipped when it ends in ``.gz`` (fully read, so truncation is detected here)."""
    import gzip

    with open(path, "rb") as f:
        raw = f.read()
    return gzip.decompress(raw) if path.name.endswith(".gz") else raw


def read_table(data: Union[bytes, Path], sep: str, ncols: int, source: PathLike, expected: str,
               how: str = "", header: Optional[int] = None, dtype: object = str) -> pd.DataFrame:
    """Parse a delimited table with exactly ``ncols`` non-empty columns; returns all-str or typed frame."""
    with reading(source, expected, how):
        raw = read_bytes(data) if isinstance(data, Path) else data
        # na_filter=False and QUOTE_NONE: entity names such as "NA" or ones holding quotes stay verbatim.
        df = pd.read_csv(io.BytesIO(raw), sep=sep, header=header, dtype=dtype, na_filter=False,
                         quoting=3, engine="c", skip_blank_lines=True)
    if df.shape[1] != ncols:
        raise format_error(source, f"expected {expected} with {ncols} columns, found {df.shape[1]}", how)
    if dtype is str and len(df) and (df == "").to_numpy().any():
        row = int(np.flatnonzero((df == "").to_numpy().any(axis=1))[0])
        raise format_error(source, f"row {row} has an empty field (expected {expected})", how)
    return df


def read_pickle(path: Path, expected: str, how: str = "") -> object:
    """Python-2 era pickle (Planetoid) -> object; ``latin1`` decodes its numpy/scipy byte strings."""
    with reading(path, expected, how), open(path, "rb") as f:
        return pickle.load(f, encoding="latin1")


def tar_members(path: Path, names: Sequence[str], expected: str, how: str = "") -> List[Optional[bytes]]:
    """Contents of the members whose basename is in ``names`` (``None`` where absent), in that order."""
    out: List[Optional[bytes]] = [None] * len(names)
    with reading(path, expected, how), tarfile.open(path) as tar:
        for member in tar.getmembers():
            base = member.name.rsplit("/", 1)[-1]
            if member.isfile() and base in names:
                fobj = tar.extractfile(member)
                if fobj is None:  # isfile() members always extract; a broken archive would not
                    raise ValueError(f"{path}: cannot read member {member.name!r}")
                out[list(names).index(base)] = fobj.read()
    return out
