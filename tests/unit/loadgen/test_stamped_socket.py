"""Reads stamped by the kernel: a request (server side) or a token (the generator) is timed by when
it arrived, not by when a busy process got round to reading it."""

from __future__ import annotations

import asyncio
import socket
import time

import pytest
from loadgen_helpers import ServerFactory

from infertune.testing.ground_truth import server_log
from infertune.tuner.loadgen.client import Client, RequestRecord
from infertune.tuner.loadgen.endpoint import Endpoint, encode_request
from infertune.tuner.loadgen.stamped_socket import StampedTransport, serve_stamped

BUSY_S = 0.08
STALL_S = 0.15
TRAIL_MS = 5.0  # loopback delivery, plus the server's write just after its stamp


class _Recorder:
    def __init__(self, got: asyncio.Queue[tuple[bytes, float, float]]) -> None:
        self.got = got
        self.transport: StampedTransport | None = None

    def connection_made(self, transport: StampedTransport) -> None:
        self.transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        pass

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


@pytest.mark.parametrize("kernel_timestamps", [True, False])
def test_the_generator_times_a_token_by_arrival_while_its_own_loop_is_busy(
    scripted_server: ServerFactory, kernel_timestamps: bool
) -> None:
    """TTFT 40 ms, then a token every 200 ms, scripted; the generator's loop stalls for 150 ms (a
    CPU hog, a GC pause) while the first token arrives. Kernel stamps still time each token when
    the server wrote it; read-time stamps count the stall as server latency.

    Compared with the server's own record of when it wrote each token (perf_counter is
    CLOCK_MONOTONIC, one clock for both processes), not with the script: on a loaded host the
    server itself may write late, and that is not the generator's error."""
    url = scripted_server([40.0], [200.0])
    endpoint = Endpoint.parse(url)
    body = {"model": "scripted", "prompt": "a b c", "max_tokens": 3, "stream": True}
    stall: list[float] = []

    async def scenario() -> RequestRecord:
        client = Client(endpoint, kernel_timestamps=kernel_timestamps)
        record = RequestRecord(index=0, prompt_len=3, max_tokens=3)
        try:
            sending = asyncio.ensure_future(client.send(record, encode_request(endpoint, body)))
            await asyncio.sleep(0.01)  # connected, request sent; no token before 40 ms
            stall.append(time.perf_counter())
            time.sleep(STALL_S)  # this process is busy while the first token arrives
            stall.append(time.perf_counter())
            return await sending
        finally:
            await client.close()

    record = asyncio.run(scenario())
    assert record.ok and record.chunks == 3, record.error
    assert record.ttft is not None
    [(_, written)] = server_log(url)
    assert len(written) == 3
    # When the generator says each token came, and by how much that trails the server's write (ms).
    came = [record.start + record.ttft + sum(record.itl[:k]) for k in range(3)]
    trail = [(c - w) * 1e3 for c, w in zip(came, written, strict=True)]
    if kernel_timestamps:
        assert trail == pytest.approx([0.0, 0.0, 0.0], abs=TRAIL_MS), (trail, stall, written)
    else:  # the first token was read after the stall: late by the rest of it; the next gap short
        assert stall[0] < written[0] < stall[1] - 0.05, "precondition: the token lands mid-stall"
        assert came[0] >= stall[1]
        assert trail[0] > 50.0
        assert record.itl[0] < (written[1] - written[0]) - 0.05
