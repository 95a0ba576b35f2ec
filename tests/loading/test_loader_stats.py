"""``loader.stats`` (:class:`~dgl_oac.loading.stats.LoaderStats`) says what it knows (issue 38): async does not
validate, so its conflict rate is unknown (None), never 0.0; oac's is reported with the depths it was measured at;
and the CLI's ``pipeline:`` line says the same."""
from __future__ import annotations

import torch

from dgl_oac.app.cli_train import pipeline_line
from dgl_oac.loading.stats import LoaderStats


def _counted(mode):
    stats = LoaderStats(mode=mode, batches=4, committed=4, rows_read=200, max_in_flight=2, depths={4: 3, 0: 1})
    stats.add_patched(torch.tensor(30))
    return stats


def test_async_conflict_rate_is_unknown_not_zero():
    stats = _counted("async")
    assert stats.conflict_rate is None and stats.as_dict()["conflict_rate"] is None
    assert "conflict_rate=None (async does not validate)" in repr(stats)
    assert "conflict_rate=0" not in repr(stats)


def test_oac_conflict_rate_with_the_depths():
    stats = _counted("oac")
    assert stats.conflict_rate == 30 / 200 and stats.as_dict()["conflict_rate"] == 30 / 200
    assert stats.as_dict()["mode"] == "oac" and stats.as_dict()["depths"] == {4: 3, 0: 1}
    text = repr(stats)
    assert "conflict_rate=0.150" in text and "depths={0: 1, 4: 3}" in text
    assert LoaderStats(mode="sync").conflict_rate == 0.0  # nothing read: no division


def test_pipeline_line_per_mode():
    line = pipeline_line("oac", "auto", _counted("oac").as_dict())
    assert line.startswith("pipeline: conflict rate 0.150 (30 of 200 rows read stale, all patched)")
    assert "at the depths prefetch=auto chose (0 for 1 batch, 4 for 3 batches)" in line
    assert "grows with the depth" in line
    fixed = dict(_counted("oac").as_dict(), depths={})
    assert "at prefetch 2;" in pipeline_line("oac", 2, fixed)
    line = pipeline_line("async", "auto", _counted("async").as_dict())
    assert line.startswith("pipeline: conflict rate unknown (async does not validate its reads)")
    assert "0.0" not in line
    assert pipeline_line("sync", "auto", _counted("sync").as_dict()) == ""  # sync reads after every step
    assert pipeline_line("oac", "auto", None) == ""  # --mode dgl: DGL's loader has no stats


def test_patched_counts_move_to_their_device_without_a_copy():
    """The first device count takes the CPU total as a number (regression: a blocking CPU->device copy of the
    counter, a host sync under ``sync_debug("error")``); "meta" stands in for a GPU here."""
    from dgl_oac.engine.syncaudit import SyncAudit

    stats = LoaderStats(mode="oac")
    stats.add_patched(torch.tensor(30))
    with SyncAudit() as audit:
        stats.add_patched(torch.tensor(5, device="meta"))
        stats.add_patched(torch.tensor(2, device="meta"))
    assert audit.records == [] and stats._patched.device.type == "meta"
