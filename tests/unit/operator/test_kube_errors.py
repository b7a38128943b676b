"""How API failures reach kopf: each transient failure must become a TemporaryError with a
delay (a raw exception means kopf's 60 s default, or for event handlers no retry at all), and
definite answers (404 on a read, 409 on a create) stay answers. Served by a real HTTP server."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import kopf
import pytest
from kubernetes import client as k8s_client

from infertune.operator.k8s import UNREACHABLE_DELAY_S, Kube


class _Scripted(BaseHTTPRequestHandler):
    """Answers every request with the status (and headers) named by the server's `reply`: a Status
    object, or the raw text given as its third item."""

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        status, headers, *raw = self.server.reply  # type: ignore[attr-defined]
        body = raw[0] if raw else json.dumps({"kind": "Status", "message": f"scripted {status}"})
        body = body.encode()
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Type", "text/plain" if raw else "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_PATCH = do_DELETE = _answer  # noqa: N815 (http.server names them)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[ThreadingHTTPServer]:
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Scripted)
    srv.reply = (200, {})  # type: ignore[attr-defined]
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def _kube(port: int) -> Kube:
    cfg = k8s_client.Configuration(host=f"http://127.0.0.1:{port}")
    cfg.retries = 1
    return Kube(k8s_client.ApiClient(cfg))


def _job() -> dict[str, object]:
    return {"kind": "Job", "metadata": {"name": "j", "namespace": "ns"}}


def test_an_unreachable_api_server_is_retried_soon() -> None:
    with socket.socket() as s:  # a port nobody listens on: connection refused
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    kube = _kube(port)
    with pytest.raises(kopf.TemporaryError) as err:
        asyncio.run(kube.get("Job", "ns", "j"))
    assert err.value.delay == UNREACHABLE_DELAY_S < 60
    assert "get Job: API server unreachable" in str(err.value)


@pytest.mark.parametrize(
    ("status", "headers", "delay"),
    [
        (409, {}, 1.0),  # a write lost a race: re-read and retry at once
        (429, {"Retry-After": "7"}, 7.0),  # throttled: the server says when
        (429, {}, 5.0),
        (503, {}, 10.0),
        (500, {}, 10.0),
    ],
)
def test_transient_answers_become_temporary_errors(
    server: ThreadingHTTPServer, status: int, headers: dict[str, str], delay: float
) -> None:
    server.reply = (status, headers)  # type: ignore[attr-defined]
    kube = _kube(server.server_address[1])
    with pytest.raises(kopf.TemporaryError) as err:
        asyncio.run(kube.merge_patch("Job", "ns", "j", {"metadata": {"labels": {"a": "b"}}}))
    assert err.value.delay == delay
    assert "patch Job" in str(err.value)


def test_definite_answers_stay_answers(server: ThreadingHTTPServer) -> None:
    kube = _kube(server.server_address[1])
    server.reply = (404, {})  # type: ignore[attr-defined]
    assert asyncio.run(kube.get("Job", "ns", "gone")) is None
    assert asyncio.run(kube.delete("Job", "ns", "gone")) is False
    server.reply = (409, {})  # type: ignore[attr-defined]
    assert asyncio.run(kube.create(_job())) is False  # exists already: creation is idempotent
    server.reply = (422, {})  # type: ignore[attr-defined]
    with pytest.raises(Exception, match="HTTP 422: scripted 422") as err:
        asyncio.run(kube.create(_job()))
    assert not isinstance(err.value, kopf.TemporaryError)  # a rejected object is not retried


def test_a_path_the_api_server_does_not_serve_yet_is_retried_not_taken_as_gone(
    server: ThreadingHTTPServer,
) -> None:
    """Just after a restart the API server answers a custom resource's paths with its mux's plain
    "404 page not found" until it has loaded the CRD again: that is not "the object is gone"
    (a read returning None would drop the object's work), it is a retry."""
    kube = _kube(server.server_address[1])
    server.reply = (404, {}, "404 page not found\n")  # type: ignore[attr-defined]
    for call in (
        kube.get("InferenceService", "ns", "demo"),
        kube.delete("Job", "ns", "j"),
        kube.patch_status("ns", "demo", {"observedGeneration": 1}, None),
    ):
        with pytest.raises(kopf.TemporaryError, match="does not serve it") as err:
            asyncio.run(call)
        assert err.value.delay == UNREACHABLE_DELAY_S
