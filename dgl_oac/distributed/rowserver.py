"""Rows of sharded tables served to the other ranks: one server thread per process, one client per thread.

Why a channel of its own, and not collectives: a read of remote rows happens wherever a read happens, on the
gather thread (batches read ahead), on the caller's thread (sync hand-outs, ``emb(ids)``, evaluation on one
rank, refreshes of held batches), in whatever order each rank's program makes them. A collective would need
every rank to read in lockstep, and a read on one rank alone would hang; DGL's RPC is not thread-safe. So each
process serves its own rows on a TCP socket of its own (DGL's KVStore does the same), and any thread of any rank
asks the owners for rows at any time, without the training thread's process group.

Protocol (little-endian), one request and one reply at a time on a connection:

* request: ``int32 table, int32 width, int64 at, int64 n`` then ``int64[n]`` ids (global; all owned by the
  server); served once the owner has applied step ``at`` (a read at version ``at``: :mod:`.inflight`);
* reply: ``int64 status, int64 nbytes`` then ``nbytes``: ``float32[n, width]``, the first ``width`` columns of
  the rows (status 0), or an error
  message (status 1) that the client raises, naming the server's rank.

Consistency is the protocol's, not the channel's: a row is served as it is in the owner's shard when the
request arrives, and the reader's registration (:mod:`.inflight`) makes the owner forward every later write of
it, so validation patches it as in one process (:mod:`.committer`).

Lifetimes: :class:`RowService` (one per :class:`~.group.Group`, :func:`service_for`) starts its server thread
with the first sharded table and stops it (stop event, 0.5 s select timeout, joined) when the last one closes;
client connections are per thread and closed with the service.
"""
from __future__ import annotations

import os
import selectors
import socket
import struct
import threading
import time
import weakref
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch

from ..config import row_timeout_from_env
from .group import Group, PeerFailure

_REQ = struct.Struct("<iiqq")
_REP = struct.Struct("<qq")
#: seconds a client waits for an owner's reply before it names the owner as failed (read once at import)
REPLY_TIMEOUT_S = row_timeout_from_env(os.environ)


def _recv_into(sock: socket.socket, view: memoryview) -> None:
    got = 0
    while got < len(view):
        n = sock.recv_into(view[got:])
        if n == 0:
            raise ConnectionError("connection closed by peer")
        got += n


def _recv(sock: socket.socket, nbytes: int) -> bytes:
    buf = bytearray(nbytes)
    _recv_into(sock, memoryview(buf))
    return bytes(buf)


def advertised_host(peer_hosts: Sequence[str]) -> str:
    """The address other ranks reach this process at: ``DGL_OAC_ROW_SERVER_HOST`` if set; else the local address
    of the route to ``MASTER_ADDR`` (torchrun's rendezvous host: the interface the trainers share); else loopback
    when every rank runs on this host; else the host name's address."""
    if os.environ.get("DGL_OAC_ROW_SERVER_HOST"):
        return os.environ["DGL_OAC_ROW_SERVER_HOST"]
    master = os.environ.get("MASTER_ADDR")
    if master:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((master, 9))  # UDP: no packet is sent; only the route is chosen
            return probe.getsockname()[0]
    if len(set(peer_hosts)) == 1:
        return "127.0.0.1"
    return socket.gethostbyname(socket.gethostname())


class RowService:
    """This process's server of its shards, and its clients to the other ranks' servers (see the module
    docstring). Building it is collective (addresses are exchanged)."""

    def __init__(self, group: Group) -> None:
        self.group = group
        # table index -> (its rows [lo, hi), lo, ready(step, timeout): whether step is applied to them)
        self._shards: Dict[int, Tuple[torch.Tensor, int, Callable[[int, float], bool]]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        host = advertised_host([p[0] for p in group.peers])
        # on that address only (not every interface): the trainers' network, or loopback on one host
        self._listener = socket.create_server((host, 0), backlog=max(16, 4 * group.world))
        self.addresses: List[Tuple[str, int]] = group.all_gather_object(
            (host, self._listener.getsockname()[1]), what="sharded tables: row server addresses")
        self._clients: List[socket.socket] = []  # every connection made (closed with the service)
        self._idle: Dict[int, List[socket.socket]] = {}  # owner -> connections no thread is using
        self._tables = 0
        self._thread = threading.Thread(target=self._serve, name=f"dgl-oac-rowserver-rank{group.rank}", daemon=True)
        self._thread.start()

    # --- server ---------------------------------------------------------------------------------------------
    def add(self, shard: torch.Tensor, lo: int, ready: Callable[[int, float], bool]) -> int:
        """Serve ``shard: float32[hi - lo, W]`` (CPU) as the next table, a request at step ``at`` once
        ``ready(at, timeout)``; returns its index (every rank builds its sharded tables in the same order, so the
        indices agree)."""
        with self._lock:
            index, self._tables = self._tables, self._tables + 1
            self._shards[index] = (shard, lo, ready)
            return index

    def replace(self, index: int, shard: Optional[torch.Tensor] = None,
                ready: Optional[Callable[[int, float], bool]] = None) -> None:
        """Serve ``shard`` (a widened copy) or wait with ``ready`` for table ``index`` from now on."""
        with self._lock:
            old = self._shards[index]
            self._shards[index] = (old[0] if shard is None else shard, old[1], old[2] if ready is None else ready)

    def remove(self, index: int) -> bool:
        """Stop serving table ``index``; True if no table is left (the caller then closes the service)."""
        with self._lock:
            self._shards.pop(index, None)
            return not self._shards

    def _serve(self) -> None:
        """The server thread. A request for a step not applied yet waits in ``pending`` (its connection is not
        read meanwhile: a client asks one thing at a time) while the others are answered: the step it waits for
        may need another rank whose own read is queued here."""
        sel = selectors.DefaultSelector()
        sel.register(self._listener, selectors.EVENT_READ)
        pending: Dict[socket.socket, Tuple[Tuple[int, int, int, torch.Tensor], float]] = {}
        try:
            while not self._stop.is_set():
                # while a request waits for a step, look at the clock every millisecond (steps take longer)
                for key, _ in sel.select(timeout=0.001 if pending else 0.5):
                    if key.fileobj is self._listener:
                        conn, _ = self._listener.accept()
                        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                        conn.settimeout(REPLY_TIMEOUT_S)
                        sel.register(conn, selectors.EVENT_READ)
                        continue
                    req = self._request(key.fileobj)
                    if req is None:
                        sel.unregister(key.fileobj)
                        key.fileobj.close()
                    elif not self._due(req):
                        sel.unregister(key.fileobj)
                        pending[key.fileobj] = (req, time.monotonic())
                    elif not self._reply(key.fileobj, req):
                        sel.unregister(key.fileobj)
                        key.fileobj.close()
                for conn, (req, since) in list(pending.items()):
                    late = time.monotonic() - since > REPLY_TIMEOUT_S
                    if self._due(req) or late or self._stop.is_set():
                        del pending[conn]
                        if self._reply(conn, req, timed_out=late):
                            sel.register(conn, selectors.EVENT_READ)
                        else:
                            conn.close()
        finally:
            for conn in pending:
                conn.close()
            for key in list(sel.get_map().values()):
                if key.fileobj is not self._listener:
                    key.fileobj.close()
            sel.close()

    def _request(self, conn: socket.socket) -> Optional[Tuple[int, int, int, torch.Tensor]]:
        """``(table, width, at, ids)`` of the next request on ``conn``; None when the client has gone."""
        try:
            head = conn.recv(_REQ.size, socket.MSG_WAITALL)
            if len(head) < _REQ.size:
                return None
            index, width, at, n = _REQ.unpack(head)
            ids = torch.frombuffer(bytearray(_recv(conn, 8 * n)), dtype=torch.int64) if n else \
                torch.empty(0, dtype=torch.int64)
        except (OSError, ConnectionError):
            return None
        return index, width, at, ids

    def _due(self, req: Tuple[int, int, int, torch.Tensor]) -> bool:
        """Whether step ``at`` of the request is applied to the rows (or the table is unknown: an error reply)."""
        with self._lock:
            entry = self._shards.get(req[0])
        return entry is None or entry[2](req[2], 0.0)

    def _reply(self, conn: socket.socket, req: Tuple[int, int, int, torch.Tensor], timed_out: bool = False) -> bool:
        """Answer ``req`` on ``conn``; False when the client has gone."""
        index, width, at, ids = req
        try:
            if timed_out:
                raise TimeoutError(f"a read at step {at} waited {REPLY_TIMEOUT_S:.0f}s for this rank to apply it")
            if self._stop.is_set():
                raise KeyError("the row service is closing")
            with self._lock:
                shard, lo, _ = self._shards[index]
            if not 0 < width <= shard.shape[1]:
                raise ValueError(f"{width} columns asked, the shard has {shard.shape[1]}")
            local = ids - lo
            if ids.numel() and (int(local.min()) < 0 or int(local.max()) >= shard.shape[0]):
                raise IndexError(f"ids outside this rank's rows [{lo}, {lo + shard.shape[0]})")
            rows = shard[:, :width].index_select(0, local)  # one strided gather of the columns asked for
            payload = memoryview(rows.numpy()).cast("B")
            status = 0
        except (KeyError, ValueError, IndexError, TimeoutError) as exc:
            payload = memoryview(f"rank {self.group.rank}: {type(exc).__name__}: {exc}".encode())
            status = 1
        try:
            conn.sendall(_REP.pack(status, len(payload)))
            conn.sendall(payload)
        except OSError:
            return False
        self._count(len(payload))
        return True

    def _count(self, nbytes: int) -> None:
        """Bytes sent as ``Group.sent["fetch"]`` (rows served, ids asked for); every writer of that key holds
        the lock (the server thread and any reading thread)."""
        with self._lock:
            self.group._count("fetch", nbytes)

    # --- client ---------------------------------------------------------------------------------------------
    def _take(self, owner: int) -> socket.socket:
        """A connection to ``owner``'s server that no other thread uses until :meth:`_give` (made if none is
        idle: at most one per thread reading at once)."""
        with self._lock:
            if self._stop.is_set():
                raise RuntimeError("the row service is closed")
            idle = self._idle.setdefault(owner, [])
            if idle:
                return idle.pop()
        try:
            conn = socket.create_connection(self.addresses[owner], timeout=REPLY_TIMEOUT_S)
        except OSError as exc:
            raise PeerFailure(f"rank {self.group.rank}: cannot reach rank {owner}'s row server at "
                              f"{self.addresses[owner]}: {exc}") from exc
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with self._lock:
            self._clients.append(conn)
        return conn

    def _give(self, owner: int, conn: socket.socket) -> None:
        with self._lock:
            self._idle.setdefault(owner, []).append(conn)

    def fetch(self, index: int, width: int, at: int, requests: Dict[int, torch.Tensor],
              local: Optional[Callable[[], None]] = None) -> Dict[int, torch.Tensor]:
        """The first ``width`` columns ``float32[n_o, width]`` of table ``index``'s rows ``requests[owner] = ids:
        int64[n_o]`` at step ``at`` or later, from each owner's server; ``local()``, if given, runs while the
        owners answer (this rank's own rows)."""
        conns: Dict[int, socket.socket] = {}
        out: Dict[int, torch.Tensor] = {}
        owner = -1
        try:
            for owner, ids in requests.items():
                conns[owner] = self._take(owner)
                conns[owner].sendall(_REQ.pack(index, width, at, ids.numel()))
                conns[owner].sendall(memoryview(ids.contiguous().numpy()).cast("B"))
                self._count(8 * ids.numel())
            if local is not None:
                local()
            for owner, conn in conns.items():
                status, nbytes = _REP.unpack(_recv(conn, _REP.size))
                if status:
                    raise RuntimeError(f"rank {owner}'s row server refused a read: {_recv(conn, nbytes).decode()}")
                rows = torch.empty(requests[owner].numel(), width)
                if nbytes != rows.numel() * 4:
                    raise RuntimeError(f"rank {owner}'s row server sent {nbytes} bytes for {rows.numel() * 4}")
                _recv_into(conn, memoryview(rows.numpy()).cast("B"))
                out[owner] = rows
        except (OSError, ConnectionError) as exc:
            raise PeerFailure(f"rank {self.group.rank}: reading rows from rank {owner} failed ({exc}): that rank "
                              f"died, hung or is unreachable") from exc
        finally:
            for o, conn in conns.items():
                if o in out:
                    self._give(o, conn)  # a whole reply was read: the connection is in step
                else:
                    conn.close()  # a request without its reply: the stream is out of step
        return out

    def close(self) -> None:
        """Stop the server thread and close every connection. Idempotent."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=5.0)
        self._listener.close()
        with self._lock:
            clients, self._clients, self._idle = self._clients, [], {}
        for conn in clients:
            conn.close()


_SERVICES: "weakref.WeakKeyDictionary[Group, RowService]" = weakref.WeakKeyDictionary()


def service_for(group: Group) -> RowService:
    """The one row service of ``group`` (made, collectively, by the first sharded table)."""
    service = _SERVICES.get(group)
    if service is None or service._stop.is_set():
        service = _SERVICES[group] = RowService(group)
    return service
