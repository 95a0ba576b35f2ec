"""mkdocs hook: render benchmarks/RESULTS.md, benchmarks/QUALITY.md and benchmarks/studies/README.md in the site
without copying their text.

The three files stay the single source (they sit next to the scripts whose commands they quote). At build time
they become the pages ``benchmarks/speed.md``, ``benchmarks/quality.md`` and ``benchmarks/studies.md``, and every
plot under ``benchmarks/results/`` is added at the same path, so RESULTS.md's and QUALITY.md's relative image links
(``results/*.png``) resolve unchanged. The studies page links no image. A link into ``docs/`` from those files
(``../docs/concepts/threads.md`` from RESULTS.md, as it resolves on GitHub) is rewritten to the page's place in
the site (``../concepts/threads.md``).
"""
from __future__ import annotations

from pathlib import Path

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[2]
PAGES = {"benchmarks/speed.md": "benchmarks/RESULTS.md", "benchmarks/quality.md": "benchmarks/QUALITY.md",
         "benchmarks/studies.md": "benchmarks/studies/README.md"}
NOTE = ("!!! note \"Source\"\n    This page is `{src}` from the repository, rendered as is; every figure below "
        "names the command that produced it. Lines marked PREDICTION are model predictions, not measurements.\n\n")


def on_files(files: Files, config) -> Files:
    for page, src in PAGES.items():
        text = (ROOT / src).read_text(encoding="utf-8")
        to_docs = "../" * (src.count("/"))  # from the source file's folder up to the repository root
        text = text.replace(f"]({to_docs}docs/", "](../")  # the page sits one folder below the site's root
        files.append(File.generated(config, page, content=NOTE.format(src=src) + text))
    for png in sorted((ROOT / "benchmarks" / "results").rglob("*.png")):
        rel = png.relative_to(ROOT / "benchmarks").as_posix()
        files.append(File.generated(config, f"benchmarks/{rel}", abs_src_path=str(png)))
    return files
