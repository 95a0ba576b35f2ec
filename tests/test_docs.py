"""The docs site (docs/, mkdocs.yml) and README.md: the site builds with warnings as errors, every Python
snippet runs, and every shell command's flags exist.

- ``mkdocs build --strict``: a broken link, a missing page, a public name without a reference entry or a
  docstring (docs/_hooks/api_check.py) fails it.
- Python: each page's ``python`` blocks are joined in order and run as one script, in a subprocess with a fresh
  working directory (all pages in one process, one after the other, to pay torch's import once).
- Shell: commands are checked, not run (training runs take minutes): ``dgl-oac ...`` / ``-m dgl_oac ...`` are
  parsed by the CLI's own parser, ``python examples/x.py --flag`` needs the script and each flag in its source.

Skips, saying so, when the ``docs`` tools (in the ``test`` extra) are not installed.
"""
from __future__ import annotations

import html
import os
import re
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Dict, List, Tuple

import pytest

ROOT = Path(__file__).resolve().parents[1]
FENCE = re.compile(r"^```(\w+)[^\n]*\n(.*?)^```\s*$", re.S | re.M)
# a block that only includes a file (pymdownx.snippets): that file's own test runs it
INCLUDE_ONLY = re.compile(r'^(\s*--8<-- "[^"]+"\s*\n?)+$')
PAGES = sorted(ROOT.joinpath("docs").rglob("*.md")) + [ROOT / "README.md"]


def blocks(lang: str) -> Dict[str, List[str]]:
    """``{page: [code, ...]}`` of the fenced blocks in ``lang``, in page order."""
    out: Dict[str, List[str]] = {}
    for page in PAGES:
        found = [code for kind, code in FENCE.findall(page.read_text(encoding="utf-8"))
                 if kind == lang and not INCLUDE_ONLY.match(code)]
        if found:
            out[str(page.relative_to(ROOT))] = found
    return out


def _docs_tools() -> None:
    for module in ("mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers.python"):
        pytest.importorskip(module, reason=f"docs tools not installed ({module}): pip install -e '.[test]'")


def _env() -> Dict[str, str]:
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


#: the site's build; without -q: --strict counts the warnings -q would drop (a broken link)
BUILD = [sys.executable, "-m", "mkdocs", "build", "--strict", "-d"]


def test_the_strict_build_fails_on_a_broken_link(tmp_path: Path) -> None:
    _docs_tools()
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "index.md").write_text("# x\n\n[gone](missing.md)\n", encoding="utf-8")
    (tmp_path / "mkdocs.yml").write_text("site_name: probe\n", encoding="utf-8")
    run = subprocess.run([*BUILD, str(tmp_path / "site")], cwd=tmp_path, env=_env(), capture_output=True,
                         text=True, timeout=300)
    assert run.returncode != 0 and "missing.md" in run.stdout + run.stderr


def test_site_builds_strictly(tmp_path: Path) -> None:
    _docs_tools()
    run = subprocess.run([*BUILD, str(tmp_path / "site")], cwd=ROOT, env=_env(), capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, f"mkdocs build --strict failed:\n{run.stdout}\n{run.stderr}"
    for page in ("index.html", "api/loader/index.html", "api/cli/index.html", "benchmarks/speed/index.html"):
        assert (tmp_path / "site" / page).is_file(), page
    cli = (tmp_path / "site" / "api/cli/index.html").read_text(encoding="utf-8")
    assert "--prefetch" in cli and "--checkpoint-dir" in cli  # rendered from the parser
    from dgl_oac.app.cli import GROUPS

    headings = [html.unescape(h) for h in re.findall(r'<h3 id="[^"]*">(.*?)<a class="headerlink"', cli)]
    assert headings == [title for title, _, _ in GROUPS], headings  # --help's groups, one table each
    assert "Exit status: 0 done" in cli
    for page in sorted((tmp_path / "site" / "api").rglob("index.html")):
        assert not _rest_markers(page.read_text(encoding="utf-8")), (page, _rest_markers(page.read_text()))
    speed = (tmp_path / "site" / "benchmarks/speed/index.html").read_text(encoding="utf-8")
    assert "results/bench_modes_workloads.png" in speed
    assert (tmp_path / "site" / "benchmarks/results/bench_modes_workloads.png").is_file()
    assert (tmp_path / "site" / "benchmarks/studies/index.html").is_file()


def _rest_markers(page: str) -> List[str]:
    """reST's literal-block marker (``text::``) in a rendered page's prose (code and code blocks left out)."""
    prose = re.sub(r"<pre.*?</pre>|<code.*?</code>", "", page, flags=re.S)
    prose = html.unescape(re.sub(r"<[^>]+>", "", prose))
    return [prose[max(0, m.start() - 60): m.end()] for m in re.finditer(r"\w\)?::\s", prose)]


def test_rest_marker_check_finds_the_marker() -> None:
    assert _rest_markers("<p>Changing the imports is the port::</p>\n<pre>x</pre>")
    assert not _rest_markers("<p>see <code>a::b</code></p><pre>x::\n</pre><p>the port:</p>")


RUNNER = textwrap.dedent("""
    import os, sys, tempfile, time, traceback
    pages = eval(sys.stdin.read())
    failed = []
    for page, code in pages:
        work = tempfile.mkdtemp(prefix="snippet-")
        os.chdir(work)
        start = time.perf_counter()
        try:
            exec(compile(code, page, "exec"), {"__name__": "__main__"})
        except BaseException:
            failed.append(page)
            print(f"=== {page} failed:", file=sys.stderr)
            traceback.print_exc()
        print(f"{page}: {time.perf_counter() - start:.1f} s", file=sys.stderr)
    print("FAILED:", failed, file=sys.stderr)
    sys.exit(1 if failed else 0)
""")


@pytest.mark.slow
def test_python_snippets_run() -> None:
    pages: List[Tuple[str, str]] = [(page, "\n\n".join(code)) for page, code in blocks("python").items()]
    assert len(pages) >= 8, f"expected a snippet on every guide, found {[p for p, _ in pages]}"
    run = subprocess.run([sys.executable, "-c", RUNNER], input=repr(pages), cwd=ROOT, env=_env(),
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, f"a docs snippet failed:\n{run.stderr[-6000:]}"


def _commands(code: str) -> List[List[str]]:
    """Each command of a shell block as argv: continuations joined, comments dropped, split at ``&&``, ``;``
    and ``&`` (outside quotes), leading ``VAR=value`` assignments dropped."""
    out = []
    for line in code.replace("\\\n", " ").splitlines():
        lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
        lexer.commenters, lexer.wordchars = "#", lexer.wordchars + "=.-/:,@'[]*"
        argv: List[str] = []
        for token in [*lexer, ";"]:
            if token in ("&&", ";", "&", "||", "|"):
                while argv and re.match(r"^[A-Z_]+=", argv[0]):
                    argv = argv[1:]
                if argv:
                    out.append(argv)
                argv = []
            else:
                argv.append(token)
    return out


def _check_command(argv: List[str]) -> str:
    """'' when fine, else what is wrong."""
    from dgl_oac.app.cli import build_parser

    ours = None
    if argv[0] == "dgl-oac":
        ours = argv[1:]
    elif "dgl_oac" in argv and argv[argv.index("dgl_oac") - 1] == "-m":
        ours = argv[argv.index("dgl_oac") + 1:]
    if ours is not None:
        try:
            build_parser().parse_args(ours)
        except SystemExit as exc:
            return f"dgl-oac rejects {ours} (exit {exc.code})"
        return ""
    scripts = [a for a in argv if a.endswith(".py") and "/" in a]
    if argv[0] in ("python", "python3", "torchrun") and scripts:
        path = ROOT / scripts[0]
        if not path.is_file():
            return f"no such script {scripts[0]}"
        # the script and its folder's private helpers (benchmarks/_common.py adds --out, --rounds, ...)
        source = "".join(f.read_text(encoding="utf-8") for f in [path, *path.parent.glob("_*.py")])
        rest = argv[argv.index(scripts[0]) + 1:]
        missing = [a.split("=")[0] for a in rest if a.startswith("--") and f'"{a.split("=")[0]}"' not in source]
        return f"{scripts[0]} has no option {missing}" if missing else ""
    return ""


def test_shell_commands_name_real_options(capsys: pytest.CaptureFixture) -> None:
    checked, wrong = 0, []
    for page, codes in {**blocks("bash"), **blocks("sh")}.items():
        for argv in (a for code in codes for a in _commands(code)):
            problem = _check_command(argv)
            checked += 1
            if problem:
                wrong.append(f"{page}: {' '.join(argv)}: {problem}")
    capsys.readouterr()  # argparse's usage messages
    assert not wrong, "\n".join(wrong)
    assert checked >= 20, checked


def test_commands_are_split_as_a_shell_splits_them() -> None:
    assert _commands('A=1 B=2 python -c "import x; y()" &\ndgl-oac train \\\n  --epochs 2  # comment') == [
        ["python", "-c", "import x; y()"], ["dgl-oac", "train", "--epochs", "2"]]
    assert _commands("python3 -m venv .venv && . .venv/bin/activate && dgl-oac train") == [
        ["python3", "-m", "venv", ".venv"], [".", ".venv/bin/activate"], ["dgl-oac", "train"]]


def test_command_checker_catches_a_wrong_flag() -> None:
    assert _check_command(["dgl-oac", "train", "--no-such-flag"])
    assert _check_command(["python", "examples/node_classification.py", "--no-such-flag"])
    assert not _check_command(["dgl-oac", "train", "--task", "kg", "--epochs", "2"])
    assert not _check_command(["torchrun", "--standalone", "--nproc_per_node=2", "-m", "dgl_oac", "train"])


def test_api_check_names_undocumented_members() -> None:
    _docs_tools()
    sys.path.insert(0, str(ROOT / "docs" / "_hooks"))
    try:
        import api_check
    finally:
        sys.path.remove(str(ROOT / "docs" / "_hooks"))

    class Probe:
        def documented(self) -> None:
            """Has one."""

        def bare(self) -> None:
            pass

        @property
        def prop(self) -> int:
            return 1

    assert api_check._undocumented_members(Probe) == ["bare", "prop"]
    assert api_check.problems(ROOT / "docs") == []
