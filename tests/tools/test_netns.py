"""scripts/netns.py: two emulated machines (network namespaces joined by the shaped wire) at 1 ms round trip;
their addresses reach each other, the measured round trip is about 1 ms, and ``down`` leaves no namespace, no
link and no wire process behind (twice: it is idempotent). Skipped unless root with ``ip netns`` and TUN."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import netns  # noqa: E402

WHY_NOT = netns.available()
pytestmark = pytest.mark.skipif(WHY_NOT is not None, reason=f"network namespaces unavailable: {WHY_NOT}")
PREFIX, TAG, SUBNET = "dgl-oac-test", "doact", "10.77.9"  # apart from a benchmark's network


def _links() -> str:
    return subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True).stdout


def test_two_machines_at_1ms_and_nothing_left_after_down() -> None:
    net = netns.Net(2, delay_ms=1.0, rate_gbit=10.0, prefix=PREFIX, tag=TAG, subnet=SUBNET)
    netns.down(net)  # a previous crashed run's
    with netns.network(2, 1.0, 10.0, prefix=PREFIX, tag=TAG, subnet=SUBNET) as net:
        wire = int(__import__("json").loads(net.state_file.read_text())["wire_pid"])
        names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        assert f"{PREFIX}-m0" in names and f"{PREFIX}-m1" in names
        addr = subprocess.run(net.cmd(1, ["ip", "-o", "-4", "addr", "show", "dev", netns.IFNAME]),
                              capture_output=True, text=True, check=True).stdout
        assert f"{SUBNET}.2/24" in addr
        rtt = net.rtt_ms["median"]
        assert 0.5 <= rtt <= 5.0, f"round trip {rtt} ms at 1 ms asked"  # loose: a shared, busy host
        put = subprocess.run(net.cmd(0, ["sh", "-c", "echo m0 > /dev/shm/probe && ls /dev/shm"]),
                             capture_output=True, text=True, check=True).stdout.split()
        assert put == ["probe"] and net.shm(0).joinpath("probe").exists()  # machine 0's own /dev/shm
        seen = subprocess.run(net.cmd(1, ["ls", "/dev/shm"]), capture_output=True, text=True, check=True).stdout
        assert seen.split() == []  # machine 1 does not see it
        before = net.counters(0)["tx_bytes"]
        netns.round_trip(net, 0, 1, count=20)
        assert net.counters(0)["tx_bytes"] > before  # the exchange went through machine 0's interface
        with pytest.raises(RuntimeError, match="already exist"):
            netns.up(netns.Net(2, prefix=PREFIX, tag=TAG, subnet=SUBNET))
    for _ in range(2):
        netns.down(net)
        names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        assert PREFIX not in names
        assert f"{TAG}-" not in _links()
        assert not Path(f"/proc/{wire}").exists() or b"netwire" not in Path(f"/proc/{wire}/cmdline").read_bytes()
        assert not net.state_file.exists()
        assert not list(Path("/dev/shm").glob(f"{PREFIX}-m*"))  # the machines' /dev/shm directories


def test_bad_arguments_are_named() -> None:
    with pytest.raises(ValueError, match="--machines"):
        netns.up(netns.Net(1, prefix=PREFIX, tag=TAG, subnet=SUBNET))
    with pytest.raises(ValueError, match="machine 2 does not exist"):
        netns.Net(2).cmd(2, ["true"])
