"""Shared test fixtures: small seeded graphs, device parametrization, thread counting, hang guards.

* ``power_law_graph(num_nodes, seed)`` / fixture ``graph``: a small, seeded, undirected power-law graph.
* ``DEVICES`` / fixture ``devices``: ``"cpu"`` always, ``"cuda"`` only when CUDA is available (PyG's
  ``withCUDA`` idea: one test body, every device present). ``with_devices`` is the decorator form.
* ``oac_threads()``: names of the live dgl-oac background threads (they all start with ``"dgl-oac"``).
* ``@pytest.mark.hang_timeout(seconds)``: fail a test (instead of hanging CI) once it runs past ``seconds``.
  Implemented with ``signal.setitimer`` in the main thread, so the test body itself stays on the main thread,
  the only thread where DGL's sampling is reproducible.
* fixtures ``single_torch_thread`` / ``single_dgl_thread``: one OpenMP thread for the test, restored after.
* fixture ``make_emb``: builds ``dgl_oac.NodeEmbedding`` objects and closes them (their write-back threads)
  at teardown.
* The tests of files that start gloo ranks run one at a time on the machine (``_one_gloo_job_at_a_time``).
* Without DGL (Python >= 3.12: PyPI has no working build), only the files of ``WITHOUT_DGL`` are collected:
  the others need DGL's graphs or loader somewhere (``pytest_ignore_collect``).
"""
from __future__ import annotations

import contextlib
import fcntl
import itertools
import os
import re
import signal
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Optional

import pytest
import torch

import dgl_oac

try:
    import dgl
except ImportError:  # Python >= 3.12, or an install without the [dgl] extra: WITHOUT_DGL's files run
    dgl = None

#: test files that pass without DGL (checked on Python 3.12 with no DGL installed); the rest need it
WITHOUT_DGL = frozenset({
    "test_no_dgl.py", "test_layout.py", "test_loading.py", "test_combine.py", "test_config.py",
    "test_distributed_units.py", "test_examples_sources.py", "test_exit.py", "test_loader_stats.py",
    "test_metrics.py", "test_native.py", "test_nn_embedding.py", "test_nn_optim.py", "test_pcie_bytes.py",
    "test_plot.py", "test_requirements.py", "test_sorting.py", "test_source_thread.py", "test_worker.py",
    "test_write_path.py", "test_writeback.py", "test_nn_swap.py", "test_nn_padding_max_norm.py",
    "test_source_generators.py", "test_examples_pyg.py", "test_reads_and_refresh.py", "test_resume_and_staleness.py",
})


def pytest_ignore_collect(collection_path, config) -> Optional[bool]:  # noqa: ANN001 - pytest's hook
    """Without DGL, skip the test files not in ``WITHOUT_DGL`` (they import DGL, or train on its graphs)."""
    if dgl is None and collection_path.suffix == ".py" and collection_path.name.startswith("test_"):
        return collection_path.name not in WITHOUT_DGL or None
    return None


def pytest_report_header(config) -> Optional[str]:  # noqa: ANN001 - pytest's hook
    if dgl is not None:
        return None
    return f"DGL does not import: only the {len(WITHOUT_DGL)} files of conftest.WITHOUT_DGL run"


DEVICES: List[str] = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
with_devices = pytest.mark.parametrize("device", DEVICES)

_names = itertools.count()


def unique_name(prefix: str = "emb") -> str:
    """A fresh name (``dgl.nn.NodeEmbedding`` names a shared-memory segment: names must not repeat, in this
    process nor in another test run beside it: the pid is part of the name)."""
    return f"{prefix}{os.getpid()}_{next(_names)}"


def power_law_graph(num_nodes: int = 120, seed: int = 0, edges_per_node: int = 3,
                    exponent: float = 1.2) -> "dgl.DGLGraph":
    """Seeded undirected graph whose in-degrees follow a power law (low ids are hubs); no feature data.

    Every node sends ``edges_per_node`` edges to targets drawn with probability ~ 1 / (rank ** exponent);
    both directions are added, so hubs appear in almost every 2-hop neighbourhood (many conflicts in oac).
    """
    gen = torch.Generator().manual_seed(seed)
    weights = 1.0 / torch.arange(1, num_nodes + 1, dtype=torch.float64) ** exponent
    src = torch.arange(num_nodes).repeat_interleave(edges_per_node)
    dst = torch.multinomial(weights, num_nodes * edges_per_node, replacement=True, generator=gen)
    return dgl.graph((torch.cat([src, dst]), torch.cat([dst, src])), num_nodes=num_nodes)


def seeded_init(seed: int = 0, scale: float = 1.0) -> Callable[[torch.Tensor], torch.Tensor]:
    """An ``init_func`` filling rows from a private generator (same values on every call)."""
    def init(t: torch.Tensor) -> torch.Tensor:
        gen = torch.Generator().manual_seed(seed)
        return t.copy_(torch.empty(t.shape).uniform_(-scale, scale, generator=gen))
    return init


def live_gather_threads(exclude: frozenset = frozenset()) -> List[threading.Thread]:
    """Live gather threads not in ``exclude`` (threads of loaders that earlier tests' tracebacks still hold)."""
    return [t for t in threading.enumerate() if t.name.startswith("dgl-oac-gather") and t.is_alive()
            and t not in exclude]


#: threads that come and go with the load of the machine, not with a loader (dgl_oac.engine.runtime, .finalizers):
#: their own lifetimes are tests/engine/test_spin.py's and tests/engine/test_finalizers.py's
LOAD_FOLLOWING = ("dgl-oac-spin-throttle", "dgl-oac-load-monitor", "dgl-oac-interrupt")


def is_pipeline_thread(t: threading.Thread) -> bool:
    """A live dgl-oac background thread of a loader or table (not one of :data:`LOAD_FOLLOWING`)."""
    return t.name.startswith("dgl-oac") and t.name not in LOAD_FOLLOWING and t.is_alive()


def oac_threads() -> List[str]:
    """Sorted names of live dgl-oac background threads of loaders and tables."""
    return sorted(t.name for t in threading.enumerate() if is_pipeline_thread(t))


def oac_threads_left(before: List[str], within: float = 10.0) -> List[str]:
    """dgl-oac threads started since ``before`` (an :func:`oac_threads` list) still alive after up to ``within``
    seconds (a hang detector: another test's threads, or a close finishing on a busy machine, are not this one's)."""
    deadline = time.monotonic() + within
    while True:
        left = [t for t in oac_threads() if t not in before]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.02)


class Hang(Exception):
    """A test ran past its ``hang_timeout``."""


@contextlib.contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Raise :class:`Hang` in the main thread after ``seconds`` (blocking lock waits are interruptible)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_alarm(signum, frame):  # noqa: ARG001
        raise Hang(f"test did not finish within {seconds}s (hang?)")

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "hang_timeout(seconds): fail the test if it runs longer than seconds")
    config.addinivalue_line("markers", "slow: a long end-to-end run that CI leaves out (setup.cfg's -m 'not slow'; "
                                       "each capability keeps a faster end-to-end test there); run with pytest -m slow")


#: a test file that starts gloo process groups (spawned ranks, torchrun, DGL's launcher) says one of these
_GLOO = re.compile(r"gloo|init_process_group|run_ranks|RankPool|two_rank_pool|torchrun\(|launch_local")
_USES_GLOO: Dict[Path, bool] = {}


@pytest.fixture(autouse=True)
def _one_gloo_job_at_a_time(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test of a file that starts gloo ranks holds a lock shared by every pytest process on the machine (the -n 2
    workers): two gloo jobs on one host crossed connections now and then (a new group failed with "Gloo
    connectFullMesh failed ... Connection closed by peer" in 4 of ~70 runs of two distributed test files side by
    side under -n 2, never in 20 runs one after the other)."""
    path = request.node.path
    if path not in _USES_GLOO:
        _USES_GLOO[path] = bool(_GLOO.search(path.read_text()))
    if not _USES_GLOO[path]:
        yield
        return
    with open(os.path.join(tempfile.gettempdir(), f"dgl-oac-tests-gloo-{os.getuid()}.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@pytest.fixture(autouse=True)
def _hang_guard(request: pytest.FixtureRequest) -> Iterator[None]:
    marker = request.node.get_closest_marker("hang_timeout")
    if marker is None:
        yield
        return
    with time_limit(float(marker.args[0])):
        yield


@pytest.fixture(autouse=True)
def _sigint_kept(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test that leaves SIGINT's handler changed fails by name, and the handler is restored: later tests on
    the same worker (Ctrl-C in the CLI, an interrupt in a finalizer) and the processes they start rely on it."""
    before = signal.getsignal(signal.SIGINT)
    yield
    after = signal.getsignal(signal.SIGINT)
    if after is not before:
        signal.signal(signal.SIGINT, before)
        pytest.fail(f"{request.node.nodeid} left SIGINT's handler as {after!r} (restored)", pytrace=False)


@pytest.fixture(params=DEVICES)
def devices(request: pytest.FixtureRequest) -> str:
    """Each test using this fixture runs once per device present: "cpu", then "cuda" when available."""
    return request.param


@pytest.fixture
def graph() -> "dgl.DGLGraph":
    return power_law_graph()


@pytest.fixture
def make_emb() -> Iterator[Callable[..., "dgl_oac.NodeEmbedding"]]:
    """``make_emb(num, dim, init=seed or callable or None, **kw)``; every embedding made is closed at teardown."""
    made: List[dgl_oac.NodeEmbedding] = []

    def make(num: int, dim: int, init=0, name: str = "", **kw) -> dgl_oac.NodeEmbedding:
        init_func = seeded_init(init) if isinstance(init, int) and not isinstance(init, bool) else init
        emb = dgl_oac.NodeEmbedding(num, dim, name or unique_name(), init_func, **kw)
        made.append(emb)
        return emb

    yield make
    for emb in made:
        with contextlib.suppress(Exception):  # a test may have broken the write-back on purpose
            emb.close()


@pytest.fixture
def single_torch_thread() -> Iterator[None]:
    """One torch thread for the test (restored after): bitwise comparisons need no OpenMP team, and small
    tensors gain nothing from one (teams of 2 stall on a busy shared machine)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@pytest.fixture
def single_dgl_thread() -> Iterator[None]:
    """DGL's OpenMP pool at one thread for the test (restored after)."""
    before = dgl.utils.get_num_threads()
    dgl.utils.set_num_threads(1)
    try:
        yield
    finally:
        dgl.utils.set_num_threads(before)
