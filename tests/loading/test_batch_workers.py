"""dgl_oac.loading.workers.BatchWorkers without a graph library: any ``make(b)`` in forked processes, in order, the
stream of making the batches on the caller's thread; a worker's error and a worker's death named; close() ends
every process."""
from __future__ import annotations

import multiprocessing
import os
import signal

import pytest
import torch

from dgl_oac.loading.workers import BatchWorkers


def _batch(seed: int, b: int) -> torch.Tensor:
    return torch.randn(4, generator=torch.Generator().manual_seed(seed * 1000 + b))


def _fails_at_two(b: int) -> int:
    if b == 2:
        raise KeyError("no batch two")
    return b


def test_batches_come_in_order_and_equal_making_them_here_for_any_number_of_workers():
    expected = [_batch(7, b) for b in range(3, 11)]
    for n in (1, 2, 3):
        pool = BatchWorkers(lambda b: _batch(7, b), epoch=0, start=3, num_batches=11, num_workers=n, in_flight=2)
        try:
            got = [pool.get(b) for b in range(3, 11)]
        finally:
            pool.close()
        assert all(torch.equal(a, e) for a, e in zip(got, expected))


def test_a_workers_exception_is_raised_when_its_batch_is_due_naming_the_batch_and_worker():
    pool = BatchWorkers(_fails_at_two, epoch=5, start=0, num_batches=4, num_workers=2, in_flight=4)
    try:
        assert [pool.get(0), pool.get(1)] == [0, 1]
        with pytest.raises(KeyError) as info:
            pool.get(2)
        assert "sampling batch 2 of epoch 5 in sampling worker 0" in "".join(getattr(info.value, "__notes__", []))
    finally:
        pool.close()


def test_a_killed_worker_is_named_with_its_exit_code_and_close_reaps_every_process():
    pool = BatchWorkers(lambda b: b, epoch=0, start=0, num_batches=6, num_workers=2, in_flight=1,
                        activity="making")
    try:
        assert pool.get(0) == 0
        os.kill(pool.pids[1], signal.SIGKILL)
        with pytest.raises(RuntimeError, match=r"making worker 1 \(pid \d+\) died with exit code -9 while making "
                                               r"batch 1 of epoch 0"):
            pool.get(1)
    finally:
        pool.close()
    assert not [p for p in multiprocessing.active_children() if p.name.startswith("dgl-oac-making")]
    pool.close()  # idempotent
    with pytest.raises(RuntimeError, match="workers are closed"):
        pool.get(2)


def test_batches_are_asked_for_in_order():
    pool = BatchWorkers(lambda b: b, epoch=0, start=0, num_batches=3, num_workers=1, in_flight=1)
    try:
        with pytest.raises(RuntimeError, match="asked for batch 1, expected batch 0"):
            pool.get(1)
    finally:
        pool.close()
