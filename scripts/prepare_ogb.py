#!/usr/bin/env python
"""Download and pre-process OGB datasets into a root that ``dgl_oac.app.data.load`` reads offline.

Run on a machine with internet, then copy ROOT to the training machine as its data root (``--root ROOT``,
``load(name, root=ROOT)``, or ``DGL_OAC_DATA=ROOT``; docs/guides/datasets.md). Uses ogb's own DGL loaders, so the folder layout (``<name_with_>/raw``,
``split``, ``processed``, ``RELEASE_v*.txt``) is exactly what ogb expects; pre-processing here also means the
copy can be read-only later.

    python scripts/prepare_ogb.py ogbn-arxiv ogbl-citation2 --root /data/ogb
    python scripts/prepare_ogb.py ogbl-ddi ogbn-products ogbn-mag ogbl-citation2 ogbl-wikikg2 --root /data/ogb --yes

The second line fetches every dataset ``benchmarks/bench_ogb.py`` has a configuration for (then ``python
benchmarks/bench_ogb.py --dataset NAME --root /data/ogb``). ogbn-mag is heterogeneous: it is downloaded and processed,
and reported as not loadable where ``dgl_oac.app.data`` has no heterograph mapping.
"""
from __future__ import annotations

import argparse
import builtins
import os
import sys
from pathlib import Path


def parse_args(argv=None) -> argparse.Namespace:
    default_root = os.environ.get("DGL_OAC_DATA") or str(Path.home() / "ogb")
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     epilog="Example: python scripts/prepare_ogb.py ogbn-arxiv "
                                            "--root /data/ogb")
    parser.add_argument("names", nargs="+", metavar="NAME",
                        help="OGB dataset names, e.g. ogbn-arxiv ogbn-products ogbn-papers100M "
                             "ogbl-citation2 ogbl-wikikg2")
    parser.add_argument("--root", default=default_root,
                        help="folder to download into (default: $DGL_OAC_DATA or ~/ogb; now %(default)s)")
    parser.add_argument("--yes", "-y", action="store_true",
                        help="answer ogb's 'download more than 1 GB?' / 'update dataset?' prompts with yes")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        from dgl_oac.app.data import load, ogb_names
    except ImportError:  # run from a checkout without installing: put the repo root on the path
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        from dgl_oac.app.data import load, ogb_names
    from ogb.linkproppred import DglLinkPropPredDataset
    from ogb.nodeproppred import DglNodePropPredDataset

    if args.yes:
        builtins.input = lambda *a, **k: "y"  # ogb asks on stdin before large downloads
    root = Path(args.root).expanduser()
    root.mkdir(parents=True, exist_ok=True)
    known = ogb_names()
    for raw_name in args.names:
        name = known.get(raw_name.lower())
        if name is None:
            print(f"unknown OGB dataset {raw_name!r}; known: {', '.join(sorted(known.values()))}",
                  file=sys.stderr)
            return 2
        print(f"== {name} -> {root}", flush=True)
        cls = DglNodePropPredDataset if name.startswith("ogbn-") else DglLinkPropPredDataset
        cls(name=name, root=str(root))  # downloads, unzips and writes processed/ through ogb itself
        try:
            ds = load(name, root=root)
            print(f"   ok: {type(ds).__name__} {ds}"[:300], flush=True)
        except ValueError as exc:  # e.g. heterogeneous sets that dgl_oac.app.data does not map
            print(f"   downloaded, but dgl_oac.app.data cannot load it: {exc}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
