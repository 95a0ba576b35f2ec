"""Finalizers that do not swallow Ctrl-C.

Python runs a signal's handler in the main thread at the next bytecode, whatever that thread is doing. When that
is a finalizer (a batch's leaf died, an epoch dropped without ``close()``), the ``KeyboardInterrupt`` it raises is
unraisable: Python prints "Exception ignored" and training goes on, the Ctrl-C lost. Every finalizer of dgl-oac
runs through :func:`finalizer`, which gives such an interrupt back to the main thread a moment later
(``_thread.interrupt_main``, from a timer thread): Python would check for it at the finalizer's next bytecode, still
inside the finalizer, if it were given back at once. It is then raised in the code the main thread runs next; one
that lands in another of these finalizers is given back again.
"""
from __future__ import annotations

import _thread
import threading
import weakref
from typing import Any, Callable

REDELIVER_S = 0.01  # long enough for the finalizer to return, short to a person


def _run(fn: Callable[..., None], *args: Any) -> None:
    try:
        fn(*args)
    except KeyboardInterrupt:
        timer = threading.Timer(REDELIVER_S, _thread.interrupt_main)
        timer.daemon = True
        timer.name = "dgl-oac-interrupt"
        timer.start()


def finalizer(obj: Any, fn: Callable[..., None], *args: Any) -> "weakref.finalize":
    """``weakref.finalize(obj, fn, *args)``, with a Ctrl-C that lands inside ``fn`` raised again in the main
    thread (module docstring)."""
    return weakref.finalize(obj, _run, fn, *args)
