"""Fault injection for the fault tests: find a pod's processes, kill or freeze them, cap their
memory with a real cgroup limit, kill the operator, and an HTTP proxy between the operator and the
API server that throttles (429), forces real write conflicts (409), answers 404 like a restarting
API server, or cuts the responses in flight."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import re
import signal
import socket
import ssl
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from operator_harness import OperatorProcess

# ------------------------------------------------------------------ processes


def children(pid: int) -> list[int]:
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*/children"):
        with contextlib.suppress(OSError, ValueError):
            out += [int(c) for c in task.read_text().split()]
    return out


def descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        for child in children(todo.pop()):
            out.append(child)
            todo.append(child)
    return out


def cmdline(pid: int) -> str:
    try:
        return (
            Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        )
    except OSError:
        return ""


def pod_pid(agent: Any, namespace: str, name: str) -> int | None:
    """The main container's process of a pod the node agent runs (None when not running)."""
    for worker in list(agent.workers.values()):
        meta = worker.pod["metadata"]
        if (meta["namespace"], meta["name"]) == (namespace, name) and worker.containers:
            proc = worker.containers[0].proc
            if proc is not None and proc.poll() is None:
                return int(proc.pid)
    return None


def engine_pids(root: int) -> list[int]:
    """Engine servers the tuner started under `root` (the trial's `infertune serve`)."""
    return [p for p in descendants(root) if "infertune.engine.cli" in cmdline(p)]


def kill_operator(op: OperatorProcess) -> None:
    """SIGKILL the operator's whole process group: no shutdown handler runs, like a node crash."""
    assert op.proc is not None
    os.killpg(op.proc.pid, signal.SIGKILL)
    op.proc.wait()
    op._log.close()
    op.proc = None


# ------------------------------------------------------------------ memory cgroup


def _memory_cgroup_root() -> Path:
    """This process's memory cgroup (v1 controller, else the unified v2 hierarchy)."""
    unified = Path("/sys/fs/cgroup")
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            return Path("/sys/fs/cgroup/memory") / path.lstrip("/")
        if controllers == "":
            unified = unified / path.lstrip("/")
    return unified


@contextlib.contextmanager
def memory_cap(pids: list[int], headroom_bytes: int) -> Iterator[Path]:
    """Move `pids` into a new memory cgroup that lets them allocate only `headroom_bytes` more
    together (what they already hold stays charged where it was): once they need more, the
    kernel's OOM killer ends the largest. A real OOM kill, exactly what a container's memory
    limit does."""
    root = _memory_cgroup_root()
    group = root / f"infertune-fault-{uuid.uuid4().hex[:8]}"
    group.mkdir()
    try:
        v1 = (group / "memory.limit_in_bytes").exists()
        for pid in pids:
            (group / "cgroup.procs").write_text(str(pid))
        usage = int((group / ("memory.usage_in_bytes" if v1 else "memory.current")).read_text())
        limit = usage + headroom_bytes
        (group / ("memory.limit_in_bytes" if v1 else "memory.max")).write_text(str(limit))
        yield group
    finally:
        for _ in range(50):
            try:
                group.rmdir()  # only once the killed process has left it
                break
            except OSError:
                time.sleep(0.2)


def oom_kills(group: Path) -> int:
    for line in (group / "memory.oom_control").read_text().splitlines():
        if line.startswith("oom_kill "):
            return int(line.split()[1])
    return 0


# ------------------------------------------------------------------ API fault proxy


@dataclass
class Fault:
    """Requests matching `method` and `path` (a regex) get `status` the first `times` times.

    429: answered by the proxy like the API server's priority-and-fairness throttling, with
    Retry-After. 409: `conflict` makes a real concurrent write first, then the request goes on to
    the API server, which itself answers 409 (the request's resourceVersion is now stale)."""

    method: str
    path: str
    status: int
    times: int
    retry_after: str = "1"
    conflict: Callable[[], None] | None = None
    body: str | None = None  # a regex the request body must match too (None: any body)
    injected: list[float] = field(default_factory=list)  # monotonic times of each injection
    upstream: list[int] = field(default_factory=list)  # API server's answers to injected 409s

    def matches(self, method: str, path: str, body: bytes | None = None) -> bool:
        return (
            len(self.injected) < self.times
            and method == self.method
            and re.search(self.path, path) is not None
            and (
                self.body is None
                or re.search(self.body, (body or b"").decode("utf-8", "replace")) is not None
            )
        )


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, *_args: Any) -> None:
        return

    def _handle(self) -> None:
        proxy = self.server.proxy
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else None
        fault = proxy.take(self.command, self.path, body)
        proxy.requests.append((time.monotonic(), self.command, self.path))
        if fault is not None and fault.status != 409:
            if fault.status == 404:
                # What a restarted API server answers for a custom resource until its CRD
                # informer has synced (kubernetes/kubernetes#71218): its mux's plain-text page.
                payload, content_type = b"404 page not found\n", "text/plain; charset=utf-8"
            else:
                payload = json.dumps({
                    "kind": "Status", "apiVersion": "v1", "status": "Failure", "code": fault.status,
                    "reason": "TooManyRequests", "message": "Too many requests, please try again later.",
                    "details": {"retryAfterSeconds": int(float(fault.retry_after))},
                }).encode()  # fmt: skip
                content_type = "application/json"
            self.send_response(fault.status)
            self.send_header("Content-Type", content_type)
            if fault.status != 404:
                self.send_header("Retry-After", fault.retry_after)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
            return
        if fault is not None and fault.conflict is not None:
            fault.conflict()
        skip = {"host", "connection", "content-length", "transfer-encoding", "accept-encoding"}
        headers = {k: v for k, v in self.headers.items() if k.lower() not in skip}
        conn = http.client.HTTPSConnection(proxy.host, proxy.port, context=proxy.ssl, timeout=600)
        try:
            conn.request(self.command, self.path, body=body, headers=headers)
            resp = conn.getresponse()
            if fault is not None:
                fault.upstream.append(resp.status)
            self.send_response(resp.status)
            for k, v in resp.getheaders():
                if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                    self.send_header(k, v)
            if resp.status in (204, 304) or self.command == "HEAD":
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            with proxy.streaming(self.connection):
                while chunk := resp.read1(65536):  # watches stream: pass each piece on at once
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                    self.wfile.flush()
                self.wfile.write(b"0\r\n\r\n")
        except (OSError, http.client.HTTPException):
            self.close_connection = True
        finally:
            conn.close()

    # http.server dispatches on these names.
    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = _handle  # noqa: N815


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    proxy: FaultProxy


class FaultProxy:
    """Plain HTTP on loopback in front of the API server's HTTPS (the operator's credentials pass
    through unchanged); `faults` decide which requests are throttled or conflicted."""

    def __init__(self, upstream: str, ca_cert: Path, faults: list[Fault]) -> None:
        url = urlparse(upstream)
        self.host, self.port = url.hostname or "127.0.0.1", int(url.port or 443)
        self.ssl = ssl.create_default_context(cafile=str(ca_cert))
        self.faults = faults
        self.requests: list[tuple[float, str, str]] = []
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()  # client connections with a response in flight
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.proxy = self
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def take(self, method: str, path: str, body: bytes | None = None) -> Fault | None:
        with self._lock:
            for fault in self.faults:
                if fault.matches(method, path, body):
                    fault.injected.append(time.monotonic())
                    return fault
        return None

    @contextlib.contextmanager
    def streaming(self, sock: socket.socket) -> Iterator[None]:
        with self._lock:
            self._open.add(sock)
        try:
            yield
        finally:
            with self._lock:
                self._open.discard(sock)

    def break_streams(self) -> int:
        """Cut every response in flight (the operator's watches) like an API server's crash does;
        the clients' next requests meet the faults. Returns how many were cut."""
        with self._lock:
            cut = list(self._open)
        for sock in cut:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        return len(cut)

    def start(self) -> FaultProxy:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
