"""The loading layer's contract (dgl_oac.loading): an epoch driven by any BatchSource through LoaderBase trains
the same bits in every mode and calls only the source; the mark an epoch leaves on the input nodes it hands out
(dgl_oac.unpipelined) names the epoch while it runs, and never travels with a copy. No graph library."""
from __future__ import annotations

import copy
import io
import pickle
import warnings
from typing import Any, Iterator, List

import pytest
import torch

import dgl_oac
from dgl_oac.engine.pipeline import validate_rows
from dgl_oac.loading.stats import LoaderStats
from dgl_oac.loading.base import LoaderBase
from dgl_oac.loading.settings import LoaderSettings
from dgl_oac.loading.source import END, BatchSource
from dgl_oac.unpipelined import handed_out_by

from conftest import seeded_init

pytestmark = [pytest.mark.hang_timeout(60)]
N, D = 30, 4
BATCHES = [torch.randint(0, N, (12,), generator=torch.Generator().manual_seed(b)) for b in range(9)]


class ListSource:
    """A BatchSource over a list of id tensors; records what the epoch asked of it."""

    def __init__(self, loader: "ListLoader") -> None:
        self.loader, self.pulled, self.held = loader, [], None

    def pull(self, b: int) -> Any:
        self.pulled.append(b)
        return BATCHES[b] if b < len(BATCHES) else END

    def table_ids(self, batch: torch.Tensor) -> List[torch.Tensor]:
        return [torch.unique(batch)]

    def hand_out(self, batch: torch.Tensor, rows: list, listener: Any) -> Any:
        s = self.loader.settings
        self.held = [h.leaf for h in validate_rows(rows, [self.loader.embeddings[0].pipeline], s.mode,
                                                   s.check_finite, self.loader.stats, listener)]
        return torch.unique(batch), self.held[0]

    def handed_ids(self, out: Any) -> Any:
        return out[0]

    def retire(self) -> None:
        self.held = None


class ListLoader(LoaderBase):
    """A loader of BATCHES for one table, of unknown length (the source's END ends each epoch)."""

    def __init__(self, emb: dgl_oac.NodeEmbedding, mode: str) -> None:
        super().__init__(LoaderSettings.resolve(mode, None, 3, None, "auto", None, "normal"), [emb],
                         LoaderStats(mode=mode))
        self.sources: List[ListSource] = []

    def __iter__(self) -> Iterator[Any]:
        self.close()
        self.prepare_tables()
        self.sources.append(ListSource(self))
        assert isinstance(self.sources[-1], BatchSource)
        return self.start_epoch(self.sources[-1], len(self.sources) - 1, 0, float("inf"))


def train(mode: str) -> tuple:
    emb = dgl_oac.NodeEmbedding(N, D, f"loading-{mode}", seeded_init(4))
    opt = dgl_oac.SparseAdam([emb], lr=0.05)
    loader = ListLoader(emb, mode)
    for _ in range(2):
        for ids, rows in loader:
            (rows * (ids.float() + 1).unsqueeze(1)).square().sum().backward()
            opt.step()
    out = emb.weight.clone(), loader.stats, loader.sources
    emb.close()
    return out


def test_an_epoch_of_any_batch_source_trains_the_bits_of_sync():
    sync, sync_stats, _ = train("sync")
    table, stats, sources = train("oac")
    assert torch.equal(table, sync)
    assert stats.batches == stats.committed == sync_stats.batches == 2 * len(BATCHES)
    assert stats.rows_read == sync_stats.rows_read
    for source in sources:  # batches in order, each pulled once, END asked for once; nothing held after
        assert source.pulled == list(range(len(BATCHES) + 1))
        assert source.held is None


def test_the_settings_are_checked_once_and_frozen():
    with pytest.raises(ValueError, match="mode"):
        LoaderSettings.resolve("fast", None, 1, None, "auto", None, "idle")
    s = LoaderSettings.resolve("oac", None, "auto", None, "auto", None, "idle")
    assert s.depth_controller is not None and s.table_mode == "oac" and s.device == torch.device("cpu") and s.check_finite
    with pytest.raises(AttributeError):
        s.mode = "sync"  # type: ignore[misc]
    emb = dgl_oac.NodeEmbedding(N, D, "loading-settings", seeded_init(1))
    loader = ListLoader(emb, "oac")
    assert (loader.mode, loader.prefetch, loader.settings.depth_controller) == ("oac", 3, None)
    with pytest.raises(AttributeError, match="read-only"):
        loader.prefetch = 1
    emb.close()


def first_batch(name: str) -> tuple:
    """A BatchLoader of id tuples that carries one table and not another; its epoch, and the first batch's ids."""
    carried = dgl_oac.NodeEmbedding(N, D, f"{name}-carried", seeded_init(1))
    other = dgl_oac.NodeEmbedding(N, D, f"{name}-other", seeded_init(2))
    loader = dgl_oac.BatchLoader([(torch.arange(b, b + 5),) for b in range(3)], ids={carried: lambda b: b[0]},
                                 mode="oac", prefetch=1)
    it = iter(loader)
    (ids,) = next(it)
    return carried, other, loader, it, ids


def test_a_read_of_input_nodes_the_loader_does_not_carry_warns_only_while_the_epoch_runs():
    carried, other, loader, it, ids = first_batch("loading-warn")
    with pytest.warns(UserWarning, match="does not carry it"):
        other(ids)
    fresh = dgl_oac.NodeEmbedding(N, D, "loading-fresh", seeded_init(3))  # has not warned yet
    (ids,) = next(it)
    loader.close()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fresh(ids)  # the epoch ended: an ordinary read
    for emb in (carried, other, fresh):
        emb.close()


def test_handed_out_input_nodes_copy_and_save_without_their_mark():
    emb, other, loader, it, ids = first_batch("loading-copy")
    buf = io.BytesIO()
    torch.save(ids, buf)
    buf.seek(0)
    for copied in (copy.deepcopy(ids), pickle.loads(pickle.dumps(ids)), torch.load(buf, weights_only=True)):
        assert torch.equal(copied, ids)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            other(copied)  # another tensor: not the epoch's hand-out
    (nxt,) = next(it)
    assert handed_out_by(nxt) is not None and handed_out_by(ids) is None  # only the latest hand-out is marked
    loader.close()
    assert handed_out_by(nxt) is None
    emb.close()
    other.close()
