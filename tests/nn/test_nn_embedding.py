"""``dgl_oac.nn.Embedding`` as a module: torch's initial values, ids of any shape, state_dict, the
``parameters()`` story and clear errors for bad input."""
from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import dgl_oac
import dgl_oac.nn as oac_nn

N, DIM = 40, 3


def pair(seed: int = 0):
    """A torch Embedding and a drop-in built after the same seed (so with the same N(0, 1) table)."""
    torch.manual_seed(seed)
    ref = nn.Embedding(N, DIM, sparse=True)
    torch.manual_seed(seed)
    return ref, oac_nn.Embedding(N, DIM, sparse=True)


def test_initial_table_is_torchs_for_the_same_seed():
    ref, emb = pair(3)
    assert torch.equal(emb.weight, ref.weight.detach())
    assert isinstance(dgl_oac.nn.Embedding, type)  # reachable as an attribute after import dgl_oac


@pytest.mark.parametrize("make_ids", [
    lambda: torch.tensor(7),                                        # 0-d: one row, shape [D]
    lambda: torch.tensor([3, 3, 0, 39]),                            # 1-D with duplicates
    lambda: torch.arange(12).view(3, 4) % 5,                        # 2-D
    lambda: torch.randint(0, N, (2, 3, 4)),                         # 3-D
    lambda: torch.randint(0, N, (6, 5)).t(),                        # non-contiguous (transposed)
    lambda: torch.randint(0, N, (20,))[::3],                        # non-contiguous 1-D view
    lambda: torch.randint(0, N, (4,))[:, None].expand(4, 3),        # stride 0
    lambda: torch.randint(0, N, (3, 2), dtype=torch.int32),         # IntTensor, as torch accepts
    lambda: torch.empty(0, 2, dtype=torch.int64),                   # empty
])
def test_forward_any_shape_matches_torch(make_ids):
    ref, emb = pair()
    ids = make_ids()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = emb(ids)
    want = ref(ids)
    assert out.shape == want.shape == (*ids.shape, DIM)
    assert torch.equal(out.detach(), want.detach())


def test_parameters_story():
    """One empty, frozen handle: a sparse optimizer finds the table through it; torch's dense optimizers given
    model.parameters() skip it (never a gradient) and train the rest."""
    torch.manual_seed(0)
    model = nn.ModuleDict({"emb": oac_nn.Embedding(N, DIM), "lin": nn.Linear(DIM, 1)})
    params = list(model.parameters())
    handles = [p for p in params if isinstance(p, oac_nn.TableHandle)]
    assert len(handles) == 1 and handles[0].numel() == 0 and not handles[0].requires_grad
    assert handles[0].table is model["emb"].node_embedding
    assert list(oac_nn.sparse_parameters(model)) == handles
    assert {id(p) for p in oac_nn.dense_parameters(model)} == {id(p) for p in model["lin"].parameters()}
    dense = torch.optim.Adam(model.parameters(), lr=0.1)  # the unchanged torch line
    sparse = oac_nn.SparseAdam(model["emb"].parameters(), lr=0.1)
    before_lin, before_emb = model["lin"].weight.detach().clone(), model["emb"].weight.clone()
    loss = model["lin"](model["emb"](torch.tensor([[1, 2], [2, 5]]))).sum()
    dense.zero_grad()
    sparse.zero_grad()
    loss.backward()
    dense.step()
    sparse.step()
    assert not torch.equal(model["lin"].weight.detach(), before_lin)
    moved = (model["emb"].weight != before_emb).any(1).nonzero().flatten().tolist()
    assert moved == [1, 2, 5]
    assert handles[0].numel() == 0 and handles[0].grad is None


@pytest.mark.parametrize("params", [
    lambda a, b, model: model.parameters(),  # node2vec-style: a model made of embeddings only
    lambda a, b, model: [a, b],
    lambda a, b, model: [a.node_embedding, b.handle],
    lambda a, b, model: [{"params": model.parameters()}],
    lambda a, b, model: list(model.parameters()) + [a.handle],  # a table named twice is trained once
])
def test_optimizers_take_modules_handles_tables_and_groups(params):
    a, b = oac_nn.Embedding(N, DIM), oac_nn.Embedding(N, DIM)
    opt = oac_nn.SGD(params(a, b, nn.Sequential(a, b)), lr=0.1)
    assert [t.name for t in opt._params] == [a.name, b.name]


@pytest.mark.parametrize("bad, error, match", [
    (lambda e: e(torch.tensor([1.0, 2.0])), TypeError, "must be torch.int64 or torch.int32"),
    (lambda e: e([1, 2]), TypeError, "takes a tensor of ids, got list"),
    (lambda e: e(torch.tensor([[0, N]])), IndexError, f"found id {N}, valid ids are 0..{N - 1}"),
    (lambda e: e(torch.tensor([-1])), IndexError, "found id -1"),
    (lambda e: oac_nn.SparseAdam([nn.Linear(2, 2).weight]), TypeError,
     "dense tensor of shape \\(2, 2\\).*dense_parameters"),
    (lambda e: oac_nn.SparseAdam(nn.Linear(2, 2).parameters()), TypeError, "dense tensor"),
    (lambda e: oac_nn.SparseAdam([]), ValueError, "empty parameter list"),
    (lambda e: oac_nn.SparseAdam([{"params": e.parameters(), "lr": 0.1}]), ValueError, "per-group options \\['lr'\\]"),
    (lambda e: oac_nn.SGD(e.parameters(), lr=0.1, momentum=0.9), ValueError, "plain SGD"),
    (lambda e: oac_nn.Adagrad(e.parameters(), weight_decay=0.1), ValueError, "not compatible with sparse"),
    (lambda e: oac_nn.SparseAdam(e.parameters(), betas=(1.0, 0.9)), ValueError, "betas must lie in"),
    (lambda e: oac_nn.Embedding(N, DIM, sparse=False), ValueError, "sparse=True"),
    (lambda e: oac_nn.Embedding(N, DIM, scale_grad_by_freq=True), NotImplementedError, "scale_grad_by_freq"),
    (lambda e: oac_nn.Embedding(N, DIM, 0), TypeError, "third argument is sparse"),  # torch's padding_idx there
    (lambda e: oac_nn.Embedding(N, DIM, dtype=torch.float64), ValueError, "float32 rows"),
    (lambda e: oac_nn.Embedding.from_pretrained(torch.zeros(3)), ValueError, "2-D float tensor"),
])
def test_bad_input_is_a_clear_error(bad, error, match):
    emb = oac_nn.Embedding(N, DIM)
    with pytest.raises(error, match=match):
        bad(emb)


def test_state_dict_is_torchs():
    """``weight`` both ways: a torch Embedding's state loads into the drop-in and back, as in a model."""
    ref, _ = pair(1)
    emb = oac_nn.Embedding(N, DIM, init=torch.nn.init.zeros_)
    assert list(emb.state_dict()) == ["weight"]
    emb.load_state_dict(ref.state_dict())
    assert torch.equal(emb.weight, ref.weight.detach())
    back = nn.Embedding(N, DIM, sparse=True)
    back.load_state_dict(emb.state_dict())
    assert torch.equal(back.weight.detach(), ref.weight.detach())
    model = nn.Sequential(oac_nn.Embedding(N, DIM), nn.Linear(DIM, 2))
    twin = nn.Sequential(nn.Embedding(N, DIM), nn.Linear(DIM, 2))
    twin.load_state_dict(model.state_dict())  # the same keys as torch's model: checkpoints move both ways
    assert torch.equal(twin[0].weight.detach(), model[0].weight)
    with pytest.raises(RuntimeError, match="shape"):
        emb.load_state_dict({"weight": torch.zeros(N + 1, DIM)})
    with pytest.raises(RuntimeError, match="Unexpected key.*extra"):
        emb.load_state_dict({"weight": ref.weight.detach(), "extra": torch.zeros(1)})


def test_from_pretrained_and_freeze():
    values = torch.randn(N, DIM)
    frozen = oac_nn.Embedding.from_pretrained(values)  # torch's default: frozen
    assert torch.equal(frozen.weight, values) and not frozen(torch.tensor([1, 2])).requires_grad
    trained = oac_nn.Embedding.from_pretrained(values, freeze=False, name="pretrained_trained")
    assert trained.name == "pretrained_trained" and trained(torch.tensor([1, 2])).requires_grad


def test_copy_and_pickle_are_clear_errors():
    import copy
    import pickle

    emb = oac_nn.Embedding(N, DIM, name="not_copied")
    for attempt in (lambda: copy.deepcopy(nn.Sequential(emb)), lambda: pickle.dumps(emb)):
        with pytest.raises(TypeError, match="'not_copied' cannot be copied or pickled.*state_dict"):
            attempt()


def test_device_of_the_rows():
    emb = oac_nn.Embedding(N, DIM, device="cpu")
    assert emb(torch.tensor([1])).device == torch.device("cpu")
    assert oac_nn.Embedding(N, DIM)(torch.tensor([1])).device == torch.device("cpu")  # the ids' device


def test_reachable_after_import_dgl_oac():
    """``dgl_oac.nn`` is an attribute after ``import dgl_oac`` alone (a lazy subpackage, as dgl_oac.app)."""
    import subprocess
    import sys

    code = "import dgl_oac; print(dgl_oac.nn.Embedding(5, 2).weight.shape, dgl_oac.nn.SparseAdam.__module__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["torch.Size([5,", "2])", "dgl_oac.nn.optim"]


def test_datasets_are_reachable_and_the_old_name_says_where():
    """``dgl_oac.app.data.load`` after ``import dgl_oac`` alone; ``dgl_oac.data`` (issue 25's smaller item: it
    raised a bare AttributeError) names where the datasets live."""
    import subprocess
    import sys

    code = "import dgl_oac; print(dgl_oac.app.data.load.__module__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[-1].startswith("dgl_oac.app.data")
    import dgl_oac
    with pytest.raises(AttributeError, match=r"'data' \(did you mean dgl_oac\.app\.data\?\)"):
        dgl_oac.data  # noqa: B018
    assert not hasattr(dgl_oac, "no_such_thing")
