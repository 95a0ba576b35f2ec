"""dgl_oac.config: "auto" settings resolved in one function each, with errors that say what was wrong."""
import re
from pathlib import Path

import pytest
import torch

from dgl_oac.config import (MODES, check_lr, check_mode, check_positive_int, mirror_from_env, optional_seed,
                            resolve_device, resolve_pin, row_timeout_from_env)

HAS_CUDA = torch.cuda.is_available()


@pytest.mark.parametrize("auto", [None, "auto"])
def test_resolve_device_auto(auto):
    # a resolved CUDA device names its index (normalize_device: torch says cuda != cuda:0)
    assert resolve_device(auto) == (torch.device("cuda", torch.cuda.current_device()) if HAS_CUDA
                                    else torch.device("cpu"))


@pytest.mark.parametrize("dev", ["cpu", torch.device("cpu"), "cpu:0"])
def test_resolve_device_cpu(dev):
    assert resolve_device(dev).type == "cpu"


@pytest.mark.parametrize("dev", ["tpu", "gpu", "cuda:x", ""])
def test_resolve_device_unknown_name(dev):
    with pytest.raises(ValueError, match="unknown device") as err:
        resolve_device(dev)
    assert repr(dev) in str(err.value)
    assert "'cpu'" in str(err.value) and "'cuda'" in str(err.value)  # says what is accepted


@pytest.mark.parametrize("dev", ["meta", "mps", torch.device("meta")])
def test_resolve_device_unsupported_type(dev):
    with pytest.raises(ValueError, match="unsupported device .*'cpu' or 'cuda'"):
        resolve_device(dev)


def test_resolve_device_not_a_device():
    with pytest.raises(ValueError, match="unknown device 3.5"):
        resolve_device(3.5)


@pytest.mark.skipif(HAS_CUDA, reason="checks the no-CUDA error")
@pytest.mark.parametrize("dev", ["cuda", "cuda:0", torch.device("cuda", 1)])
def test_resolve_device_cuda_missing(dev):
    with pytest.raises(ValueError, match="CUDA is not available"):
        resolve_device(dev)


@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
def test_resolve_device_cuda_index_out_of_range():
    n = torch.cuda.device_count()
    assert resolve_device("cuda") == torch.device("cuda", torch.cuda.current_device())
    with pytest.raises(ValueError, match=f"does not exist: {n} CUDA device"):
        resolve_device(f"cuda:{n}")


@pytest.mark.parametrize("pin", [None, "auto"])
def test_resolve_pin_auto(pin):
    assert resolve_pin(pin, torch.device("cpu")) is False
    assert resolve_pin(pin, torch.device("cuda")) is HAS_CUDA


def test_resolve_pin_explicit():
    assert resolve_pin(False, torch.device("cpu")) is False
    if HAS_CUDA:
        assert resolve_pin(True, torch.device("cuda")) is True
    else:
        with pytest.raises(ValueError, match="pin=True needs CUDA"):
            resolve_pin(True, torch.device("cpu"))


@pytest.mark.parametrize("pin", ["yes", 1, 0, "true"])
def test_resolve_pin_rejects_non_bool(pin):
    with pytest.raises(ValueError, match=f"pin must be True, False or 'auto', got {pin!r}"):
        resolve_pin(pin, torch.device("cpu"))


def test_check_mode():
    assert MODES == ("sync", "async", "oac")
    for m in MODES:
        assert check_mode(m) == m
    for bad in ["OAC", "fast", ""]:
        with pytest.raises(ValueError, match=f"unknown mode {bad!r}: expected one of sync, async, oac"):
            check_mode(bad)


def test_check_positive_int():
    assert check_positive_int("prefetch", 3) == 3
    assert check_positive_int("depth", 0, minimum=0) == 0
    for bad in [0, -1, 2.0, True, "4", None]:
        with pytest.raises(ValueError, match=r"prefetch must be an integer >= 1, got"):
            check_positive_int("prefetch", bad)


def test_check_lr():
    assert check_lr(1) == 1.0 and isinstance(check_lr(1), float)
    assert check_lr(1e-3) == 1e-3
    for bad in [0, -0.1, float("nan"), float("inf"), "0.1", None]:
        with pytest.raises(ValueError, match="lr must be a positive finite number"):
            check_lr(bad)
    with pytest.raises(ValueError, match="eta must be"):
        check_lr(-1, "eta")


def test_optional_seed():
    assert optional_seed(7) == 7
    torch.manual_seed(123)
    a = optional_seed(None)
    torch.manual_seed(123)
    assert optional_seed(None) == a  # reproducible once the user seeds torch
    assert 0 <= a < 2**31 - 1
    for bad in [1.5, "3", True]:
        with pytest.raises(ValueError, match="seed must be an int or None"):
            optional_seed(bad)


def test_mirror_from_env():
    assert mirror_from_env({}) == "step"
    assert mirror_from_env({"DGL_OAC_MIRROR": "rows"}) == "rows"
    with pytest.raises(ValueError, match="DGL_OAC_MIRROR='row': expected one of step, rows"):
        mirror_from_env({"DGL_OAC_MIRROR": "row"})


def test_row_timeout_from_env():
    assert row_timeout_from_env({}) == 300.0
    assert row_timeout_from_env({"DGL_OAC_ROW_TIMEOUT": "2.5"}) == 2.5
    for bad in ("", "soon", "0", "-1", "inf", "nan"):
        with pytest.raises(ValueError, match=f"DGL_OAC_ROW_TIMEOUT={bad!r}: expected seconds > 0"):
            row_timeout_from_env({"DGL_OAC_ROW_TIMEOUT": bad})


def test_every_environment_variable_dgl_oac_names_is_documented():
    """config.py's promise: no hidden variable. Each ``DGL_OAC_*`` name in the package's source has a row in the
    one page that lists them."""
    root = Path(__file__).resolve().parents[1]
    named = {m for p in (root / "dgl_oac").rglob("*.py") for m in re.findall(r"DGL_OAC_[A-Z_]+", p.read_text())}
    page = (root / "docs" / "api" / "environment.md").read_text()
    assert named and sorted(n for n in named if f"| `{n}` |" not in page) == []
