"""Replace the paths of the machine a run happened on with named placeholders, in place, before its files are
committed: the device's ``$OUT``, its interpreter and site-packages, the suite's site and scratch folders, pytest's
temporary folders and the repository's own root (``.``). The values are unchanged; only where they were is no
longer spelled as that machine's absolute path.

    python scripts/gpu/normalize_paths.py benchmarks/results/gpu/2026-11-28-h200   # every file below it
    python scripts/gpu/normalize_paths.py --repo "$PWD" benchmarks/results/rehearsal

Prints each file it changed, and exits 1 naming any absolute path of those prefixes (``MACHINE_PREFIXES``) that is
left.
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import List, Optional, Tuple

REPO = Path(__file__).resolve().parents[2]
#: (pattern, placeholder), applied in order: the most specific first
RULES: List[Tuple[str, str]] = [
    (r"/(?:opt/torch/\.venv|tmp/dgl-oac-gpu-rehearsal/venv)/lib/python3\.\d+/site-packages", "$SITE_PACKAGES"),
    (r"/(?:opt/torch/\.venv|tmp/dgl-oac-gpu-rehearsal/venv)/bin/python3?", "python3"),
    (r"/usr/lib/python3\.\d+", "$PYTHON_LIB"),
    (r"/tmp/dgl-oac-gpu-rehearsal-run\.\w+/gpu", "$OUT/gpu"),
    (r"/tmp/dgl-oac-gpu-rehearsal-run\.\w+/site", "$SITE"),
    (r"/tmp/dgl-oac-gpu-site", "$SITE"),
    (r"/tmp/dgl-oac-gpu-scratch-\w+", "$SCRATCH"),
    (r"/tmp/pytest-of-\w+/pytest-\d+", "$PYTEST_TMP"),
    (r"/root/out", "$OUT"),
    (r"/opt/dgl/src", "$DGL_BUILD/src"),  # where DGL's wheel was built: its C++ errors quote the path
]
#: absolute paths that name one machine: none may be left in a committed result
MACHINE_PREFIXES = r"/(?:root|opt|work|home)/|/tmp/(?:dgl-oac-gpu|pytest-of-)"


def normalize(text: str, repo: Path = REPO) -> str:
    """``text`` with every rule of :data:`RULES` applied, then the repository's root as ``.``."""
    for pattern, placeholder in RULES:
        text = re.sub(pattern, lambda _m, p=placeholder: p, text)
    return text.replace(str(repo) + "/", "./").replace(str(repo), ".")


def left_over(text: str) -> List[str]:
    """The absolute machine paths still in ``text`` (:data:`MACHINE_PREFIXES`)."""
    return sorted({m.group(0) for m in re.finditer(f"(?:{MACHINE_PREFIXES})" + r"[^\s\"',:)]*", text)})


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("folders", nargs="+", type=Path)
    p.add_argument("--repo", type=Path, default=REPO, help="the repository root the run used (becomes '.')")
    args = p.parse_args(argv)
    left = []
    for folder in args.folders:
        for path in sorted(f for f in folder.rglob("*") if f.is_file() and f.suffix in (".json", ".jsonl", ".txt", ".log")):
            text = path.read_text(errors="surrogateescape")
            new = normalize(text, args.repo)
            if new != text:
                path.write_text(new, errors="surrogateescape")
                print(f"normalized {path}")
            left += [f"{path}: {x}" for x in left_over(new)]
    for line in left:
        print(f"machine path left: {line}", file=sys.stderr)
    return 1 if left else 0


if __name__ == "__main__":
    sys.exit(main())
