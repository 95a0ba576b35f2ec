"""``prefetch="auto"``: the pipelining depth, chosen online from measured step times.

OAC is exact at every depth: each batch is validated against every step committed before it is handed out,
so the depth is a pure speed knob and may change at any batch without changing a single bit of the result.
Depth 0 is sync's schedule (the batch is read at hand-out, after every committed step is in the table; commits
write through); depth k gathers up to k batches ahead on a background thread. Which is faster depends on the
machine: with a GPU the CPU cores are free for the gather and depth wins; on a CPU whose cores the model's
compute already fills, the background work competes with it and depth 0 can win.

The controller measures, on the caller's thread, the seconds from one hand-out to the next (everything the
training loop does per batch), tries each candidate depth in interleaved blocks of batches, keeps the fastest
by median, and probes again every ``reprobe`` batches (conditions change: other jobs, a growing write log, a new epoch's
cold caches). A deeper depth must beat the shallower one by ``margin`` to be kept: depth 0 runs no background
thread and no write log, so on a tie it costs nothing, while a probe of a few short blocks on a busy CPU picks
either of two equal depths at random (measured: a 10-20% slower pipelined depth kept for a whole run). It must
also win a majority of the probe's rounds by that margin: a win of the pooled medians that most rounds do not
show is one disturbed round, not a faster depth (bench_load, link quiet: depth 4 kept where sync was 1.19x
faster). Probing those rounds again instead cost more than it saved: a probe is blocks of alternating depths,
each switch filling or draining the pipeline, and an extended probe ran node-adam-128 at 0.59x the better fixed
depth (bench_load_auto). Deterministic for given timings: unit-testable without a clock.
"""
from __future__ import annotations

import statistics
from typing import Dict, List, Optional, Sequence, Tuple, Union

from ..config import check_positive_int

AUTO_MAX_PREFETCH = 4  # the deepest pipeline prefetch="auto" tries


def resolve_depths(prefetch: Union[int, str], writeback_depth: Optional[int]
                   ) -> Tuple[int, Optional["DepthController"], int]:
    """A loader's ``(prefetch, controller, writeback_depth)``: ``prefetch="auto"`` pipelines up to
    :data:`AUTO_MAX_PREFETCH` batches and a :class:`DepthController` picks 0 or that depth online (None for a
    fixed depth); the write-back queue holds ``max(2, prefetch)`` steps unless given."""
    auto = prefetch == "auto"
    depth = AUTO_MAX_PREFETCH if auto else check_positive_int("prefetch", prefetch)
    controller = DepthController([0, depth]) if auto else None
    wb = check_positive_int("writeback_depth", max(2, depth) if writeback_depth is None else writeback_depth)
    return depth, controller, wb


class DepthController:
    """Pick a depth among ``candidates`` from per-batch caller seconds fed to :meth:`record`.

    A probe runs ``rounds`` interleaved blocks of ``window`` batches per candidate (A B A B ...: a drift of the
    machine's speed hits every candidate alike); the first ``untimed`` batches of a block are not timed (they
    carry the switch: a write-back thread started or stopped, the pipeline filling or draining). By default
    ``untimed`` is the deepest candidate + 1 and ``window`` is ``untimed + 5``: after a switch from depth 0 to k the
    pipeline needs up to k batches to get ahead (each waits for its gather), and after a switch from k to 0 the k
    batches already gathered are handed out without a read; timing those blocks' first batches kept depth 0
    on a GPU where depth 4 was 1.35x faster (H200, node-adam-128: 42 against 57 batches/s). The candidate
    with the lowest median wins if it is deeper only by beating the shallower winner's median by the fraction
    ``margin`` and in a majority of the rounds (each round's medians), until the next probe ``reprobe`` batches
    later.
    """

    def __init__(self, candidates: Sequence[int], window: Optional[int] = None, rounds: int = 3,
                 untimed: Optional[int] = None, warmup: int = 4, reprobe: int = 512, margin: float = 0.05) -> None:
        cands = sorted(set(int(c) for c in candidates), reverse=True)
        if not cands or cands[-1] < 0:
            raise ValueError(f"depth candidates must be integers >= 0, got {list(candidates)}")
        untimed = cands[0] + 1 if untimed is None else untimed
        window = untimed + 5 if window is None else window
        if window < 1 or rounds < 1 or not 0 <= untimed < window or warmup < 0 or reprobe < 1 or not 0 <= margin < 1:
            raise ValueError(f"need window >= 1, rounds >= 1, 0 <= untimed < window, warmup >= 0, reprobe >= 1, "
                             f"0 <= margin < 1; got {window}, {rounds}, {untimed}, {warmup}, {reprobe}, {margin}")
        self.candidates: List[int] = cands  # deepest first: the warm-up runs pipelined
        self.window, self.rounds, self.untimed, self.warmup, self.reprobe = window, rounds, untimed, warmup, reprobe
        self.margin = margin
        self.best = cands[0]
        self.chosen: Dict[int, int] = {}  # depth -> batches handed out at it (for stats)
        self.probe_batches = 0  # batches run inside probes so far (for stats: what choosing costs)
        self._seen = 0
        self._plan: List[Tuple[int, bool, int]] = []  # the probe's remaining batches: (depth, timed, round)
        self._samples: Dict[int, List[List[float]]] = {}  # depth -> each round's timed seconds
        self._since_probe = 0
        self._start_probe()

    def _start_probe(self) -> None:
        self._samples = {c: [[] for _ in range(self.rounds)] for c in self.candidates}
        self._plan = [] if len(self.candidates) < 2 else [
            (c, k >= self.untimed, r) for r in range(self.rounds) for c in self.candidates for k in range(self.window)]
        self._since_probe = 0

    def _winner(self) -> int:
        """The shallowest candidate, replaced by each deeper one that beats it by ``margin`` both in the pooled
        medians and in a majority of the rounds."""
        def pooled(c: int) -> float:
            return statistics.median(x for r in self._samples[c] for x in r)

        best = self.candidates[-1]
        for c in reversed(self.candidates[:-1]):  # shallow to deep
            pairs = list(zip(self._samples[c], self._samples[best]))
            wins = sum(1 for a, b in pairs if statistics.median(a) < statistics.median(b) * (1.0 - self.margin))
            if pooled(c) < pooled(best) * (1.0 - self.margin) and 2 * wins > len(pairs):
                best = c
        return best

    def depth(self) -> int:
        """The depth for the next batch."""
        if self._seen < self.warmup:
            return self.candidates[0]
        return self._plan[0][0] if self._plan else self.best

    def record(self, seconds: float) -> None:
        """One batch's caller seconds (hand-out to hand-out), measured at the depth :meth:`depth` gave."""
        d = self.depth()
        self.chosen[d] = self.chosen.get(d, 0) + 1
        self._seen += 1
        if self._seen <= self.warmup:
            return
        if self._plan:
            depth, timed, r = self._plan.pop(0)
            self.probe_batches += 1
            if timed:
                self._samples[depth][r].append(seconds)
            if not self._plan:
                self.best = self._winner()
            return
        self._since_probe += 1
        if self._since_probe >= self.reprobe:
            self._start_probe()
