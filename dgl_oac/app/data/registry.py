"""Name and path resolution behind :func:`dgl_oac.app.data.load`.

Order: ``"synthetic"``, ``"synthetic-mag"`` -> generators; an OGB name (any case) -> ``ogb``; a known shared-data name (any case,
``_`` or ``-``) -> ``<data root>/<folder>``; otherwise an existing path, whose format is sniffed from its
contents; otherwise :class:`ValueError` listing the known names. ``os.PathLike`` arguments are always paths.
"""
from __future__ import annotations

import inspect
import os
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

from ._files import PathLike, data_root, where
from .csv_edges import is_csv_edges_folder, load_csv_edges
from .errors import DatasetFormatError, DatasetNotFoundError
from .kg import ARCHIVE_SUFFIXES, is_kg_source, load_kg
from .npz import load_npz
from .ogb_data import load_ogb, ogb_names
from .planetoid import load_planetoid, planetoid_prefix
from .synthetic import generate
from .synthetic_mag import generate_mag
from .types import Dataset

LOADERS: Dict[str, Callable[..., Dataset]] = {
    "planetoid": load_planetoid, "npz": load_npz, "csv_edges": load_csv_edges, "kg": load_kg,
}
# Lower-case name -> (folder under the data root, format, where the files come from).
SHARED: Dict[str, Tuple[str, str, str]] = {
    "cora": ("cora", "planetoid", "github.com/kimiyoung/planetoid data/ind.cora.*"),
    "pubmed": ("pubmed", "planetoid", "github.com/kimiyoung/planetoid data/ind.pubmed.*"),
    "coauthor-physics": ("coauthor-physics", "npz",
                         "github.com/EdisonLeeeee/GraphData datasets/coauthor_phy.npz"),
    "github-social": ("github-social", "csv_edges",
                      "github.com/benedekrozemberczki/karateclub dataset/node_level/github/"),
    "fb15k-237": ("FB15k-237", "kg", "github.com/TimDettmers/ConvE FB15k-237.tar.gz"),
    "wn18rr": ("WN18RR", "kg", "github.com/TimDettmers/ConvE WN18RR.tar.gz"),
    "codex-m": ("codex-m", "kg", "github.com/tsafavi/codex data/triples/codex-m/"),
}
LAYOUTS = ("a Planetoid folder (ind.<name>.graph, ...), an OGB dataset folder (RELEASE_v*.txt + raw/ or "
           "processed/), a folder with edges.csv[.gz] + target.csv[.gz], a triple folder (train/valid/test"
           ".txt[.gz]) or triple archive (*.tar.gz), or a .npz file / folder with one .npz")


def _key(name: str) -> str:
    return name.strip().lower().replace("_", "-")


def known_names() -> List[str]:
    """Every bare name :func:`load` accepts (synthetic, the shared datasets, every OGB name)."""
    return ["synthetic", "synthetic-mag"] + [v[0] for v in SHARED.values()] + sorted(ogb_names().values())


def _call(loader: Callable[..., Dataset], path: Path, name: Optional[str], kwargs: Dict[str, Any]) -> Dataset:
    # seed only matters where a split is drawn; datasets with a shipped split accept and ignore it, so a
    # caller (the CLI) can pass one uniformly.
    if "seed" in kwargs and "seed" not in inspect.signature(loader).parameters:
        kwargs = {k: v for k, v in kwargs.items() if k != "seed"}
    return loader(path, name=name, **kwargs)


def _child(root: Path, folder: str) -> Path:
    """``root/folder``, matched case-insensitively when the exact spelling is absent."""
    exact = root / folder
    if exact.exists() or not root.is_dir():
        return exact
    return next((p for p in root.iterdir() if p.name.lower() == folder.lower()), exact)


def sniff(path: Path) -> str:
    """Format of an existing path: one of ``LOADERS`` keys or ``"ogb"``; DatasetFormatError otherwise."""
    if path.is_file():
        if path.name.endswith(".npz"):
            return "npz"
        if path.name.endswith(ARCHIVE_SUFFIXES):
            return "kg"
    elif path.is_dir():
        if planetoid_prefix(path) is not None:
            return "planetoid"
        if any(path.glob("RELEASE_v*.txt")):
            return "ogb"
        if is_csv_edges_folder(path):
            return "csv_edges"
        if is_kg_source(path):
            return "kg"
        if any(path.glob("*.npz")):
            return "npz"
    raise DatasetFormatError(f"{path}: not a recognised dataset; expected {LAYOUTS}")


def _load_ogb_folder(path: Path, kwargs: Dict[str, Any]) -> Dataset:
    base = path.name[: -len("_dgl")] if path.name.endswith("_dgl") else path.name
    name = ogb_names().get(_key(base))
    if name is None:
        raise DatasetFormatError(f"{path}: has a RELEASE_v*.txt but its name is no OGB dataset "
                                 f"(expected a folder such as ogbn_arxiv or ogbl_citation2)")
    kwargs.pop("seed", None)
    return load_ogb(name, root=path.parent, **kwargs)


def load_path(path: PathLike, **kwargs: Any) -> Dataset:
    """Load a dataset from a file or folder, detecting its format (see ``LAYOUTS``)."""
    path = Path(path).expanduser().absolute()  # messages should name a path valid from anywhere
    if not path.exists():
        raise DatasetNotFoundError(f"{path}: no such file or directory; expected {LAYOUTS}")
    kind = sniff(path)
    if kind == "ogb":
        return _load_ogb_folder(path, dict(kwargs))
    return _call(LOADERS[kind], path, None, kwargs)


def load(name_or_dir: Union[str, "os.PathLike[str]"], root: Optional[PathLike] = None,
         **kwargs: Any) -> Dataset:
    """Load a dataset by name or path; see the package docstring for names, kwargs and returned types."""
    if not isinstance(name_or_dir, str):
        return load_path(name_or_dir, **kwargs)
    key = _key(name_or_dir)
    if key == "synthetic":
        return generate(**kwargs)  # root is meaningless for generated data
    if key == "synthetic-mag":
        return generate_mag(**kwargs)
    if key in ogb_names():
        kwargs.pop("seed", None)  # OGB ships its splits
        return load_ogb(name_or_dir, root=root, **kwargs)
    if key in SHARED:
        folder_name, kind, source = SHARED[key]
        base = data_root(root)
        folder = _child(base, folder_name)
        if not folder.exists():
            raise DatasetNotFoundError(f"{folder}: dataset {folder_name} not found. Get it from {source} and place "
                                       f"the files in {folder}. {where(base)}")
        return _call(LOADERS[kind], folder, folder_name, kwargs)
    path = Path(name_or_dir).expanduser()
    if path.exists() or os.sep in name_or_dir or name_or_dir.startswith((".", "~")):
        return load_path(path, **kwargs)
    raise ValueError(f"unknown dataset {name_or_dir!r}: expected a directory path or one of "
                     f"{', '.join(known_names())}")


__all__ = ["load", "load_path", "known_names", "sniff", "SHARED"]
