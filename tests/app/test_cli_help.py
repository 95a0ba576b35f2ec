"""``dgl-oac train --help``: short enough to read, options grouped, each default shown once, on/off flags without
one, and per-task defaults only for the tasks that read the option (issue 25)."""
from __future__ import annotations

import re
from dataclasses import fields
from typing import Dict

import pytest

from dgl_oac.app.cli import GROUPS, main
from dgl_oac.app.tasks import TrainConfig


@pytest.fixture(scope="module")
def help_text() -> str:
    import contextlib
    import io
    import os

    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "80"  # argparse wraps to the terminal: measure at the common 80 columns
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
            main(["train", "--help"])
    finally:
        if old is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = old
    return out.getvalue()


def entries(text: str) -> Dict[str, str]:
    """``{flag: its help, one line}`` for every option of the help text."""
    out, flag = {}, None
    for line in text.splitlines():
        m = re.match(r"^  (--[\w-]+)", line)
        if m:
            flag = m.group(1)
            out[flag] = line
        elif flag is not None and line.startswith("   "):
            out[flag] += " " + line.strip()
        else:
            flag = None
    return {k: " ".join(v.split()) for k, v in out.items()}


def test_short_and_grouped(help_text: str) -> None:
    lines = help_text.splitlines()
    assert len(lines) <= 150, f"--help is {len(lines)} lines at 80 columns"  # 200 before issue 25
    assert lines[0] == "usage: dgl-oac train [options]"  # not every flag again
    titles = [line[:-1] for i, line in enumerate(lines) if re.match(r"^\w.*:$", line) and not lines[i - 1]]
    assert titles == ["options"] + [title for title, _, _ in GROUPS]
    grouped = [name for _, _, names in GROUPS for name in names]
    assert sorted(grouped) == sorted(f.name for f in fields(TrainConfig) if f.name != "extra")  # each once


def test_each_default_once_and_none_for_flags(help_text: str) -> None:
    opts = entries(help_text)
    assert len(opts) == sum(len(names) for _, _, names in GROUPS)
    for flag, text in opts.items():
        assert text.count("default") <= 1, (flag, text)
        assert not re.search(r"\(default: (True|False|None)\)", text), (flag, text)
    assert "default" not in opts["--no-progress"] and "default" not in opts["--resume"]
    assert opts["--seed"].endswith("(default: 0)") and "default" not in opts["--max-steps"]


def test_per_task_defaults_only_for_tasks_that_read_the_option(help_text: str) -> None:
    opts = entries(help_text)
    assert opts["--negatives"].endswith("(default: link 64, kg 1024, link on ogbl-ddi 1)")
    assert opts["--fanouts"].endswith("(default: 10,5; link on ogbl-ddi -1,-1)")  # no kg: it samples no blocks
    assert opts["--reg-weight"].endswith("(default: 0.05; kg --model transe 0.0)")  # kg only
    assert opts["--scorer-layers"].endswith("(default: 2)")  # ogbl-ddi's 2 is no exception
    assert opts["--optimizer"].endswith("(default: adam; kg adagrad)")
    for flag in ("--hidden", "--dropout", "--scorer", "--message-passing"):
        assert not re.search(r"\b(kg|node)\b", opts[flag].split("(default:")[-1]), opts[flag]


def test_parser_tables_match_the_library():
    """cli.py writes the choices and defaults down (it parses before torch is imported): each equals what the
    library checks and what TrainConfig holds, and each option parses to its field's type."""
    from dgl_oac.app.cli import CHOICES, DEFAULTS, FLOATS, INTS
    from dgl_oac.app.tasks import TASK_NAMES
    from dgl_oac.app.tasks.backend import BACKEND_MODES, OPTIMIZERS
    from dgl_oac.app.tasks.common import DENSE_SYNCS, SHARDINGS
    from dgl_oac.app.tasks.link import AUTOCAST
    from dgl_oac.config import PRIORITIES, STALENESS

    library = {"task": TASK_NAMES, "mode": BACKEND_MODES, "optimizer": OPTIMIZERS, "background_priority": PRIORITIES,
               "staleness": STALENESS, "autocast": AUTOCAST, "dense_sync": DENSE_SYNCS, "sharding": SHARDINGS}
    assert {k: tuple(v) for k, v in CHOICES.items()} == {k: tuple(v) for k, v in library.items()}
    config = {f.name: f for f in fields(TrainConfig) if f.name != "extra"}
    assert DEFAULTS == {name: f.default for name, f in config.items()}
    assert list(DEFAULTS) == list(config)
    for name, f in config.items():
        kind = str(f.type).replace("Optional[", "").rstrip("]")
        assert (name in INTS, name in FLOATS) == (kind == "int", kind == "float"), name
