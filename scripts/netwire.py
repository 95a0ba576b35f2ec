"""The wire between emulated machines: a user-space switch over TUN devices, with a delay and a rate per link.

Why not veth + ``tc netem``: this kernel has no ``sch_netem`` (nor ``fq``/``etf``, the qdiscs that honour a BPF
departure time), and no modules to load. So each machine gets a TUN device (``IFF_TUN | IFF_NO_PI``: IPv4
packets, no ARP), and this process, in the root namespace, holds every device's file descriptor and moves the
packets between them:

- a packet read from machine i's device leaves i's link no earlier than the link is free (``rate``: the link
  is busy ``8 * len / rate`` seconds a packet, each way, per machine) and arrives ``one_way`` seconds later
  (``one_way = round trip / 2``: half of the round trip each way);
- it is written to the device of the machine its destination address names (a packet to an unknown address is
  dropped).

Threads: one reader per machine (blocking reads, a 0.2 s ``select`` timeout to see the stop event), one writer per
machine (a heap of due packets under a condition, waits with timeouts). The devices are not persistent: when this
process exits, the kernel deletes them (teardown cannot leave a link behind).

    python scripts/netwire.py --fds 3,4 --addrs 10.77.0.1,10.77.0.2 --delay-ms 1 --rate-gbit 10   # by netns.py
"""
from __future__ import annotations

import argparse
import ctypes
import fcntl
import heapq
import ipaddress
import os
import select
import signal
import struct
import threading
import time
from typing import Dict, List, Optional, Tuple

TUNSETIFF = 0x400454CA
IFF_TUN, IFF_NO_PI = 0x0001, 0x1000
MAX_PACKET = 65536
PR_SET_TIMERSLACK = 29


def open_tun(name: str) -> int:
    """A new non-persistent TUN device ``name`` (IPv4 packets, no packet-info header); returns its fd."""
    if len(name.encode()) > 15:
        raise ValueError(f"interface name {name!r} is longer than 15 bytes (IFNAMSIZ)")
    fd = os.open("/dev/net/tun", os.O_RDWR)
    try:
        fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", name.encode(), IFF_TUN | IFF_NO_PI))
    except OSError:
        os.close(fd)
        raise
    os.set_inheritable(fd, True)  # handed to the wire process
    return fd


class Wire:
    """Moves packets between ``fds[i]`` (machine i, address ``addrs[i]``). ``one_way``: seconds each way;
    ``rate``: bits/s of each machine's link (0: unlimited)."""

    def __init__(self, fds: List[int], addrs: List[str], one_way: float, rate: float) -> None:
        if len(fds) != len(addrs):
            raise ValueError(f"{len(fds)} devices but {len(addrs)} addresses")
        self.fds, self.one_way, self.rate = fds, one_way, rate
        self.by_addr: Dict[bytes, int] = {ipaddress.IPv4Address(a).packed: i for i, a in enumerate(addrs)}
        self.stop = threading.Event()
        self._free = [0.0] * len(fds)  # when machine i's link is next free (monotonic seconds)
        self._due: List[List[Tuple[float, int, bytes]]] = [[] for _ in fds]  # heap per destination
        self._cond = [threading.Condition() for _ in fds]
        self._seq = 0
        self.counts = {"packets": 0, "bytes": 0, "dropped": 0}
        self._threads = [threading.Thread(target=self._read, args=(i,), name=f"netwire-read-m{i}", daemon=True)
                         for i in range(len(fds))]
        self._threads += [threading.Thread(target=self._write, args=(i,), name=f"netwire-write-m{i}", daemon=True)
                          for i in range(len(fds))]

    def start(self) -> "Wire":
        for t in self._threads:
            t.start()
        return self

    def close(self, timeout: float = 2.0) -> None:
        """Stop the threads (idempotent)."""
        self.stop.set()
        for c in self._cond:
            with c:
                c.notify_all()
        for t in self._threads:
            if t.is_alive() and t is not threading.current_thread():
                t.join(timeout)

    def _read(self, i: int) -> None:
        fd = self.fds[i]
        while not self.stop.is_set():
            ready, _, _ = select.select([fd], [], [], 0.2)
            if not ready:
                continue
            try:
                pkt = os.read(fd, MAX_PACKET)
            except OSError:  # the device went away (its namespace was deleted)
                return
            if len(pkt) < 20 or pkt[0] >> 4 != 4:
                continue  # not IPv4 (the devices carry no IPv6 address; the kernel may still send some)
            j = self.by_addr.get(pkt[16:20])
            if j is None:
                self.counts["dropped"] += 1
                continue
            now = time.monotonic()
            # i's link is busy while it sends the packet; it arrives one_way after it has left
            left = max(now, self._free[i]) + (8 * len(pkt) / self.rate if self.rate else 0.0)
            self._free[i] = left
            with self._cond[j]:
                self._seq += 1
                heapq.heappush(self._due[j], (left + self.one_way, self._seq, pkt))
                self._cond[j].notify()
            self.counts["packets"] += 1
            self.counts["bytes"] += len(pkt)

    def _write(self, j: int) -> None:
        heap, cond = self._due[j], self._cond[j]
        while not self.stop.is_set():
            with cond:
                while not self.stop.is_set():
                    wait = heap[0][0] - time.monotonic() if heap else 0.2
                    if heap and wait <= 0:
                        break
                    cond.wait(min(wait, 0.2))  # wakes late by tens of us: netns.calibrate takes that off the delay
                if self.stop.is_set():
                    return
                _, _, pkt = heapq.heappop(heap)
            try:
                os.write(self.fds[j], pkt)
            except OSError:  # the device is down or gone: a lost packet, as on a real link
                continue


def _sharpen_timers() -> None:
    """Wake-ups within microseconds, not the default 50 us timer slack (the delays are 0.1 ms each way)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_TIMERSLACK, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def main(argv: Optional[List[str]] = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--fds", required=True, help="TUN file descriptors, machine order, comma-separated")
    p.add_argument("--addrs", required=True, help="each machine's IPv4 address, same order")
    p.add_argument("--delay-ms", type=float, required=True, help="round trip added between two machines")
    p.add_argument("--rate-gbit", type=float, default=0.0, help="each machine's link rate, Gbit/s (0: unlimited)")
    p.add_argument("--delay-file", default=None, help="on SIGUSR1, the round trip (ms) is read from this file")
    a = p.parse_args(argv)
    _sharpen_timers()
    wire = Wire([int(x) for x in a.fds.split(",")], a.addrs.split(","), a.delay_ms / 2e3, a.rate_gbit * 1e9)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: wire.stop.set())
    if a.delay_file:  # SIGUSR1: read a new round trip (ms) from the file (netns.py's calibration)
        signal.signal(signal.SIGUSR1, lambda *_: setattr(wire, "one_way", float(open(a.delay_file).read()) / 2e3))
    wire.start()
    while not wire.stop.wait(1.0):
        pass
    wire.close()


if __name__ == "__main__":
    main()
