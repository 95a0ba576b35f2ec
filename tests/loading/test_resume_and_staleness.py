"""What every loader gets from the loading layer (dgl_oac.loading.base.LoaderBase), shown on BatchLoader, which has
no graph: resume (state_dict, load_state_dict, and a checkpoint's loader=) ends bitwise where the uninterrupted
run ends, and async's staleness rules run on its batches as on DataLoader's."""
import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader as TorchLoader

import dgl_oac
from dgl_oac.baselines.staleness import GapAware, LookAhead
from dgl_oac.checkpoint import load_checkpoint, save_checkpoint

from conftest import seeded_init

pytestmark = [pytest.mark.hang_timeout(120)]
N, D, PAIRS = 60, 4, 240


class Run:
    """A skip-gram-like loop over a shuffled torch DataLoader of (head, tail) pairs (its shuffle draws from the
    generator states BatchLoader gives its source); the tables start from ``init``."""

    def __init__(self, mode: str, init: int, prefetch: int = 2, staleness=None, opt_cls=dgl_oac.SparseAdam):
        pairs = torch.randint(0, N, (PAIRS, 2), generator=torch.Generator().manual_seed(3))
        self.source = TorchLoader(pairs, batch_size=16, shuffle=True)
        self.emb = dgl_oac.NodeEmbedding(N, D, "resume", seeded_init(init))
        self.opt = opt_cls([self.emb], lr=0.05)
        self.loader = dgl_oac.BatchLoader(self.source, ids={self.emb: lambda b: b}, mode=mode, prefetch=prefetch,
                                          seed=11, staleness=staleness)

    def step(self, batch: torch.Tensor) -> None:
        x = self.emb(batch.reshape(-1)).reshape(*batch.shape, D)
        (-F.logsigmoid((x[:, 0] * x[:, 1]).sum(-1)).mean()).backward()
        self.opt.step()

    def train(self, epochs: int, stop_at=None) -> None:
        """Train until ``epochs`` epochs are done, or return at ``stop_at = (epoch, i)`` right after batch i's
        step."""
        while self.loader.state_dict()["epoch"] < epochs:
            epoch = self.loader.state_dict()["epoch"]
            for i, batch in enumerate(self.loader):
                self.step(batch)
                if (epoch, i) == stop_at:
                    return

    def table(self) -> torch.Tensor:
        return torch.cat([self.emb.weight, self.emb.optm_state], 1).clone()

    def close(self) -> None:
        self.loader.close()
        self.emb.close()


@pytest.mark.parametrize("mode", ["sync", "oac"])
def test_batch_loader_resumed_from_a_checkpoint_ends_bitwise_where_the_uninterrupted_run_ends(mode, tmp_path):
    ref = Run(mode, init=1)
    ref.train(epochs=2)
    expected = ref.table()
    ref.close()

    first = Run(mode, init=1)
    first.train(epochs=2, stop_at=(0, 6))
    saved = first.loader.state_dict()
    assert saved == {"seed": 11, "epoch": 0, "position": 7}
    save_checkpoint(tmp_path / "c.ckpt", [first.emb], first.opt, loader=first.loader)
    first.close()

    resumed = Run(mode, init=2)  # other initial values: everything comes from the checkpoint
    load_checkpoint(tmp_path / "c.ckpt", [resumed.emb], resumed.opt, loader=resumed.loader)
    assert resumed.loader.state_dict() == saved
    resumed.train(epochs=2)
    assert torch.equal(resumed.table(), expected)
    assert resumed.loader.state_dict() == {"seed": 11, "epoch": 2, "position": 0}
    resumed.close()


def test_a_batch_handed_out_and_not_stepped_is_handed_out_again_after_resume(tmp_path):
    ref = Run("oac", init=1)
    ref.train(epochs=1)
    expected = ref.table()
    ref.close()

    first = Run("oac", init=1)
    it = iter(first.loader)
    for _ in range(4):
        first.step(next(it))
    held = next(it)  # handed out, never stepped: not done
    assert first.loader.state_dict()["position"] == 4
    save_checkpoint(tmp_path / "c.ckpt", [first.emb], first.opt, loader=first.loader)
    first.close()

    again = Run("oac", init=2)
    load_checkpoint(tmp_path / "c.ckpt", [again.emb], again.opt, loader=again.loader)
    it = iter(again.loader)
    assert torch.equal(next(it), held)
    again.step(held)
    for batch in it:
        again.step(batch)
    assert torch.equal(again.table(), expected)
    again.close()


def test_resume_with_a_pull_thread_starts_its_count_at_the_position():
    """The source's thread numbers its items from the resumed position (a source of its own states, as
    ``pull_thread`` asks: here a fixed list)."""
    source = [torch.randint(0, N, (16, 2), generator=torch.Generator().manual_seed(i)) for i in range(9)]
    emb = dgl_oac.NodeEmbedding(N, D, "pulled", seeded_init(1))
    loader = dgl_oac.BatchLoader(source, ids={emb: lambda b: b}, mode="oac", prefetch=2, seed=11, pull_thread=True)
    loader.load_state_dict({"seed": 11, "epoch": 0, "position": 5})
    rest = list(loader)
    assert len(rest) == 4 and all(torch.equal(a, b) for a, b in zip(rest, source[5:]))
    assert loader.state_dict() == {"seed": 11, "epoch": 1, "position": 0}
    loader.close()
    emb.close()


@pytest.mark.parametrize("staleness,rule", [("gap", GapAware), ("lookahead", LookAhead)])
def test_batch_loader_runs_async_staleness_rules(staleness, rule):
    """The rules are made for the loader's tables and act on its batches: at prefetch 4 they bring stale rows
    up (the commit re-patches them) and change what async trains, which plain async does not."""
    plain = Run("async", init=1, prefetch=4)
    plain.train(epochs=1)
    plain_table = plain.table()
    assert plain.loader.stats.rows_repatched_at_commit == 0
    plain.close()

    ruled = Run("async", init=1, prefetch=4, staleness=staleness)
    assert isinstance(ruled.loader.rules[0], rule)
    ruled.train(epochs=1)
    assert ruled.loader.stats.committed == len(ruled.loader)
    assert ruled.loader.stats.rows_repatched_at_commit > 0
    assert not torch.equal(ruled.table(), plain_table)
    ruled.close()


def test_staleness_outside_async_is_refused_naming_the_mode():
    emb = dgl_oac.NodeEmbedding(N, D, "refused", seeded_init(1))
    with pytest.raises(ValueError, match="staleness"):
        dgl_oac.BatchLoader([torch.tensor([1, 2])], ids={emb: lambda b: b}, mode="oac", staleness="gap")
    emb.close()
