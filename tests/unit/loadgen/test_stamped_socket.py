"""The scripted server's ground truth: a request is stamped when it arrived, not when it was read."""

from __future__ import annotations

import asyncio
import socket
import time

import pytest

from infertune.tuner.loadgen.stamped_socket import StampedTransport, serve_stamped

BUSY_S = 0.08


class _Recorder:
    def __init__(self, got: asyncio.Queue[tuple[bytes, float, float]]) -> None:
        self.got = got
        self.transport: StampedTransport | None = None

    def connection_made(self, transport: StampedTransport) -> None:
        self.transport = transport

    def data_received(self, data: bytes, arrived: float) -> None:
        self.got.put_nowait((data, arrived, time.perf_counter()))
        assert self.transport is not None
        self.transport.write(b"echo:" + data)


def test_a_request_landing_while_the_server_is_busy_is_stamped_at_arrival() -> None:
    async def scenario() -> tuple[float, float, float, bytes]:
        got: asyncio.Queue[tuple[bytes, float, float]] = asyncio.Queue()
        server = await serve_stamped(lambda: _Recorder(got), "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        try:
            client = await asyncio.to_thread(socket.create_connection, ("127.0.0.1", port))
            await asyncio.sleep(0.01)  # accepted before the busy spell starts
            sent = time.perf_counter()
            client.sendall(b"request")
            time.sleep(BUSY_S)  # the loop is busy (a burst of token writes): nothing is read
            data, arrived, read = await asyncio.wait_for(got.get(), 5)
            client.settimeout(5)
            reply = client.recv(100)
            client.close()
            return sent, arrived, read, data + b"|" + reply
        finally:
            server.close()

    sent, arrived, read, exchanged = asyncio.run(scenario())
    assert exchanged == b"request|echo:request"
    assert read - sent >= BUSY_S  # read only after the busy spell...
    # ...but stamped when it arrived: the kernel's timestamp, on the same clock as the client's.
    assert sent <= arrived + 1e-4
    assert arrived - sent == pytest.approx(0.0, abs=0.005)
