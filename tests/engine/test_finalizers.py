"""A Ctrl-C that lands inside one of dgl-oac's finalizers reaches the main thread (dgl_oac.engine.runtime):
without it, Python reports the KeyboardInterrupt as unraisable and training goes on (the CLI's Ctrl-C test
caught one such run of a whole training)."""
from __future__ import annotations

import gc
import signal
import time

import pytest

from dgl_oac.engine.runtime import finalizer


class _Thing:
    pass


def _interrupted(seen: list) -> None:
    seen.append("ran")
    raise KeyboardInterrupt  # as if the signal's handler ran here


def test_an_interrupt_inside_a_finalizer_is_raised_again_where_the_main_thread_was():
    # Python's own Ctrl-C handler, whatever this run inherited (one started in the background of a script ignores
    # SIGINT, and then an interrupt given back does nothing)
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        seen: list = []
        thing = _Thing()
        finalizer(thing, _interrupted, seen)
        with pytest.raises(KeyboardInterrupt):
            del thing  # the finalizer runs now, on this thread
            for _ in range(200):  # the interrupt comes back within REDELIVER_S
                time.sleep(0.01)
        assert seen == ["ran"]
    finally:
        signal.signal(signal.SIGINT, before)


def test_a_finalizer_still_runs_once_and_returns_nothing_special():
    seen: list = []
    thing = _Thing()
    f = finalizer(thing, seen.append, "closed")
    assert f.alive
    f()
    f()
    del thing
    gc.collect()
    assert seen == ["closed"]
