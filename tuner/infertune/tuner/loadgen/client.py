"""A streaming HTTP/1.1 client for OpenAI-compatible servers, built on asyncio protocols.

Why not aiohttp: the generator must not be the bottleneck (>= 1,000 short streamed requests/s on one
core) and must timestamp every chunk the moment it arrives. A protocol's `data_received` gives both:
one timestamp per socket read, no per-chunk coroutine hops, and keep-alive connections we reuse.
With `kernel_timestamps`, plain-HTTP connections read through stamped_socket.py, so that timestamp
is the kernel's receive time (when the bytes reached this host), not when this busy process got
round to them.
"""

from __future__ import annotations

import asyncio
import json
import socket
import ssl
import time
from collections import deque
from dataclasses import dataclass, field
from typing import cast

from infertune.tuner.loadgen.endpoint import Endpoint
from infertune.tuner.loadgen.stamped_socket import StampedTransport, open_stamped

_MAX_HEADER_BYTES = 65_536
_ERROR_BODY_BYTES = 300
CANCELLED = "cancelled: the run was stopped"  # not a failure: the caller ended the run


@dataclass(slots=True)
class RequestRecord:
    """What one request did. Times are `time.perf_counter()` seconds; latencies are seconds."""

    index: int
    prompt_len: int  # tokens we asked for
    max_tokens: int
    scheduled: float = 0.0  # when the arrival process wanted it sent
    start: float = 0.0  # when the client started sending it (connect included)
    end: float = 0.0
    ttft: float | None = None
    itl: list[float] = field(default_factory=list)  # every gap between consecutive chunks
    chunks: int = 0
    prompt_tokens: int | None = None  # as the server reports them (usage)
    output_tokens: int | None = None
    status: int | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def e2e(self) -> float:
        return self.end - self.start

    @property
    def output_count(self) -> int:
        """Server-reported output tokens, else the number of streamed chunks."""
        return self.output_tokens if self.output_tokens is not None else self.chunks

    @property
    def tpot(self) -> float | None:
        """Time per output token after the first: (e2e - TTFT) / (output tokens - 1)."""
        n = self.output_count
        if self.ttft is None or n < 2:
            return None
        return (self.e2e - self.ttft) / (n - 1)


class _Exchange:
    """Parses one streamed response (headers, chunked/length/close framing, SSE) into a record."""

    __slots__ = (
        "_body_left",
        "_buf",
        "_chunk_left",
        "_framing",
        "_sse",
        "_state",
        "done",
        "err_body",
        "keep_alive",
        "keep_alive_s",
        "last",
        "read_at",
        "record",
        "waiter",
    )

    def __init__(self, record: RequestRecord, waiter: asyncio.Future[None]) -> None:
        self.record = record
        self.waiter = waiter
        self._buf = b""
        self._sse = b""
        self._state = "head"  # head -> body -> end
        self._framing = "close"  # chunked | length | close
        self._body_left = 0
        self._chunk_left = -1  # -1: expecting a chunk-size line; -2: expecting the CRLF after data
        self.keep_alive = True
        self.keep_alive_s: float | None = (
            None  # the server's idle timeout ("Keep-Alive: timeout=N")
        )
        self.done = False  # saw [DONE]
        self.err_body = b""
        self.last = 0.0  # arrival time of the latest token chunk
        self.read_at = 0.0  # arrival time of the latest socket read

    def finish(self, error: str | None, *, at_read: bool = False) -> None:
        if self.waiter.done():
            return
        rec = self.record
        if error is None and rec.status is not None and rec.status >= 400:
            snippet = self.err_body[:_ERROR_BODY_BYTES].decode("utf-8", "replace").strip()
            error = f"HTTP {rec.status}: {snippet}" if snippet else f"HTTP {rec.status}"
        if error is None and rec.chunks == 0:
            error = "empty stream: the response carried no tokens"
        rec.error = error
        # A response that ended normally ends when its last bytes arrived, not when we noticed.
        rec.end = self.read_at if at_read and self.read_at else time.perf_counter()
        if error is not None:
            self.keep_alive = False
        self.waiter.set_result(None)

    def feed(self, data: bytes, now: float) -> None:
        self.read_at = now
        if self._state == "head":
            self._buf += data
            cut = self._buf.find(b"\r\n\r\n")
            if cut < 0:
                if len(self._buf) > _MAX_HEADER_BYTES:
                    self.finish("malformed response: headers too long")
                return
            head, data = self._buf[:cut], self._buf[cut + 4 :]
            self._buf = b""
            if not self._parse_head(head):
                return
            self._state = "body"
        if self._state == "body" and data:
            self._body(data, now)

    def _parse_head(self, head: bytes) -> bool:
        lines = head.decode("latin-1").split("\r\n")
        status = lines[0].split(" ", 2)
        if len(status) < 2 or not status[0].startswith("HTTP/") or not status[1].isdigit():
            self.finish(f"malformed response: status line {lines[0][:80]!r}")
            return False
        self.record.status = int(status[1])
        self.keep_alive = status[0] != "HTTP/1.0"
        for line in lines[1:]:
            name, _, value = line.partition(":")
            name = name.strip().lower()
            value = value.strip().lower()
            if name == "transfer-encoding" and "chunked" in value:
                self._framing = "chunked"
            elif name == "content-length" and self._framing != "chunked":
                self._framing = "length"
                self._body_left = int(value) if value.isdigit() else 0
            elif name == "connection":
                self.keep_alive = "close" not in value
            elif name == "keep-alive":
                for param in value.split(","):
                    key, _, number = param.strip().partition("=")
                    if key == "timeout" and number.strip().isdigit():
                        self.keep_alive_s = float(number.strip())
        if self._framing == "close":
            self.keep_alive = False
        if self._framing == "length" and self._body_left == 0:
            self._state = "end"
            self.finish(None, at_read=True)
            return False
        return True

    def _body(self, data: bytes, now: float) -> None:
        if self._framing == "length":
            take = data[: self._body_left]
            self._body_left -= len(take)
            self._payload(take, now)
            if self._body_left <= 0:
                self._end()
        elif self._framing == "close":
            self._payload(data, now)
        else:
            self._chunked(data, now)

    def _chunked(self, data: bytes, now: float) -> None:
        buf = self._buf + data if self._buf else data
        pos = 0
        while pos < len(buf) and self._state == "body":
            if self._chunk_left == -1:
                eol = buf.find(b"\r\n", pos)
                if eol < 0:
                    break
                size_text = buf[pos:eol].split(b";", 1)[0].strip()
                try:
                    size = int(size_text, 16)
                except ValueError:
                    self.finish(f"malformed response: bad chunk size {size_text[:20]!r}")
                    return
                pos = eol + 2
                if size == 0:
                    # Trailers are not used by inference servers; the body is complete here.
                    # Bytes after it belong to no request: do not reuse this connection.
                    if buf[pos:] not in (b"", b"\r\n"):
                        self.keep_alive = False
                    self._end()
                    return
                self._chunk_left = size
            elif self._chunk_left == -2:
                if len(buf) - pos < 2:
                    break
                pos += 2
                self._chunk_left = -1
            else:
                take = buf[pos : pos + self._chunk_left]
                pos += len(take)
                self._chunk_left -= len(take)
                if self._chunk_left == 0:
                    self._chunk_left = -2
                self._payload(take, now)
        self._buf = buf[pos:] if self._state == "body" else b""

    def _end(self) -> None:
        self._state = "end"
        if self._sse.strip() and self.record.status == 200:
            self._event(self._sse.strip(), self.read_at)
        self.finish(None, at_read=True)

    def _payload(self, data: bytes, now: float) -> None:
        if self.record.status != 200:
            if len(self.err_body) < _ERROR_BODY_BYTES:
                self.err_body += data
            return
        sse = self._sse + data if self._sse else data
        # Events end with a blank line; normalise CRLF so one split handles both endings.
        if b"\r" in sse:
            sse = sse.replace(b"\r\n", b"\n")
        events = sse.split(b"\n\n")
        self._sse = events.pop()
        for event in events:
            if self.waiter.done():
                return
            self._event(event, now)

    def _event(self, event: bytes, now: float) -> None:
        if event.startswith(b"data: ") and b"\n" not in event:
            data = event[6:]  # the usual one-line event, without the general parse below
        else:
            data = b"\n".join(
                line[5:].lstrip(b" ") for line in event.split(b"\n") if line.startswith(b"data:")
            )
        if not data:
            return  # comments / keep-alive pings
        if data == b"[DONE]":
            self.done = True
            return
        try:
            obj = json.loads(data)
        except ValueError:
            self.finish(f"malformed stream chunk: {data[:60]!r}")
            return
        if not isinstance(obj, dict):
            self.finish(f"malformed stream chunk: not a JSON object: {data[:60]!r}")
            return
        if "error" in obj:
            err = obj["error"]
            msg = err.get("message", err) if isinstance(err, dict) else err
            self.finish(f"server error in stream: {str(msg)[:200]}")
            return
        rec = self.record
        if obj.get("choices"):
            if rec.ttft is None:
                rec.ttft = now - rec.start
            else:
                rec.itl.append(now - self.last)
            self.last = now
            rec.chunks += 1
        usage = obj.get("usage")
        if isinstance(usage, dict):
            if isinstance(usage.get("prompt_tokens"), int):
                rec.prompt_tokens = usage["prompt_tokens"]
            if isinstance(usage.get("completion_tokens"), int):
                rec.output_tokens = usage["completion_tokens"]

    def connection_lost(self) -> None:
        if self._state == "head":
            self.finish(
                "server closed the connection before responding"
                if not self._buf.strip()  # nothing, or a stray CRLF left from the last response
                else "server closed the connection mid-headers"
            )
        elif self._state == "body":
            if self._framing == "close":
                self._end()
            else:
                self.finish("server closed the connection mid-stream")


# Errors that mean the server never answered the request (no status line came back).
_UNANSWERED = frozenset({"server closed the connection before responding"})
# Stop reusing a connection this long before the server's advertised idle timeout.
_IDLE_MARGIN_S = 1.0


class _Connection(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.exchange: _Exchange | None = None
        self.closed = False
        self.idle_since = 0.0
        self.idle_limit: float | None = None  # the server closes it after this long idle

    def usable(self, now: float) -> bool:
        """Not closed, and not so long idle that the server may be closing it right now."""
        if self.closed:
            return False
        return self.idle_limit is None or now - self.idle_since < self.idle_limit - _IDLE_MARGIN_S

    def connection_made(self, transport: asyncio.BaseTransport | StampedTransport) -> None:
        # Other event loops (uvloop) hand over transports that only look like asyncio's.
        self.transport = cast(asyncio.Transport, transport)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            # Small request bodies must leave at once; Nagle would add up to 40 ms.
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes, arrived: float | None = None) -> None:
        # `arrived` comes from a StampedTransport; asyncio's (TLS) transports give none.
        now = time.perf_counter() if arrived is None else arrived
        if self.exchange is None:
            self.close()  # bytes nobody asked for: the connection's framing cannot be trusted
            return
        self.exchange.feed(data, now)

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.exchange is not None:
            self.exchange.connection_lost()

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


class Client:
    """Sends streamed requests over a pool of keep-alive connections (one request per connection)."""

    def __init__(
        self,
        endpoint: Endpoint,
        *,
        timeout: float = 600.0,
        api_key: str | None = None,
        connect_timeout: float = 10.0,
        kernel_timestamps: bool = False,
    ) -> None:
        self.endpoint = endpoint
        self.kernel_timestamps = kernel_timestamps and not endpoint.tls
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self.api_key = api_key
        self._idle: deque[_Connection] = deque()
        self.reuse = True  # False once the server closed a reused connection unanswered
        self._busy: set[_Connection] = set()
        self._ssl = ssl.create_default_context() if endpoint.tls else None

    async def _connect(self, *, fresh: bool = False) -> tuple[_Connection, bool]:
        """(connection, reused): an idle kept-alive one unless `fresh`, else a new one."""
        loop = asyncio.get_running_loop()
        now = time.perf_counter()
        while self._idle and not fresh:
            conn = self._idle.pop()
            if conn.usable(now):
                return conn, True
            conn.close()
        if self.kernel_timestamps:
            stamped = open_stamped(_Connection, self.endpoint.host, self.endpoint.port)
            proto = cast(_Connection, await asyncio.wait_for(stamped, self.connect_timeout))
            return proto, False
        _, proto = await asyncio.wait_for(
            loop.create_connection(
                _Connection, self.endpoint.host, self.endpoint.port, ssl=self._ssl
            ),
            self.connect_timeout,
        )
        return proto, False

    async def send(self, record: RequestRecord, payload: bytes) -> RequestRecord:
        """Send one encoded request and fill `record`; never raises for server or network faults.

        A kept-alive connection can be closed by the server at the moment it is reused (its idle
        timeout races our request): when a reused connection closes before any byte of a response,
        the request is sent once more on a new connection, as HTTP clients do. Its latency then
        includes the lost attempt, as a real client's would."""
        record.start = time.perf_counter()
        reused = await self._send_once(record, payload, fresh=not self.reuse)
        if reused and record.status is None and record.error in _UNANSWERED:
            # Some servers close every connection after a streamed response while advertising
            # keep-alive (llama.cpp's llama-server does): stop reusing connections to this one.
            self.reuse = False
            record.error = None
            await self._send_once(record, payload, fresh=True)
        return record

    async def _send_once(self, record: RequestRecord, payload: bytes, *, fresh: bool) -> bool:
        """One attempt; True when it went over a reused (kept-alive) connection."""
        loop = asyncio.get_running_loop()
        try:
            conn, reused = await self._connect(fresh=fresh)
        except (OSError, TimeoutError) as exc:
            record.end = time.perf_counter()
            record.error = _connect_error(exc, self.endpoint)
            return False
        waiter: asyncio.Future[None] = loop.create_future()
        exchange = _Exchange(record, waiter)
        conn.exchange = exchange
        self._busy.add(conn)
        timer = loop.call_later(self.timeout, exchange.finish, f"timeout after {self.timeout:g}s")
        try:
            assert conn.transport is not None
            conn.transport.write(payload)
            await waiter
        except asyncio.CancelledError:
            exchange.keep_alive = False
            if not waiter.done():
                exchange.finish(CANCELLED)
            raise
        finally:
            timer.cancel()
            self._busy.discard(conn)
            conn.exchange = None
            if exchange.keep_alive and exchange._state == "end" and not conn.closed:
                conn.idle_since = time.perf_counter()
                conn.idle_limit = exchange.keep_alive_s
                self._idle.append(conn)
            else:
                conn.close()
        return reused

    async def close(self) -> None:
        for conn in [*self._idle, *self._busy]:
            conn.close()
        self._idle.clear()
        self._busy.clear()
        await asyncio.sleep(0)


def _connect_error(exc: BaseException, endpoint: Endpoint) -> str:
    where = f"{endpoint.host}:{endpoint.port}"
    if isinstance(exc, TimeoutError):
        return f"connect timeout: {where}"
    if isinstance(exc, ConnectionRefusedError):
        return f"connection refused: {where}"
    if isinstance(exc, socket.gaierror):
        return f"cannot resolve host: {endpoint.host}"
    return f"connect failed: {where}: {getattr(exc, 'strerror', None) or exc}"
