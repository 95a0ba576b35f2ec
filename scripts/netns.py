"""Emulated machines on one host: Linux network namespaces joined by a shaped wire (root only).

``up`` makes M namespaces ``<prefix>-m0`` ... (default ``dgl-oac-m0``), each with loopback and one interface
``oac0`` at ``10.77.0.<i+1>/24``, joined by :mod:`netwire` (a user-space switch over TUN devices, in the root
namespace): a packet between two machines takes ``--delay-ms / 2`` each way (round trip = the latency asked for,
plus the wire's own few tens of microseconds, which ``up`` measures and prints) and each machine's link sends
at ``--rate-gbit``. This kernel has no ``sch_netem`` (see :mod:`netwire`), hence the user-space wire; the
namespaces, their addresses and the round trip are what ``veth`` + ``netem`` would give.

``down`` kills the wire (by the pid ``up`` recorded) and deletes the namespaces; it is idempotent, and leaves no
namespace and no link behind (the TUN devices die with the wire). ``exec M cmd...`` runs ``cmd`` in machine M's
namespace. From Python: ``with network(2, delay_ms=1.0) as net: subprocess.run(net.cmd(0, [...]))``.

    python scripts/netns.py up --machines 2 --delay-ms 1 --rate-gbit 10
    python scripts/netns.py exec 0 ip addr
    python scripts/netns.py down
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Sequence

HERE = Path(__file__).resolve().parent
STATE = Path("/run/dgl-oac-netns")
IFNAME = "oac0"  # the machine's interface, the same name in every namespace (GLOO_SOCKET_IFNAME, TP_SOCKET_IFNAME)
MTU = 65000  # large frames: the wire's cost is per packet (Python), the emulated rate per byte


@dataclass
class Net:
    """M emulated machines. ``prefix``: namespace names ``<prefix>-m<i>``; ``subnet``: the first three octets
    (machine i is ``<subnet>.<i+1>``); ``tag``: the TUN devices' names before they move (``<tag>-m<i>``)."""
    machines: int
    delay_ms: float = 0.0
    rate_gbit: float = 0.0
    prefix: str = "dgl-oac"
    subnet: str = "10.77.0"
    tag: str = "doac"
    rtt_ms: Optional[Dict[str, float]] = None

    def ns(self, i: int) -> str:
        return f"{self.prefix}-m{i}"

    def addr(self, i: int) -> str:
        return f"{self.subnet}.{i + 1}"

    def shm(self, i: int) -> Path:
        """Machine ``i``'s ``/dev/shm`` (a directory of the host's, bound over ``/dev/shm`` in its commands)."""
        return Path("/dev/shm", f"{self.ns(i)}-shm")

    def cmd(self, i: int, argv: Sequence[str]) -> List[str]:
        """``argv`` run in machine ``i``'s namespace (environment inherited), with the machine's own
        ``/dev/shm``: ``ip netns exec`` gives each command a private mount namespace, in which the machine's
        directory is bound over ``/dev/shm``, so two machines' shared-memory names never meet (DGL's KVStore
        names its client buffers by the tensor's name: on one shared ``/dev/shm`` the second machine's
        truncated the first's, SIGBUS) while one machine's processes share theirs."""
        if not 0 <= i < self.machines:
            raise ValueError(f"machine {i} does not exist: {self.machines} machines (0..{self.machines - 1})")
        return ["ip", "netns", "exec", self.ns(i), "sh", "-c", 'mount --bind "$0" /dev/shm && exec "$@"',
                str(self.shm(i)), *argv]

    def env(self) -> Dict[str, str]:
        """What gloo and TensorPipe need to pick the machine's interface (not the host's name resolution)."""
        return {"GLOO_SOCKET_IFNAME": IFNAME, "TP_SOCKET_IFNAME": IFNAME}

    def counters(self, i: int) -> Dict[str, int]:
        """Machine ``i``'s interface counters: ``{"tx_bytes", "rx_bytes", "tx_packets", "rx_packets"}``."""
        out = _ip("-n", self.ns(i), "-s", "-j", "link", "show", "dev", IFNAME)
        stats = json.loads(out)[0]["stats64"]
        return {f"{d}_{k}": int(stats[d][k]) for d in ("tx", "rx") for k in ("bytes", "packets")}

    @property
    def state_file(self) -> Path:
        return STATE / f"{self.prefix}.json"

    @property
    def delay_file(self) -> Path:
        return STATE / f"{self.prefix}.delay"


def _ip(*args: str) -> str:
    r = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if r.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)} failed: {r.stderr.strip()}")
    return r.stdout


def available() -> Optional[str]:
    """None when namespaces and TUN devices can be made here, else why not."""
    if os.geteuid() != 0:
        return "not root"
    if not os.path.exists("/dev/net/tun"):
        return "no /dev/net/tun"
    if shutil.which("ip") is None:
        return "no `ip` command (iproute2)"
    probe = f"dgl-oac-probe{os.getpid()}"
    r = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if r.returncode != 0:
        return f"ip netns add failed: {r.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def up(net: Net, measure: bool = True) -> Net:
    """Make ``net``'s namespaces and start its wire (a failure part-way tears down what was made)."""
    sys.path.insert(0, str(HERE))
    from netwire import open_tun  # scripts/ is not a package

    STATE.mkdir(parents=True, exist_ok=True)
    if net.machines < 2 or net.machines > 250:
        raise ValueError(f"--machines must be 2..250, got {net.machines}")
    if net.delay_ms < 0 or net.rate_gbit < 0:
        raise ValueError(f"--delay-ms and --rate-gbit must be >= 0, got {net.delay_ms} and {net.rate_gbit}")
    if net.state_file.exists() or any(_exists(net.ns(i)) or net.shm(i).exists() for i in range(net.machines)):
        raise RuntimeError(f"{net.prefix}: namespaces or a wire already exist; run `netns.py down"
                           f"{'' if net.prefix == 'dgl-oac' else ' --prefix ' + net.prefix}` first")
    fds: List[int] = []
    try:
        for i in range(net.machines):
            ns, dev = net.ns(i), f"{net.tag}-m{i}"
            _ip("netns", "add", ns)
            fds.append(open_tun(dev))
            _ip("link", "set", dev, "netns", ns)
            _ip("-n", ns, "link", "set", dev, "name", IFNAME)
            _ip("-n", ns, "link", "set", "lo", "up")
            _ip("-n", ns, "link", "set", IFNAME, "mtu", str(MTU), "up")
            _ip("-n", ns, "addr", "add", f"{net.addr(i)}/24", "dev", IFNAME)
            net.shm(i).mkdir(mode=0o1777)
        wire = subprocess.Popen(
            [sys.executable, str(HERE / "netwire.py"), "--fds", ",".join(map(str, fds)),
             "--addrs", ",".join(net.addr(i) for i in range(net.machines)), "--delay-ms", str(net.delay_ms),
             "--rate-gbit", str(net.rate_gbit), "--delay-file", str(net.delay_file)], pass_fds=fds, start_new_session=True,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        net.state_file.write_text(json.dumps({"wire_pid": wire.pid, **_fields(net)}))
    except BaseException:
        down(net)
        raise
    finally:
        for fd in fds:  # the wire holds them now (or nothing does, and the devices go)
            os.close(fd)
    if measure:
        net.rtt_ms = calibrate(net, wire.pid)
    return net


def calibrate(net: Net, pid: int, rounds: int = 4, overhead_ms: float = 0.15) -> Dict[str, float]:
    """Measure the round trip m0 -> m1 and take the wire's own overhead (thread wake-ups: 0.05 to
    ``overhead_ms``) off the delay it adds, up to ``rounds`` times, until the median is within 5% (or 0.02 ms) of
    ``net.delay_ms``; the delay stays within [asked - overhead_ms, asked], so one measurement taken under a load
    spike cannot drive it to 0. Returns the last measurement, with ``wire_delay_ms``: the delay the wire adds."""
    setting = net.delay_ms
    rtt = round_trip(net, 0, 1)
    for _ in range(rounds):
        excess = rtt["median"] - net.delay_ms
        if net.delay_ms == 0 or abs(excess) <= max(0.05 * net.delay_ms, 0.02):
            break
        setting = min(net.delay_ms, max(net.delay_ms - overhead_ms, 0.0, setting - excess))
        net.delay_file.write_text(str(setting))
        os.kill(pid, signal.SIGUSR1)
        rtt = round_trip(net, 0, 1)
    return {**rtt, "wire_delay_ms": setting}


def _fields(net: Net) -> Dict[str, object]:
    return {k: getattr(net, k) for k in ("machines", "delay_ms", "rate_gbit", "prefix", "subnet", "tag")}


def _exists(ns: str) -> bool:
    return Path("/run/netns", ns).exists()


def down(net: Net) -> None:
    """Kill ``net``'s wire and delete its namespaces (idempotent; any number of machines)."""
    if net.state_file.exists():
        pid = json.loads(net.state_file.read_text())["wire_pid"]
        _kill_wire(pid)
        net.state_file.unlink()
    net.delay_file.unlink(missing_ok=True)
    for path in sorted(Path("/run/netns").glob(f"{net.prefix}-m*")) if Path("/run/netns").exists() else []:
        if path.name[len(net.prefix) + 2:].isdigit():
            for pid in _ip("netns", "pids", path.name).split():  # processes left in it (a killed benchmark's)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), signal.SIGKILL)
            _ip("netns", "del", path.name)
    for shm in Path("/dev/shm").glob(f"{net.prefix}-m*-shm"):
        if shm.name[len(net.prefix) + 2:-4].isdigit():
            shutil.rmtree(shm, ignore_errors=True)


def _kill_wire(pid: int) -> None:
    """SIGTERM the wire ``pid`` (only if it is a netwire process: a stale state file may name a reused pid)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return
    if b"netwire.py" not in cmdline:
        return
    os.kill(pid, signal.SIGTERM)
    for _ in range(50):
        if not Path(f"/proc/{pid}").exists() or b"netwire.py" not in Path(f"/proc/{pid}/cmdline").read_bytes():
            return
        time.sleep(0.1)
    os.kill(pid, signal.SIGKILL)


_ECHO = """
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind((sys.argv[1], 7707)); s.listen(1)
s.settimeout(30); c, _ = s.accept(); c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
while (b := c.recv(64)):
    c.sendall(b)
"""
_PING = """
import socket, statistics, sys, time
for _ in range(300):
    try:
        c = socket.create_connection((sys.argv[1], 7707), timeout=5); break
    except OSError:
        time.sleep(0.05)
c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1); rtts = []
for _ in range(int(sys.argv[2])):
    t = time.perf_counter(); c.sendall(b"x"); c.recv(64); rtts.append(1e3 * (time.perf_counter() - t))
print(statistics.median(rtts), min(rtts), max(rtts))
"""


def round_trip(net: Net, a: int, b: int, count: int = 200) -> Dict[str, float]:
    """ms of a 1-byte TCP ping-pong from machine ``a`` to ``b`` (``count`` times; median, min, max). ``ping`` is
    not installed here; a TCP exchange is also what gloo does."""
    server = subprocess.Popen(net.cmd(b, [sys.executable, "-c", _ECHO, net.addr(b)]), stdout=subprocess.DEVNULL)
    try:
        r = subprocess.run(net.cmd(a, [sys.executable, "-c", _PING, net.addr(b), str(count)]), capture_output=True,
                           text=True, timeout=60)
        if r.returncode != 0:
            raise RuntimeError(f"round trip {a} -> {b} failed: {r.stderr.strip()[-2000:]}")
        med, lo, hi = map(float, r.stdout.split())
        return {"median": med, "min": lo, "max": hi, "count": count}
    finally:
        if server.poll() is None:
            server.kill()
        server.wait(timeout=10)


@contextlib.contextmanager
def network(machines: int, delay_ms: float = 0.0, rate_gbit: float = 0.0, **kw: str) -> Iterator[Net]:
    """``up`` on entry, ``down`` on exit however the block ends."""
    net = Net(machines, delay_ms, rate_gbit, **kw)
    up(net)
    try:
        yield net
    finally:
        down(net)


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--prefix", default="dgl-oac", help="namespaces are <prefix>-m0, <prefix>-m1, ...")
    sub = p.add_subparsers(dest="what", required=True)
    u = sub.add_parser("up", help="make the namespaces and the wire; print the measured round trip")
    u.add_argument("--machines", type=int, default=2)
    u.add_argument("--delay-ms", type=float, default=1.0, help="round trip added between two machines (half each way)")
    u.add_argument("--rate-gbit", type=float, default=10.0, help="each machine's link rate (0: unlimited)")
    u.add_argument("--subnet", default="10.77.0", help="machine i is <subnet>.<i+1>/24")
    sub.add_parser("down", help="remove the namespaces and the wire (idempotent)")
    e = sub.add_parser("exec", help="run a command in machine M's namespace")
    e.add_argument("machine", type=int)
    e.add_argument("argv", nargs=argparse.REMAINDER)
    a = p.parse_args(argv)
    if a.what == "up":
        net = up(Net(a.machines, a.delay_ms, a.rate_gbit, a.prefix, a.subnet))
        print(f"{a.machines} machines {net.ns(0)}..{net.ns(a.machines - 1)} at {net.addr(0)}..; asked "
              f"{a.delay_ms} ms round trip, {a.rate_gbit} Gbit/s; measured round trip m0 -> m1 (TCP, 1 byte): "
              f"median {net.rtt_ms['median']:.3f} ms, min {net.rtt_ms['min']:.3f}, max {net.rtt_ms['max']:.3f} "
              f"(the wire adds {net.rtt_ms['wire_delay_ms']:.3f} ms; the rest is its own overhead)")
        return 0
    if a.what == "down":
        down(Net(0, prefix=a.prefix))
        return 0
    state = Net(0, prefix=a.prefix).state_file
    if not state.exists():
        p.error(f"no network {a.prefix!r} is up (run `netns.py up` first)")
    net = Net(**{k: v for k, v in json.loads(state.read_text()).items() if k != "wire_pid"})
    return subprocess.call(net.cmd(a.machine, a.argv or ["bash"]))


if __name__ == "__main__":
    sys.exit(main())
