"""An OpenAI-compatible streaming server whose tokens leave at scripted times: the ground truth.

Request i (in arrival order) gets its first token `ttft[i % len(ttft)]` ms after it arrived (the
kernel's receive time, see stamped_socket.py) and each further token `itl[i % len(itl)]` ms after
the previous one, scheduled on absolute times so that delays do not accumulate. With zero delays it is the zero-latency server of the generator's
own benchmark. The `model` field selects a fault instead of tokens:

- `fail-500`, `fail-503`: that HTTP status with a JSON error body;
- `malformed`: one token, then a stream chunk that is not JSON;
- `disconnect`: two tokens, then the connection is dropped mid-stream;
- `error-event`: one token, then an OpenAI-style `{"error": ...}` event.

Run it as `python -m infertune.testing.scripted_server --port 0 --ttft-ms 20,40 --itl-ms 5`;
it prints `PORT <n>` once listening. Only for loopback testing.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import sys
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from infertune.tuner.loadgen.stamped_socket import StampedServer, StampedTransport, serve_stamped

_CRLF = b"\r\n"


def _chunk(data: bytes) -> bytes:
    return f"{len(data):x}".encode() + _CRLF + data + _CRLF


def _event(choice: dict[str, Any]) -> bytes:
    return _chunk(b"data: " + json.dumps({"choices": [choice]}).encode() + b"\n\n")


# Every token is the same few bytes, built once: the server must keep to its script at 100 streams.
_TOKEN = _event({"index": 0, "text": " t", "finish_reason": None})
_LAST = _event({"index": 0, "text": " t", "finish_reason": "length"})
_CHAT_TOKEN = _event({"index": 0, "delta": {"content": " t"}, "finish_reason": None})
_CHAT_LAST = _event({"index": 0, "delta": {"content": " t"}, "finish_reason": "length"})


class ScriptedServer:
    def __init__(
        self,
        ttft_ms: list[float],
        itl_ms: list[float],
        tokenizer: Any | None = None,
        slots: int | None = None,
    ) -> None:
        self.ttft = [t / 1e3 for t in ttft_ms] or [0.0]
        self.itl = [t / 1e3 for t in itl_ms] or [0.0]
        self.tokenizer = tokenizer
        self.count = 0
        # With `slots`, at most that many streams run at once and the rest wait in arrival order,
        # like an engine at its batch limit: a finite capacity, so latency rises with the rate.
        self.slots = slots
        self.active = 0
        self.waiting: deque[Callable[[], None]] = deque()
        # Ground truth as it happened: (request arrived, [token write times]) on perf_counter's clock,
        # which is CLOCK_MONOTONIC and so shared with the client process.
        self.log: list[tuple[float, list[float]]] = []

    def prompt_tokens(self, body: dict[str, Any]) -> int:
        text = body.get("prompt")
        if text is None:
            text = " ".join(str(m.get("content", "")) for m in body.get("messages", []))
        if isinstance(text, list):
            return len(text)
        if self.tokenizer is not None:
            return len(self.tokenizer.encode(str(text), add_special_tokens=True).ids)
        return len(str(text).split())


@dataclass(slots=True)
class _Stream:
    start: float  # perf_counter when the request arrived (or left the queue, with slots)
    ttft: float
    itl: float
    n: int
    prompt: int
    chat: bool
    fault_at: int | None
    model: str
    k: int = 0  # next token to send
    emits: list[float] = field(default_factory=list)


class _Handler:
    def __init__(self, server: ScriptedServer) -> None:
        self.server = server
        self.buf = b""
        self.arrived = 0.0  # when the kernel received the latest bytes of `buf`
        self.transport: StampedTransport | None = None
        self.busy = False

    def connection_made(self, transport: StampedTransport) -> None:
        self.transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        pass  # a stream's timers find the transport closing and stop writing

    def data_received(self, data: bytes, arrived: float) -> None:
        self.buf += data
        self.arrived = arrived  # clients do not pipeline: the latest bytes end the next request
        self._next()

    def _next(self) -> None:
        if self.busy:
            return
        cut = self.buf.find(b"\r\n\r\n")
        if cut < 0:
            return
        head = self.buf[:cut].decode("latin-1")
        length = 0
        for line in head.split("\r\n")[1:]:
            name, _, value = line.partition(":")
            if name.strip().lower() == "content-length":
                length = int(value.strip())
        if len(self.buf) < cut + 4 + length:
            return
        body = self.buf[cut + 4 : cut + 4 + length]
        self.buf = self.buf[cut + 4 + length :]
        method, path = [*head.split(" ", 2), "", ""][:2]
        self._route(method, path, body)

    def _send(self, data: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    def _plain(self, status: str, payload: dict[str, Any]) -> None:
        data = json.dumps(payload).encode()
        self._send(
            f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\n\r\n".encode()
            + data
        )

    def _route(self, method: str, path: str, raw: bytes) -> None:
        if method == "GET" and path == "/scripted/log":
            self._plain("200 OK", {"log": self.server.log})
            self._next()
            return
        if method == "GET" and path.endswith("/v1/models"):
            self._plain("200 OK", {"object": "list", "data": [{"id": "scripted"}]})
            self._next()
            return
        if method != "POST" or not path.endswith(("/v1/completions", "/v1/chat/completions")):
            self._plain("404 Not Found", {"error": {"message": f"no route {method} {path}"}})
            self._next()
            return
        body = json.loads(raw)
        model = str(body.get("model", ""))
        if model in ("fail-500", "fail-503"):
            status = (
                "500 Internal Server Error" if model == "fail-500" else "503 Service Unavailable"
            )
            self._plain(status, {"error": {"message": "scripted failure", "code": model[-3:]}})
            self._next()
            return
        self.busy = True
        self._stream(body, model, chat=path.endswith("/chat/completions"))

    def _stream(self, body: dict[str, Any], model: str, *, chat: bool) -> None:
        srv = self.server
        i = srv.count
        srv.count += 1
        n = int(body.get("max_completion_tokens") or body.get("max_tokens") or 16)
        self._send(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n"
        )
        # The script runs from the request's arrival, not from when this loop got to it: a busy
        # server reads late, and the client's clock started at the send (stamped_socket.py).
        read = self.arrived
        stream = _Stream(
            start=read,
            ttft=srv.ttft[i % len(srv.ttft)],
            itl=srv.itl[i % len(srv.itl)],
            n=n,
            prompt=srv.prompt_tokens(body),
            chat=chat,
            fault_at={"malformed": 1, "error-event": 1, "disconnect": 2}.get(model),
            model=model,
        )
        srv.log.append((read, stream.emits))
        if srv.slots is not None and srv.active >= srv.slots:
            srv.waiting.append(lambda: self._begin(stream, queued=True))
        else:
            self._begin(stream, queued=False)

    def _begin(self, stream: _Stream, *, queued: bool) -> None:
        self.server.active += 1
        if queued:
            stream.start = time.perf_counter()  # a queued request's script runs from its slot
        self._arm(stream)

    def _release(self) -> None:
        srv = self.server
        srv.active -= 1
        if srv.waiting:
            srv.waiting.popleft()()

    def _arm(self, stream: _Stream) -> None:
        # One timer at a time per stream, at an absolute time: tokens cannot overtake each other
        # when the server falls behind, and lateness does not accumulate.
        delay = stream.start + stream.ttft + stream.k * stream.itl - time.perf_counter()
        asyncio.get_running_loop().call_later(max(0.0, delay), self._due, stream)

    def _due(self, stream: _Stream) -> None:
        if stream.start + stream.ttft + stream.k * stream.itl - time.perf_counter() > 5e-5:
            self._arm(stream)  # some loops round timers down to the millisecond; never run early
            return
        if stream.fault_at is not None and stream.k == stream.fault_at:
            self._fault(stream.model)
            return
        self._token(stream)
        stream.k += 1
        if stream.k < stream.n:
            self._arm(stream)

    def _token(self, stream: _Stream) -> None:
        last = stream.k == stream.n - 1
        out = (_CHAT_LAST if last else _CHAT_TOKEN) if stream.chat else (_LAST if last else _TOKEN)
        if last:
            prompt, n = stream.prompt, stream.n
            usage = {"prompt_tokens": prompt, "completion_tokens": n, "total_tokens": prompt + n}
            out += _chunk(
                b"data: " + json.dumps({"choices": [], "usage": usage}).encode() + b"\n\n"
            )
            out += _chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n"
        stream.emits.append(time.perf_counter())
        self._send(out)
        if last:
            self._release()
            self.busy = False
            self._next()

    def _fault(self, model: str) -> None:
        self._release()
        if model == "disconnect":
            if self.transport is not None:
                self.transport.abort()
            return
        if model == "malformed":
            event = b'data: {"choices": [{"text": "broken\n\n'
        else:
            event = b'data: {"error": {"message": "scripted engine failure", "code": 500}}\n\n'
        self._send(_chunk(event) + _chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
        self.busy = False
        self._next()


async def serve(server: ScriptedServer, host: str = "127.0.0.1", port: int = 0) -> StampedServer:
    return await serve_stamped(lambda: _Handler(server), host, port)


def boost_priority() -> bool:
    """Schedule this process ahead of ordinary work (real-time FIFO, else nice -10), if allowed.

    Ground truth must not be late because a compiler runs beside it on a shared machine. The
    kernel's real-time throttling still leaves other processes 5% of each core. Best effort:
    returns False where the system does not allow it.
    """
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(10))
        return True
    except (OSError, AttributeError):
        pass
    try:
        os.nice(-10)
        return True
    except OSError:
        return False


@contextlib.contextmanager
def boosted_priority() -> Iterator[None]:
    """Run the block ahead of ordinary work when allowed (root), as `--boost` does for the server.

    Timing tests measure the generator, not whatever else shares this machine's two cores (a
    compiler, another engineer's cluster): :func:`boost_priority`, restored afterwards.
    """
    policy, nice = os.sched_getscheduler(0), os.getpriority(os.PRIO_PROCESS, 0)
    boost_priority()
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            os.sched_setscheduler(0, policy, os.sched_param(0))
            os.setpriority(os.PRIO_PROCESS, 0, nice)


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--ttft-ms", default="0", help="comma-separated, cycled per request")
    parser.add_argument("--itl-ms", default="0", help="comma-separated, cycled per request")
    parser.add_argument("--tokenizer", type=Path, default=None, help="dir with tokenizer.json")
    parser.add_argument("--cpu", type=int, default=None, help="pin the server to this CPU")
    parser.add_argument("--slots", type=int, default=None, help="streams served at once")
    parser.add_argument(
        "--boost", action="store_true", help="raise scheduling priority (root) to keep the script"
    )
    args = parser.parse_args(argv)
    if args.cpu is not None:
        os.sched_setaffinity(0, {args.cpu})
    if args.boost:
        boost_priority()
    tokenizer = None
    if args.tokenizer is not None:
        from tokenizers import Tokenizer

        tokenizer = Tokenizer.from_file(str(args.tokenizer / "tokenizer.json"))
    scripted = ScriptedServer(_floats(args.ttft_ms), _floats(args.itl_ms), tokenizer, args.slots)
    # A full collection over thousands of live stream objects pauses the loop for milliseconds and
    # every token due in that pause goes out late: collect rarely, never over the start-up objects.
    gc.freeze()
    gc.set_threshold(100_000, 50, 1000)

    async def run() -> None:
        srv = await serve(scripted, port=args.port)
        port = srv.sockets[0].getsockname()[1]
        print(f"PORT {port}", flush=True)
        # Exit when the parent closes our stdin: no orphaned servers after a crashed test.
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, sys.stdin.read)
        srv.close()

    asyncio.run(run())
    return 0


def start_process(
    ttft_ms: list[float],
    itl_ms: list[float],
    *,
    tokenizer_dir: Path | None = None,
    cpu: int | None = None,
    boost: bool = False,
    slots: int | None = None,
) -> tuple[Any, int]:
    """Start the server in a child process; returns (Popen, port). Close its stdin to stop it."""
    import subprocess

    cmd = [
        sys.executable,
        "-m",
        "infertune.testing.scripted_server",
        "--ttft-ms",
        ",".join(str(t) for t in ttft_ms),
        "--itl-ms",
        ",".join(str(t) for t in itl_ms),
    ]
    if tokenizer_dir is not None:
        cmd += ["--tokenizer", str(tokenizer_dir)]
    if cpu is not None:
        cmd += ["--cpu", str(cpu)]
    if boost:
        cmd.append("--boost")
    if slots is not None:
        cmd += ["--slots", str(slots)]
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()  # the port once listening, or "" if it died first
    if not line.startswith("PORT "):
        proc.kill()
        raise RuntimeError(f"scripted server did not start (said {line!r})")
    return proc, int(line.split()[1])


def stop_process(proc: Any) -> None:
    """Stop a server from `start_process` (it exits when its stdin closes), killing it if stuck."""
    proc.stdin.close()
    try:
        proc.wait(timeout=10)
    except Exception:
        proc.kill()
        proc.wait()


if __name__ == "__main__":
    raise SystemExit(main())
