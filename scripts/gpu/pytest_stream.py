"""A pytest plugin: one JSON line per test report, appended to a file and flushed as it is written, so a run
that is killed keeps every outcome before the kill (JUnit XML is written only at the end; pytest-reportlog is
not on the GPU machine).

    python -m pytest -p gpu.pytest_stream --outcome-stream=tests.jsonl --outcome-label=cuda_tests --cuda-first \
        tests/...

``--cuda-first`` runs the tests that concern CUDA (``cuda`` in their id or a parameter, or a ``skipif`` whose
reason names CUDA) before the rest, each group in collection order: a run cut short has their outcomes first.

Lines (each with ``label``): ``{"event": "start"}``; ``{"event": "collect", "nodeid", "outcome": "failed",
"longrepr"}`` for a module that fails to import; ``{"event": "test", "nodeid", "when", "outcome", "duration"}``
for every call report and for a setup or teardown that did not pass (``longrepr`` when it failed, ``reason``
when it was skipped); ``{"event": "finish", "exitstatus", "collected", "failed"}`` when the session ends.
"""
from __future__ import annotations

import json
import time
from typing import IO, Any, Dict, List

import pytest

LONGREPR_CHARS = 4000


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("outcome-stream")
    group.addoption("--outcome-stream", default=None, help="append one JSON line per test report to this file")
    group.addoption("--outcome-label", default="", help="the label every line carries (the suite's step name)")
    group.addoption("--cuda-first", action="store_true", help="run the tests that concern CUDA first")


def concerns_cuda(item: pytest.Item) -> bool:
    callspec = getattr(item, "callspec", None)
    params = [] if callspec is None else list(callspec.params.values())
    reasons = [str(m.kwargs.get("reason", "")) for m in item.iter_markers("skipif")]
    return any("cuda" in str(x).lower() for x in [item.nodeid, *params, *reasons])


def pytest_collection_modifyitems(config: pytest.Config, items: List[pytest.Item]) -> None:
    if config.getoption("cuda_first"):
        items.sort(key=lambda item: not concerns_cuda(item))  # stable: collection order within each group


class OutcomeStream:
    def __init__(self, path: str, label: str):
        self.label = label
        self.file: IO[str] = open(path, "a", encoding="utf-8")

    def write(self, rec: Dict[str, Any]) -> None:
        self.file.write(json.dumps({"label": self.label, "t": round(time.time(), 3), **rec}) + "\n")
        self.file.flush()

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.failed:
            self.write({"event": "collect", "nodeid": report.nodeid, "outcome": "failed",
                        "longrepr": str(report.longrepr)[-LONGREPR_CHARS:]})

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when != "call" and report.passed:
            return
        rec: Dict[str, Any] = {"event": "test", "nodeid": report.nodeid, "when": report.when,
                               "outcome": report.outcome, "duration": round(report.duration, 4)}
        if report.failed:
            rec["longrepr"] = str(report.longrepr)[-LONGREPR_CHARS:]
        elif report.skipped and isinstance(report.longrepr, tuple):
            rec["reason"] = report.longrepr[2]
        self.write(rec)

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        self.write({"event": "finish", "exitstatus": int(exitstatus), "collected": session.testscollected,
                    "failed": session.testsfailed})
        self.file.close()


def pytest_configure(config: pytest.Config) -> None:
    path = config.getoption("outcome_stream")
    if path:
        stream = OutcomeStream(path, config.getoption("outcome_label"))
        config.pluginmanager.register(stream, "outcome-stream-writer")
        stream.write({"event": "start"})
