"""Knowledge-graph triple files (FB15k-237, WN18RR, CoDEx, ...) -> KGDataset with contiguous ids.

Accepted layouts (``X`` = ``train``, ``valid``, ``test``; every file one ``head<TAB>relation<TAB>tail`` per
line, no header, CRLF tolerated):

* a folder with ``X.txt`` or ``X.txt.gz`` (CoDEx; optional ``valid_negatives``/``test_negatives``: verified
  false triples, returned as ``negatives["valid_false"]``/``["test_false"]``);
* a folder holding one ``*.tar.gz``/``*.tgz``/``*.tar`` whose members include ``X.txt`` (ConvE archives), or
  such an archive path itself.

Id order: entities are numbered in order of first appearance scanning train, then valid, then test (then the
negative files, if any), row by row, head before tail; relations likewise by first appearance. So ids are
deterministic and ``entity_names[i]`` / ``relation_names[r]`` give the original strings.
"""
from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Optional, Tuple, Union

import numpy as np
import pandas as pd
import torch

from ._files import ROOT_RULE, find_file, read_table, tar_members
from .errors import DatasetNotFoundError
from .types import KGDataset

HOW = ("FB15k-237/WN18RR archives come from github.com/TimDettmers/ConvE, CoDEx from "
       f"github.com/tsafavi/codex (data/triples/<name>): place them in <data root>/<name>/; {ROOT_RULE}")
SPLITS = ("train", "valid", "test")
NEGATIVES = ("valid_negatives", "test_negatives")
ARCHIVE_SUFFIXES = (".tar.gz", ".tgz", ".tar")
EXPECTED = "tab-separated head, relation, tail triples"


def _archive(folder: Path) -> Optional[Path]:
    hits = sorted(p for p in folder.iterdir() if p.is_file() and p.name.endswith(ARCHIVE_SUFFIXES))
    return hits[0] if hits else None


def is_kg_source(path: Path) -> bool:
    """True for a triple folder (``train.txt[.gz]`` or a triple archive) or an archive file."""
    if path.is_file():
        return path.name.endswith(ARCHIVE_SUFFIXES)
    return find_file(path, ["train.txt"]) is not None or _archive(path) is not None


def _read_sources(path: Path) -> Dict[str, Tuple[Union[bytes, Path], Path]]:
    """split name -> (content or file, path for messages); train/valid/test required, negatives optional."""
    archive = path if path.is_file() else (None if find_file(path, ["train.txt"]) else _archive(path))
    out: Dict[str, Tuple[Union[bytes, Path], Path]] = {}
    if archive is not None:
        names = [f"{s}.txt" for s in SPLITS + NEGATIVES]
        for key, data in zip(SPLITS + NEGATIVES, tar_members(archive, names, f"a tar of {EXPECTED}", HOW)):
            if data is not None:
                out[key] = (data, archive / f"{key}.txt")
    else:
        for key in SPLITS + NEGATIVES:
            found = find_file(path, [f"{key}.txt"])
            if found is not None:
                out[key] = (found, found)
    missing = [s for s in SPLITS if s not in out]
    if missing:
        where = archive if archive is not None else path
        raise DatasetNotFoundError(f"{where}: missing {', '.join(m + '.txt' for m in missing)} "
                                   f"(expected {EXPECTED} for train, valid and test). {HOW}")
    return out


def encode(tables: List[np.ndarray]) -> Tuple[List[np.ndarray], List[str], List[str]]:
    """str[T_i,3] tables -> (int64[T_i,3] tables, entity names, relation names), ids by first appearance."""
    allrows = np.concatenate(tables) if tables else np.empty((0, 3), dtype=object)
    # Row-major (h0, t0, h1, t1, ...) so codes follow first appearance, head before tail.
    ent_codes, ent_names = pd.factorize(allrows[:, [0, 2]].ravel(), sort=False)
    rel_codes, rel_names = pd.factorize(allrows[:, 1], sort=False)
    codes = np.stack([ent_codes[0::2], rel_codes, ent_codes[1::2]], axis=1).astype(np.int64)
    bounds = np.cumsum([len(t) for t in tables])[:-1]
    return np.split(codes, bounds), [str(e) for e in ent_names], [str(r) for r in rel_names]


def load_kg(path: Path, name: Optional[str] = None) -> KGDataset:
    """Load a triple folder or archive (see module docstring) as a KGDataset."""
    sources = _read_sources(path)
    keys = [k for k in SPLITS + NEGATIVES if k in sources]
    tables = []
    for key in keys:
        data, where = sources[key]
        df = read_table(data, "\t", 3, where, EXPECTED, HOW)
        # Strip stray whitespace (CRLF files, trailing blanks) so "a\r" and "a" are the same entity.
        tables.append(np.stack([df[c].str.strip().to_numpy(dtype=object) for c in df.columns], axis=1))
    encoded, ent_names, rel_names = encode(tables)
    parts = {k: torch.from_numpy(t) for k, t in zip(keys, encoded)}
    negatives = {f"{k.split('_')[0]}_false": parts[k] for k in NEGATIVES if k in parts} or None
    base = path.name
    for suffix in ARCHIVE_SUFFIXES:
        base = base[: -len(suffix)] if base.endswith(suffix) else base
    return KGDataset(
        name=name or base, num_entities=len(ent_names), num_relations=len(rel_names),
        train=parts["train"], valid=parts["valid"], test=parts["test"],
        entity_names=ent_names, relation_names=rel_names,
        negatives=negatives)
