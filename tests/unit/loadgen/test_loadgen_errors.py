"""Bad input is counted as failed requests with reasons; the run still completes and reports."""

from __future__ import annotations

import socket

import pytest
from loadgen_helpers import ServerFactory

from infertune.tuner.api import SLO, TrafficProfile
from infertune.tuner.loadgen import run_load_sync

SLO_TTFT = SLO.model_validate({"ttft": {"max": "1s"}})


def _traffic(n: int = 12, **extra: object) -> TrafficProfile:
    body: dict[str, object] = {"concurrency": 3, "numRequests": n, "warmupRequests": 2}
    body.update(extra)
    body.setdefault("outputTokens", {"mean": 4})
    return TrafficProfile.model_validate(body)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_unreachable_url_fails_every_request_with_the_reason() -> None:
    url = f"http://127.0.0.1:{_free_port()}"
    result = run_load_sync(url, _traffic(), SLO_TTFT, model="m")
    assert (result.sent, result.completed, result.failed) == (12, 0, 12)
    assert result.errors == {"connection refused": 12}
    assert result.goodput == 0.0
    assert result.slo_met == {"ttft": False}


@pytest.mark.parametrize(
    ("model", "reason"),
    [
        ("fail-500", "HTTP 500"),
        ("fail-503", "HTTP 503"),
        ("malformed", "malformed stream chunk"),
        ("disconnect", "server closed the connection mid-stream"),
        ("error-event", "server error in stream"),
    ],
)
def test_server_faults_are_failed_requests(
    scripted_server: ServerFactory, model: str, reason: str
) -> None:
    url = scripted_server([1.0], [1.0])
    result = run_load_sync(url, _traffic(), SLO_TTFT, model=model)
    assert result.failed == 12 and result.completed == 0
    assert result.errors == {reason: 12}
    detail = result.records[0].error
    assert detail is not None and detail.startswith(reason)
    if model == "fail-500":
        assert "scripted failure" in detail  # the server's own message is kept


def test_failures_mixed_with_successes_keep_the_successes(scripted_server: ServerFactory) -> None:
    """The same server, healthy afterwards: a fault does not poison later requests."""
    url = scripted_server([1.0], [1.0])
    bad = run_load_sync(url, _traffic(6), model="disconnect")
    good = run_load_sync(url, _traffic(6, rate=50.0), model="ok")
    assert bad.failed == 6
    assert good.completed == 6 and good.failed == 0 and good.ttft.count == 6


def test_timeout_is_a_failure_not_a_hang(scripted_server: ServerFactory) -> None:
    from infertune.tuner.loadgen import Options

    url = scripted_server([5000.0], [1.0])
    result = run_load_sync(
        url, _traffic(3, warmupRequests=0), model="ok", options=Options(timeout=0.3)
    )
    assert result.errors == {"timeout after 0.3s": 3}
