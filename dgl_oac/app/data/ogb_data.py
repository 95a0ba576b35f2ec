"""OGB datasets through the ``ogb`` package's own DGL loaders, never downloading and never prompting.

``ogb`` looks for ``<root>/<name with - as _>[_dgl]/`` and (a) asks on stdin whether to delete the folder
when ``RELEASE_v<version>.txt`` (version from its ``master.csv``) is absent, (b) downloads when neither
``processed/dgl_data_processed`` nor ``raw/edge.csv.gz`` (``raw/data.npz`` for binary sets) exists. Both are
checked here first, so a missing or incomplete folder raises :class:`DatasetNotFoundError` /
:class:`DatasetFormatError` telling how to fetch it (``scripts/prepare_ogb.py NAME --root ROOT`` on a
machine with internet). A dataset is looked for in the data root (:func:`~dgl_oac.app.data.data_root`:
``root``, else ``$DGL_OAC_DATA``, else ``../shared/data``), as ``<root>/<name>/<name with _>/`` (the shared data's
layout) or ``<root>/<name with _>/`` (ogb's, as ``prepare_ogb.py --root`` writes it). On first load ``ogb`` writes ``processed/`` inside
the folder it reads: so it is given a working copy, a folder in the cache (:func:`ogb_cache`) of symbolic
links to the dataset's files, and the dataset folder itself (``../shared/data``, a read-only mount, a
colleague's download) is never written to.
``ogb``'s progress prints go to stderr, keeping stdout clean.

Mapping: ``ogbn-*`` -> NodeDataset (labels squeezed to int64[N]; NaN labels of ogbn-papers100M -> -1),
``ogbl-*`` link sets -> LinkDataset (citation2 ``source_node/target_node/target_node_neg``, or collab/ppa/ddi
``edge``/``edge_neg``), ``KG completion`` sets (ogbl-wikikg2) -> KGDataset (``head_neg``/``tail_neg`` kept
in ``negatives``). Heterogeneous sets (ogbn-mag, ogbl-biokg) are not supported.
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import sys
import warnings
from functools import lru_cache
from pathlib import Path
from typing import Any, Dict, Iterator, Optional

import numpy as np
import pandas as pd
import torch
from packaging.version import Version

from ...needs_dgl import require_dgl
from ._files import PathLike, data_root, reading, where
from ._graphs import as_long
from .errors import DatasetFormatError, DatasetNotFoundError
from .types import Dataset, KGDataset, LinkDataset, NodeDataset

try:  # numpy >= 2 moved the pickle helpers; files written under numpy 1 still name numpy.core.*
    from numpy._core import multiarray as _multiarray
except ImportError:  # pragma: no cover - numpy < 2
    from numpy.core import multiarray as _multiarray

# What ogb's split .pt files pickle besides tensors: numpy arrays (torch.load is weights_only by default).
_NUMPY_GLOBALS = [np.ndarray, np.dtype, _multiarray._reconstruct, _multiarray.scalar,
                  (_multiarray._reconstruct, "numpy.core.multiarray._reconstruct"),
                  (_multiarray.scalar, "numpy.core.multiarray.scalar")]
_NUMPY_GLOBALS += [getattr(np.dtypes, n) for n in dir(np.dtypes) if n.endswith("DType")]


def ogb_root(root: Optional[PathLike] = None, name: Optional[str] = None) -> Path:
    """The root ogb reads dataset ``name`` (canonical) from: ``<data root>/<name>`` when that holds ogb's folder
    (as ``../shared/data/ogbl-ddi/ogbl_ddi``), else the data root itself (:func:`data_root` of ``root``)."""
    base = data_root(root)
    if name is not None and dataset_dir(name, base / name).is_dir():
        return base / name
    return base


def ogb_cache() -> Path:
    """Where ogb's processed files go: ``$XDG_CACHE_HOME/dgl_oac/ogb`` (``~/.cache/dgl_oac/ogb``)."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base).expanduser() / "dgl_oac" / "ogb"


def _working_root(folder: Path) -> Path:
    """An ogb root whose dataset folder links every entry of ``folder`` but ``processed/``, which ogb then
    writes there. One per source folder (keyed by its resolved path); a processed file the source already has
    is linked too, and ogb only reads it."""
    source = folder.resolve()
    work = ogb_cache() / hashlib.sha256(str(source).encode()).hexdigest()[:16]
    target = work / folder.name
    target.mkdir(parents=True, exist_ok=True)
    for entry in source.iterdir():
        link = target / entry.name
        if entry.name == "processed" and not (entry / "dgl_data_processed").exists():
            continue
        if not link.exists() and not link.is_symlink():
            link.symlink_to(entry, target_is_directory=entry.is_dir())
    return work


@lru_cache(maxsize=1)
def _masters() -> Dict[str, pd.Series]:
    """Canonical OGB name -> its ``master.csv`` column (node and link property prediction)."""
    import ogb.linkproppred
    import ogb.nodeproppred

    out: Dict[str, pd.Series] = {}
    for mod in (ogb.nodeproppred, ogb.linkproppred):
        master = pd.read_csv(Path(mod.__file__).parent / "master.csv", index_col=0, keep_default_na=False)
        out.update({col: master[col] for col in master.columns})
    return out


def ogb_names() -> Dict[str, str]:
    """lower-case name -> canonical OGB name, for every name ogb's ``master.csv`` files know."""
    return {name.lower(): name for name in _masters()}


def _how(name: str, data: Path) -> str:
    folder = name.replace("-", "_")
    return (f"Nothing is downloaded at training time: on a machine with internet run "
            f"`python scripts/prepare_ogb.py {name} --root DIR` and copy DIR/{folder} to {data / name}/. "
            f"{where(data)}")


def dataset_dir(name: str, root: Path) -> Path:
    """The folder ogb will read: ``<root>/<name_with_underscores>`` or its ``_dgl`` twin when that exists."""
    base = root / name.replace("-", "_")
    dgl_twin = base.with_name(base.name + "_dgl")
    return dgl_twin if dgl_twin.exists() else base


def _precheck(name: str, root: Path, meta: pd.Series, how: str) -> Path:
    """Refuse every state in which ogb would prompt on stdin or start a download."""
    folder = dataset_dir(name, root)
    if meta["is hetero"] == "True":
        raise ValueError(f"{name} is a heterogeneous OGB dataset; dgl_oac.app.data supports homogeneous ones")
    if not folder.is_dir():
        raise DatasetNotFoundError(f"{folder}: OGB dataset {name} not found (nor {root / name / folder.name}). "
                                   f"{how}")
    release = folder / f"RELEASE_v{meta['version']}.txt"
    if not release.exists():
        raise DatasetFormatError(f"{release}: missing, so {folder} is not a complete v{meta['version']} "
                                 f"download of {name} (ogb would ask to delete it). {how}")
    raw = folder / "raw" / ("data.npz" if meta["binary"] == "True" else "edge.csv.gz")
    if not (folder / "processed" / "dgl_data_processed").exists() and not raw.exists():
        raise DatasetNotFoundError(f"{folder}: neither processed/dgl_data_processed nor {raw} exists. {how}")
    split = folder / "split" / meta["split"]
    if not split.is_dir():
        raise DatasetNotFoundError(f"{split}: split folder missing for {name}. {how}")
    return folder


def _numpy_allowed() -> Any:
    """Allow numpy arrays in ``torch.load`` while ogb reads: needed from torch 2.6 (weights_only by default),
    where ``torch.serialization.safe_globals`` exists; older torch loads them as they are."""
    allow = getattr(torch.serialization, "safe_globals", None)
    default_safe = Version(torch.__version__.split("+")[0]).release >= (2, 6)
    return allow(_NUMPY_GLOBALS) if allow is not None and default_safe else contextlib.nullcontext()


@contextlib.contextmanager
def _ogb_io(folder: Path, name: str, how: str) -> Iterator[None]:
    """ogb's prints -> stderr; numpy arrays allowed in split ``.pt`` files; failures -> DatasetFormatError.
    ogb's loaders are DGL's (``Dgl*PropPredDataset``): DGL is required first."""
    require_dgl(f"reading OGB dataset {name}")
    import dgl

    with reading(folder, f"the OGB layout of {name}", how), warnings.catch_warnings(), \
            contextlib.redirect_stdout(sys.stderr), _numpy_allowed():
        # ogb wraps read-only arrays from dgl's loader; it never writes to them.
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        try:
            yield
        except (RuntimeError, dgl.DGLError) as exc:  # ogb's "No necessary file", torch's corrupt archives
            raise DatasetFormatError(f"{folder}: could not read OGB dataset {name} ({exc}). {how}") from exc


def _node(name: str, root: Path, folder: Path, how: str) -> NodeDataset:
    from ogb.nodeproppred import DglNodePropPredDataset

    with _ogb_io(folder, name, how):
        ds = DglNodePropPredDataset(name=name, root=str(root))
        graph, labels = ds[0]
        split = ds.get_idx_split()
    if labels.is_floating_point():  # papers100M: NaN marks unlabelled nodes
        labels = torch.nan_to_num(labels, nan=-1.0)
    labels = as_long(labels)
    labels = labels.squeeze(1) if labels.dim() == 2 and labels.shape[1] == 1 else labels
    feats = graph.ndata.get("feat")
    return NodeDataset(name=name, graph=graph.long(), labels=labels, num_classes=int(ds.num_classes),
                       train_idx=as_long(split["train"]), valid_idx=as_long(split["valid"]),
                       test_idx=as_long(split["test"]),
                       features=feats.float() if feats is not None else None, ogb_name=name)


def _pairs(part: Dict[str, object], a: str, b: str) -> torch.Tensor:
    return torch.stack([as_long(part[a]), as_long(part[b])], dim=1)


def _link(name: str, root: Path, folder: Path, how: str) -> Dataset:
    from ogb.linkproppred import DglLinkPropPredDataset

    with _ogb_io(folder, name, how):
        ds = DglLinkPropPredDataset(name=name, root=str(root))
        graph = ds[0].long()
        split = ds.get_edge_split()
    train, valid, test = split["train"], split["valid"], split["test"]
    if _masters()[name]["task type"] == "KG completion":
        return _kg(name, graph, train, valid, test)
    feats = graph.ndata.get("feat")
    feats = feats.float() if feats is not None else None
    if "source_node" in train:  # citation2 style: per-positive negative tails
        def neg(p: Dict[str, object]) -> Optional[torch.Tensor]:
            return as_long(p["target_node_neg"]) if "target_node_neg" in p else None

        return LinkDataset(name=name, graph=graph, train_edges=_pairs(train, "source_node", "target_node"),
                           valid_edges=_pairs(valid, "source_node", "target_node"),
                           test_edges=_pairs(test, "source_node", "target_node"),
                           valid_neg=neg(valid), test_neg=neg(test), features=feats, ogb_name=name)
    if "edge" not in train:
        raise DatasetFormatError(f"{folder}: split holds keys {sorted(train)}, expected source_node/"
                                 f"target_node or edge. {how}")

    def neg_edges(p: Dict[str, object]) -> Optional[torch.Tensor]:
        return as_long(p["edge_neg"]) if "edge_neg" in p else None

    return LinkDataset(name=name, graph=graph, train_edges=as_long(train["edge"]),
                       valid_edges=as_long(valid["edge"]), test_edges=as_long(test["edge"]),
                       features=feats, ogb_name=name, valid_neg_edges=neg_edges(valid),
                       test_neg_edges=neg_edges(test))


def _kg(name: str, graph, train, valid, test) -> KGDataset:
    def triples(p: Dict[str, object]) -> torch.Tensor:
        return torch.stack([as_long(p["head"]), as_long(p["relation"]), as_long(p["tail"])], dim=1)

    parts = [triples(p) for p in (train, valid, test)]
    negatives = {f"{s}_{k}": as_long(p[k]) for s, p in (("valid", valid), ("test", test))
                 for k in ("head_neg", "tail_neg") if k in p}
    num_rel = int(max(int(t[:, 1].max()) + 1 if t.numel() else 0 for t in parts))
    num_ent = graph.num_nodes()
    return KGDataset(name=name, num_entities=num_ent, num_relations=num_rel, train=parts[0],
                     valid=parts[1], test=parts[2], ogb_name=name,
                     negatives=negatives or None)


def load_ogb(name: str, root: Optional[PathLike] = None) -> Dataset:
    """Load OGB dataset ``name`` (any spelling case) from ``root`` (see :func:`ogb_root`)."""
    canonical = ogb_names().get(name.lower())
    if canonical is None:
        raise ValueError(f"unknown OGB dataset {name!r}; known: {', '.join(sorted(_masters()))}")
    how = _how(canonical, data_root(root))
    folder = _precheck(canonical, ogb_root(root, canonical), _masters()[canonical], how)
    work = _working_root(folder)
    if canonical.startswith("ogbn-"):
        return _node(canonical, work, work / folder.name, how)
    return _link(canonical, work, work / folder.name, how)
