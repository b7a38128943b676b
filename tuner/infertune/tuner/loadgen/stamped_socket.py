"""TCP connections whose reads carry the kernel's arrival time: "when did it arrive", not "when
did a busy process get round to reading it".

Both ends of the load generator's measurements use it.

The scripted server (ground truth): its record is the reference the load generator's accuracy is checked against,
so it must say when a request *arrived*, not when a busy event loop got round to reading it. At
100 streams the server is often mid-burst (up to 100 token writes fall due together) when the
next request lands; stamping the request after the burst moved the recorded TTFT start by 4-10 ms
at p99 (measured), which then showed up as the generator's "error". asyncio's transports read
with recv() and drop the kernel's receive timestamp, so this reads with recvmsg() from plain
reader callbacks on the running loop and keeps it (SO_TIMESTAMPNS, Linux). Where the kernel gives
no timestamp, a read is stamped when it is read.

The generator's plain-HTTP connections, with `--kernel-timestamps` (client.py): a token's time
is when it reached this host, so a generator that shares its core with other work (an engine's CPU threads in a tuning Job,
another tenant) does not add its own scheduling delay to the server's TTFT and ITL. One limit:
TCP hands over everything queued in one read, stamped with the arrival of its last byte, so
tokens that pile up behind a long stall share that time (still never later than the read). TLS
connections stay on asyncio's transports (the TLS layer reads the socket itself).

No TLS, no flow control beyond a write queue; the protocol's connection_lost is called once.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import time
from collections.abc import Callable
from typing import Any, Protocol, cast

# Linux's value where Python does not name it (it has SO_TIMESTAMP but not always the ns form).
SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)
_TIMESPEC = struct.Struct("@qq")  # struct timespec on 64-bit Linux: seconds, nanoseconds
_ANCILLARY = socket.CMSG_SPACE(_TIMESPEC.size)
_READ = 256 * 1024


class StampedProtocol(Protocol):
    def connection_made(self, transport: StampedTransport) -> None: ...

    def data_received(self, data: bytes, arrived: float) -> None:
        """`arrived`: when the kernel received the last of `data`, on `time.perf_counter`'s clock."""

    def connection_lost(self, exc: Exception | None) -> None:
        """The peer closed (None) or the socket failed; nothing more will be read or written."""


def arrival_time(ancdata: list[tuple[int, int, bytes]], read_at: float) -> float:
    """The kernel's receive timestamp (CLOCK_REALTIME) moved onto perf_counter's clock.

    perf_counter is CLOCK_MONOTONIC here; the offset between the two clocks is read right now, so
    a wall-clock step between receipt and read is the only error (none on a test's time scale).
    Never later than `read_at`: a timestamp cannot follow the read that returned it.
    """
    for level, kind, data in ancdata:
        if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(data) >= _TIMESPEC.size:
            sec, nsec = cast(tuple[int, int], _TIMESPEC.unpack_from(data))
            offset_ns = time.clock_gettime_ns(time.CLOCK_REALTIME) - time.perf_counter_ns()
            return min((sec * 1_000_000_000 + nsec - offset_ns) / 1e9, read_at)
    return read_at


class StampedTransport:
    """One connected socket: the subset of asyncio.Transport the scripted server and client use."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, sock: socket.socket, protocol: StampedProtocol
    ) -> None:
        self._loop, self._sock, self._protocol = loop, sock, protocol
        self._pending = bytearray()  # written but not yet taken by the kernel
        self._closing = False
        self._fd = sock.fileno()
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # tokens leave at once
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        protocol.connection_made(self)
        loop.add_reader(self._fd, self._readable)

    def _readable(self) -> None:
        try:
            data, ancdata, _, _ = self._sock.recvmsg(_READ, _ANCILLARY)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._lost(exc)
            return
        if not data:  # the peer closed its side
            self._lost(None)
            return
        self._protocol.data_received(data, arrival_time(ancdata, time.perf_counter()))

    def write(self, data: bytes) -> None:
        if self._closing:
            return
        if not self._pending:
            try:
                sent = self._sock.send(data)
            except (BlockingIOError, InterruptedError):
                sent = 0
            except OSError as exc:
                self._lost(exc)
                return
            if sent == len(data):
                return
            data = data[sent:]
            self._loop.add_writer(self._fd, self._writable)
        self._pending += data

    def _writable(self) -> None:
        try:
            sent = self._sock.send(self._pending)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._lost(exc)
            return
        del self._pending[:sent]
        if not self._pending:
            self._loop.remove_writer(self._fd)
            if self._closing:  # close() waited for this
                self._shut()

    def is_closing(self) -> bool:
        return self._closing

    def get_extra_info(self, name: str) -> Any:
        return self._sock if name == "socket" else None

    def close(self) -> None:
        """Stop reading; close once what was written has left (as asyncio's transports do)."""
        if self._closing:
            return
        self._closing = True
        if not self._pending:
            self._shut()
        else:
            self._loop.remove_reader(self._fd)

    def abort(self) -> None:
        """Drop the connection now, unsent bytes included (a server dying mid-stream)."""
        self._lost(None)

    def _lost(self, exc: Exception | None) -> None:
        self._closing = True
        self._shut(exc)

    def _shut(self, exc: Exception | None = None) -> None:
        if self._sock.fileno() < 0:
            return  # already shut: connection_lost is said once
        self._loop.remove_reader(self._fd)
        self._loop.remove_writer(self._fd)
        self._sock.close()
        self._loop.call_soon(self._protocol.connection_lost, exc)


class StampedServer:
    """Listening socket plus its connections; close() stops accepting and drops them all."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        sock: socket.socket,
        factory: Callable[[], StampedProtocol],
    ) -> None:
        self._loop, self._factory = loop, factory
        self.sockets = [sock]
        self._connections: list[StampedTransport] = []
        loop.add_reader(sock.fileno(), self._accept)

    def _accept(self) -> None:
        listener = self.sockets[0]
        while True:  # everything the backlog holds: 100 clients connect at once
            try:
                conn, _ = listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return  # e.g. out of file descriptors; the client sees a refused connection
            self._connections = [c for c in self._connections if not c.is_closing()]
            self._connections.append(StampedTransport(self._loop, conn, self._factory()))

    def close(self) -> None:
        listener = self.sockets[0]
        self._loop.remove_reader(listener.fileno())
        listener.close()
        for conn in self._connections:
            conn.abort()


async def serve_stamped(
    factory: Callable[[], StampedProtocol], host: str, port: int, backlog: int = 4096
) -> StampedServer:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(backlog)
    sock.setblocking(False)
    return StampedServer(asyncio.get_running_loop(), sock, factory)


async def open_stamped(
    factory: Callable[[], StampedProtocol], host: str, port: int
) -> StampedProtocol:
    """Connect to the first address of ``host`` that answers; the connected protocol.

    Raises the last address's OSError (refused, unreachable) or socket.gaierror, as
    ``loop.create_connection`` does for a single address.
    """
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    failure: OSError | None = None
    for family, kind, proto, _, address in infos:
        sock = socket.socket(family, kind, proto)
        try:
            sock.setblocking(False)
            await loop.sock_connect(sock, address)
        except OSError as exc:
            sock.close()
            failure = exc
            continue
        except BaseException:  # cancelled (a connect timeout): no half-open socket left behind
            sock.close()
            raise
        protocol = factory()
        StampedTransport(loop, sock, protocol)
        return protocol
    raise failure or OSError(f"no address for {host}:{port}")
