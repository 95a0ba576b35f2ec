"""Hole 5 of issue 22: one device, one name. ``torch.device("cuda") != torch.device("cuda:0")``, so the loader
and the tables compare devices only after :func:`dgl_oac.config.normalize_device`."""
import pytest
import torch

import dgl_oac
from dgl_oac.config import normalize_device, resolve_device

from helpers import node_loader, run_epoch

pytestmark = pytest.mark.hang_timeout(60)


@pytest.mark.parametrize("current", [0, 1, 3])
def test_bare_cuda_is_the_current_cuda_device(current):
    assert normalize_device(torch.device("cuda"), lambda: current) == torch.device("cuda", current)


@pytest.mark.parametrize("name, want", [("cuda:0", "cuda:0"), ("cuda:2", "cuda:2"), ("cpu", "cpu"),
                                        ("cpu:0", "cpu")])
def test_named_devices_keep_their_index(name, want):
    def current():
        raise AssertionError("an indexed device must not ask for the current one")
    assert normalize_device(torch.device(name), current) == torch.device(want)


@pytest.mark.parametrize("name", ["cpu", "cpu:0", torch.device("cpu", 0)])
def test_resolve_device_returns_the_one_cpu_name(name):
    assert resolve_device(name) == torch.device("cpu")


def test_two_loaders_naming_the_same_device_differently_share_a_table(graph, make_emb):
    """A training loader on one spelling and an evaluation loader on another, over one table (before the fix:
    ``ValueError: ... already used on cpu, not cpu:0``)."""
    emb = make_emb(graph.num_nodes(), 4)
    opt = dgl_oac.SparseAdagrad([emb], lr=0.1)
    train = node_loader(graph, emb, "oac", device="cpu")
    evaluate = node_loader(graph, emb, "sync", device="cpu:0", shuffle=False)
    assert run_epoch(train, emb, opt, limit=3) == 3
    with torch.no_grad():
        for batch in evaluate:
            assert batch[-1][0].srcdata[emb.name].device == torch.device("cpu")
    assert run_epoch(train, emb, opt, limit=2) == 2
