"""dgl_oac.engine.table: the CPU row table (value ‖ optimizer state), id checks, file-backed storage."""

import re

import dgl
import pytest
import torch

from dgl_oac.engine.table import RowStore, check_ids

from conftest import unique_name


def filled(num=10, dim=3, **kw):
    return RowStore(num, dim, init_func=lambda t: t.copy_(torch.arange(num * dim, dtype=torch.float32)
                                                          .view(num, dim)), **kw)


# --- round trips -----------------------------------------------------------------------------------------------
def test_default_is_zeros_and_layout():
    s = RowStore(5, 4)
    assert s.table.shape == (5, 4) and s.table.dtype == torch.float32 and s.table.device.type == "cpu"
    assert s.width == 4 and s.state_width == 0
    assert torch.equal(s.table, torch.zeros(5, 4))
    assert s.state().shape == (5, 0)


def test_gather_write_add_round_trip():
    s = filled(10, 3)
    ref = s.table.clone()
    ids = torch.tensor([7, 0, 7, 3])
    assert torch.equal(s.gather(ids), ref[ids])  # duplicates allowed in a gather
    out = torch.full((6, 3), -1.0)
    got = s.gather(ids, out=out)
    assert torch.equal(got, ref[ids]) and got.data_ptr() == out.data_ptr()
    assert torch.equal(out[4:], torch.full((2, 3), -1.0))  # only the first n rows of `out` are used

    wid = torch.tensor([9, 2])
    rows = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    s.write(wid, rows)
    ref[wid] = rows
    assert torch.equal(s.table, ref)
    assert torch.equal(s.gather(wid), rows)

    delta = torch.tensor([[0.5, 0.5, 0.5], [1.0, 1.0, 1.0], [2.0, 2.0, 2.0]])
    s.add(torch.tensor([1, 9, 1]), delta)  # add accumulates duplicates (index_add_)
    ref[1] += delta[0] + delta[2]
    ref[9] += delta[1]
    assert torch.equal(s.table, ref)


def test_value_and_state_are_views():
    s = filled(4, 2)
    s.widen(3)
    s.value()[1] = 42.0
    s.state()[2] = 7.0
    assert torch.equal(s.table[1, :2], torch.full((2,), 42.0))
    assert torch.equal(s.table[2, 2:], torch.full((3,), 7.0))


# --- widen -----------------------------------------------------------------------------------------------------
def test_widen_keeps_values_and_zeroes_state():
    s = filled(6, 2)
    values = s.table.clone()
    s.widen(5)
    assert s.table.shape == (6, 7) and s.width == 7 and s.state_width == 5
    assert torch.equal(s.value(), values)
    assert torch.equal(s.state(), torch.zeros(6, 5))
    s.state()[:] = 1.0
    s.widen(5)  # same width: no-op, state untouched
    assert torch.equal(s.state(), torch.ones(6, 5))
    with pytest.raises(RuntimeError, match="already holds 5 optimizer-state columns"):
        s.widen(3)


# --- init_func -------------------------------------------------------------------------------------------------
def test_init_func_sees_the_whole_table_in_memory():
    """One call on the [N, D] table, as DGL's NodeEmbedding does (not per chunk: a seeded init_func that reseeds
    on every call would repeat its rows every chunk)."""
    shapes = []

    def init(t):
        shapes.append(tuple(t.shape))
        t.copy_(torch.arange(t.numel(), dtype=torch.float32).view(t.shape))  # in place, returns None

    s = RowStore(23, 2, init_func=init)
    assert shapes == [(23, 2)]
    assert torch.equal(s.value(), torch.arange(46, dtype=torch.float32).view(23, 2))


def test_file_backed_init_func_chunked_in_row_order(tmp_path):
    s = RowStore(23, 2, storage=tmp_path / "t.bin")
    shapes = []

    def init(t):
        shapes.append(tuple(t.shape))
        t.fill_(float(len(shapes)))

    s._init_values(init, chunk=7)
    assert shapes == [(7, 2), (7, 2), (7, 2), (2, 2)]
    expect = torch.repeat_interleave(torch.tensor([1.0, 2.0, 3.0, 4.0]), torch.tensor([7, 7, 7, 2]))
    assert torch.equal(s.value(), expect.unsqueeze(1).expand(23, 2))


def test_global_rng_init_gives_dgls_table_in_memory_and_in_chunks(tmp_path):
    """An init_func drawing from torch's global RNG: after the same torch.manual_seed, the in-memory table, a
    file-backed table filled in chunks, and dgl.nn.NodeEmbedding's table are equal."""
    def init(t):
        return t.uniform_(-1, 1)

    torch.manual_seed(5)
    ref = dgl.nn.NodeEmbedding(23, 2, unique_name("dgl"), init_func=init).weight.clone()
    torch.manual_seed(5)
    memory = RowStore(23, 2, init_func=init)
    torch.manual_seed(5)
    chunked = RowStore(23, 2, storage=tmp_path / "t.bin")
    chunked._init_values(init, chunk=7)
    assert torch.equal(memory.value(), ref) and torch.equal(chunked.value(), ref)


@pytest.mark.parametrize("file_backed", [False, True])
def test_init_func_may_return_a_new_tensor(tmp_path, file_backed):
    storage = tmp_path / "t.bin" if file_backed else "memory"
    s = RowStore(4, 3, init_func=lambda t: torch.ones(t.shape[0], 3) * 2, storage=storage)
    assert torch.equal(s.table, torch.full((4, 3), 2.0))


@pytest.mark.parametrize("bad", [lambda t: torch.zeros(3, 3), lambda t: torch.zeros(4, 2), lambda t: t.view(-1)])
def test_init_func_shape_error(bad):
    with pytest.raises(ValueError, match=r"init_func returned shape .*, expected \(4, 3\)"):
        RowStore(4, 3, init_func=bad)


@pytest.mark.parametrize("num,dim", [(0, 3), (3, 0), (-1, 2)])
def test_empty_table_rejected(num, dim):
    with pytest.raises(ValueError, match="num_rows > 0 and dim > 0"):
        RowStore(num, dim)


# --- file-backed -----------------------------------------------------------------------------------------------
def reopen(path, num, width):
    return torch.from_file(str(path), shared=False, size=num * width, dtype=torch.float32).view(num, width)


def test_file_backed_reads_back_after_reopen(tmp_path):
    path = tmp_path / "t.bin"
    s = filled(10, 3, storage=path)
    assert s.path == path and path.stat().st_size == 10 * 3 * 4
    s.write(torch.tensor([4]), torch.tensor([[-1.0, -2.0, -3.0]]))
    s.add(torch.tensor([0]), torch.ones(1, 3))
    s.sync_to_disk()
    assert torch.equal(reopen(path, 10, 3), s.table)


def test_existing_table_file_is_never_overwritten(tmp_path):
    path = tmp_path / "t.bin"
    s = filled(10, 3, storage=path)
    s.sync_to_disk()
    before = path.read_bytes()
    with pytest.raises(FileExistsError, match=f"table file {re.escape(str(path))} already exists \\(120 bytes\\)"):
        filled(10, 3, storage=path)
    assert path.read_bytes() == before
    path.write_bytes(b"")  # an empty file (e.g. from mktemp) is fine to use
    assert filled(4, 3, storage=path).table.shape == (4, 3)


def test_file_backed_widen_replaces_file(tmp_path):
    path = tmp_path / "sub" / "t.bin"  # parent folders are created
    s = filled(8, 2, storage=path)
    values = s.table.clone()
    s.widen(3)
    assert path.stat().st_size == 8 * 5 * 4
    assert not (tmp_path / "sub" / "t.bin.widen").exists()
    s.state()[3] = 9.0
    s.value()[5] = -4.0
    s.sync_to_disk()
    back = reopen(path, 8, 5)
    values[5] = -4.0
    assert torch.equal(back[:, :2], values)
    expect_state = torch.zeros(8, 3)
    expect_state[3] = 9.0
    assert torch.equal(back[:, 2:], expect_state)


def test_memory_sync_to_disk_is_noop():
    s = filled(3, 2)
    s.sync_to_disk()
    assert s.path is None


# --- check_ids -------------------------------------------------------------------------------------------------
def test_check_ids_accepts_int64_in_range():
    check_ids(torch.tensor([0, 9, 3]), 10)
    check_ids(torch.empty(0, dtype=torch.int64), 10)


@pytest.mark.parametrize("dtype", [torch.int32, torch.float32, torch.uint8])
def test_check_ids_wrong_dtype(dtype):
    with pytest.raises(TypeError, match=f"ids must have dtype torch.int64, got {dtype}"):
        check_ids(torch.tensor([1, 2], dtype=dtype), 10)


def test_check_ids_not_a_tensor():
    with pytest.raises(TypeError, match="must be a torch.Tensor of int64 node ids, got list"):
        check_ids([1, 2], 10)


def test_check_ids_two_dimensional():
    with pytest.raises(ValueError, match=r"my ids must be 1-D, got shape \(2, 2\)"):
        check_ids(torch.tensor([[0, 1], [2, 3]]), 10, "my ids")


@pytest.mark.parametrize("ids,bad", [([0, -1, 4], -1), ([3, 10, 2], 10), ([-5, 12], -5), ([2, 99], 99)])
def test_check_ids_out_of_range_names_id_and_range(ids, bad):
    with pytest.raises(IndexError) as err:
        check_ids(torch.tensor(ids), 10, "seeds")
    msg = str(err.value)
    assert f"found id {bad}" in msg and "valid ids are 0..9" in msg and msg.startswith("seeds")


def test_a_file_table_is_out_of_core_only_past_half_the_memory_limit(tmp_path, monkeypatch):
    from dgl_oac.engine import table as table_module

    assert table_module.memory_limit() >= 1 << 20  # this machine's, read from /proc
    store = table_module.RowStore(1000, 16, storage=tmp_path / "t.bin")  # 64,000 bytes
    monkeypatch.setattr(table_module, "memory_limit", lambda: 128_000)
    assert not store.out_of_core  # exactly half: fits
    monkeypatch.setattr(table_module, "memory_limit", lambda: 127_999)
    assert store.out_of_core
    assert not table_module.RowStore(1000, 16).out_of_core  # in memory: never
