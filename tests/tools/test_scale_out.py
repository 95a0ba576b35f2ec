"""benchmarks/scale_out.py and the seam it reads: ``Group.sent`` counts exactly the bytes a rank's collectives
send (2 gloo ranks, hand-computed); the N-GPU prediction on a hand-computed case; a ``--quick`` run's JSON."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dgl_oac.distributed.exchange import exchange
from dgl_oac.distributed.group import Group

from dist_helpers import run_ranks

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import scale_out as S  # noqa: E402


def _collectives(rank: int, world: int):
    g = Group()
    before = dict(g.sent)  # making the group (an object all-gather) counts nothing
    # rank 0 keeps 2 rows and sends 3; rank 1 sends 1 and keeps 4; rows of 3 float32 (12 bytes)
    inp = torch.arange(15, dtype=torch.float32).view(5, 3) + 100 * rank
    in_splits, out_splits = ([2, 3], [2, 1]) if rank == 0 else ([1, 4], [3, 4])
    out = torch.empty(sum(out_splits), 3)
    g.all_to_all(out, inp, out_splits, in_splits, kind="gradients")
    got = exchange(g, [torch.ones(rank + 1, 4), torch.ones(2, 4)] if rank == 0 else
                   [torch.ones(3, 4), torch.ones(1, 4)], what="test", kind="forwarding")
    g.all_reduce(torch.ones(7, dtype=torch.float64), kind="dense")  # 56 bytes
    g.broadcast(torch.zeros(10, dtype=torch.int32), kind="dense")  # rank 0: 40 bytes to rank 1
    flagged = g.ranks_flagging(rank == 1, what="test")  # int32[2]
    return before, dict(g.sent), out, [p.shape[0] for p in got], flagged


def test_group_counts_the_bytes_each_rank_sends() -> None:
    (b0, s0, out0, got0, f0), (b1, s1, out1, got1, f1) = run_ranks(_collectives, 2, timeout=60.0)
    assert b0 == {} and b1 == {}
    assert torch.equal(out0[2:], torch.tensor([[100.0, 101, 102]]))  # the collective did what the count says
    assert got0 == [1, 3] and got1 == [2, 1] and f0 == f1 == [1]
    # exchange: the sizes (int64, one to the other rank: 8 bytes) and the rows to the other rank (16 bytes a row)
    assert s0 == {"gradients": 3 * 12, "forwarding": 8 + 2 * 16, "dense": 56 + 40, "decision": 8}
    assert s1 == {"gradients": 1 * 12, "forwarding": 8 + 3 * 16, "dense": 56, "decision": 8}


P = {"h2d_gbps": 10.24, "net_gbps": 1.0, "device_ms": 6.0, "patch_ns_per_row": 4.0, "cores_per_gpu": 2}
ST = {"S": 5.0, "G": 4.0, "V": 1.0, "C": 20.0, "U": 10.0, "O": 2.0}
SENT = {"sync": {"gradients": 1e6, "registration": 0.0, "forwarding": 0.0, "dense": 5e5, "decision": 8.0},
        "oac": {"gradients": 1e6, "registration": 2e5, "forwarding": 3e5, "dense": 5e5, "decision": 8.0}}


def test_prediction_for_n_gpus_by_hand() -> None:
    # measured with 2 trainers; 4 GPUs: all-to-all bytes x (3/4)/(1/2), forwarded x 3, ring all-reduce x 2*3/4
    b = S.bytes_at(SENT["oac"], world=2, n=4)
    assert b == pytest.approx({"gradients": 1.5e6, "registration": 3e5, "forwarding": 9e5, "dense": 7.5e5,
                               "decision": 24.0})
    g = S.predict(4, ST, writeback_ms=3.0, rows=10_000, row_floats=256, conflict=0.5, sent=SENT, world=2, p=P)
    # 1 GB/s: 2.250024 MB (sync) and 3.450024 MB (oac) a step; 10k rows of 256 floats at 10.24 GB/s: 1 ms a way;
    # conflict 0.5 x 4/2 = 1: every row patched, 10k x 4 ns; the owners' write-back (3 ms) inside the step
    assert g["net_ms"] == pytest.approx({"sync": 2.250024, "oac": 3.450024})
    assert g["bus_ms_one_way"] == pytest.approx(1.0) and g["patch_ms"] == pytest.approx(0.04)
    assert g["ms_per_step"]["sync"] == pytest.approx(5 + 4 + 1 + 6 + 1 + 3 + 2 + 2.250024)
    assert g["ms_per_step"]["oac"] == pytest.approx(5 + 6 + 0.04 + 2 + 3.450024 + 3)  # the caller's path dominates
    assert g["batches_per_s_all_trainers"]["oac"] == pytest.approx(4e3 / 19.490024)
    one = S.predict(1, ST, 3.0, 10_000, 256, 0.5, SENT, 2, P)  # one GPU: nothing on the network, and the
    assert one["net_ms"] == {"sync": 0.0, "oac": 0.0}  # write-back is a background thread again
    assert one["ms_per_step"] == pytest.approx({"sync": 22.0, "oac": 5 + 6 + 0.01 + 2})
    slow = S.predict(1, ST, 30.0, 10_000, 256, 0.5, SENT, 2, P)  # ... that bounds the step when it is the longest
    assert slow["ms_per_step"]["oac"] == pytest.approx(30.0 + 1.0)


@pytest.mark.slow
def test_quick_run_writes_every_section(tmp_path) -> None:
    out = tmp_path / "scale_out.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "scale_out.py"), "--quick", "--no-progress",
                           "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    r = json.loads(out.read_text())
    assert out.with_suffix(".png").exists()
    assert set(r["measured"]) == {"1", "2", "2m"} and len(r["measured"]["1"]) == 1 and len(r["measured"]["2m"]) == 2
    for n, ranks in r["measured"].items():
        for per in ranks:
            assert set(per) == {"sync", "oac@1", "oac@4"}
            for lab, m in per.items():
                assert set(S.KINDS) <= set(m["bytes_per_step"])
                assert 0.0 <= m["read"]["off_critical_path"] <= 1.0
                if n == "1":
                    assert not any(m["bytes_per_step"].values())  # one trainer sends nothing
            assert per["sync"]["read"]["off_critical_path"] == 0.0  # sync reads on the caller
    for per in r["measured"]["2"]:
        b = per["sync"]["bytes_per_step"]
        # sync registers nothing and forwards nothing: a step's two exchanges send only their frames' sizes and
        # headers (8 + 8 x (1 + 2 x parts) bytes each: 2 parts, then 3)
        assert b["gradients"] > 0 and b["dense"] > 0 and b["registration"] == b["forwarding"] == 0.0
        assert b["framing"] == (8 + 8 * 5) + (8 + 8 * 7)
        assert per["oac@4"]["bytes_per_step"]["registration"] > 8.0
        assert b["mirror"] == 0  # one machine: one shared table
    for one, two in zip(r["measured"]["2"], r["measured"]["2m"]):  # two machines: the same step, plus the mirror
        assert two["sync"]["bytes_per_step"]["gradients"] == one["sync"]["bytes_per_step"]["gradients"]
        assert two["sync"]["bytes_per_step"]["mirror"] > 8.0 and two["oac@4"]["bytes_per_step"]["mirror"] > 8.0
    tta = r["time_to_accuracy"]["trainers"]
    assert set(tta) == {"1", "2"} and all(len(c["curve"]) == 2 for c in tta.values())
    assert tta["1"]["steps_per_trainer"] == 2 * tta["2"]["steps_per_trainer"]
    pred = r["prediction"]
    assert "PREDICTION" in pred["label"] and [g["gpus"] for g in pred["by_gpus"]] == list(S.GPUS)


@pytest.mark.slow
@pytest.mark.hang_timeout(240)
@pytest.mark.skipif(S.NET.netrun.netns.available() is not None, reason="network namespaces unavailable (root)")
def test_quick_network_run_trains_across_two_namespaces(tmp_path) -> None:
    """``--network``: ``torchrun --nnodes=2`` across 2 namespaces at 1 ms; oac's table is bitwise sync's, the
    collectives' bytes went over the namespaces' interfaces, each machine's PSS was sampled."""
    out = tmp_path / "net.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "scale_out.py"), "--quick", "--no-progress",
                           "--network", "1", "--net-configs", "sync,async@2,oac@2", "--net-epochs", "1",
                           "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=200, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    n = json.loads(out.read_text())["network"]
    assert 0.5 <= n["round_trip_ms"]["1.0"]["median"] <= 5.0  # loose: a shared host
    rows = {(s["config"], s["layout"]): s for s in n["summary"]}
    asy = rows["async@2", "replicated"]  # naive async with several trainers: runs, registers and forwards nothing
    assert asy["steps_per_s"] > 0 and not asy["sent_per_step_rank0"].get("forwarding", 0)
    sync, oac = rows["sync", "replicated"], rows["oac@2", "replicated"]
    assert oac["bitwise_equal_to_sync"] is True and sync["bitwise_equal_to_sync"] is True
    for s in (sync, oac):
        assert s["steps_per_s"] > 0 and all(p > 50 * 2**20 for p in s["pss_peak_bytes"])
        payload = sum(s["sent_per_step_rank0"].values())  # rank 0 is machine 0
        assert payload > 0 and s["wire_tx_bytes_per_step"][0] >= payload  # gloo used the namespace's link
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert "dgl-oac-l" not in names  # torn down
