"""The operator's watch wrapper: which API failures it waits out, when it gives up, what it says,
and that it wraps the kopf function it expects. The errors are kopf's own classes; the cluster test
drives real 404s through kopf's own watcher (tests/integration/test_faults_watch.py)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest
from kopf._cogs.clients import watching
from kopf._cogs.clients.errors import APIForbiddenError, APINotFoundError, APIServerError

from infertune.operator.resilient_watch import Backoff, WatchGaveUpError, install, tolerant

FAST = Backoff(first_s=0.001, max_s=0.001, give_up_after_s=300)
KW = {"settings": None, "resource": "inferenceservices", "namespace": "ns"}


def not_found() -> APINotFoundError:
    return APINotFoundError("404 page not found", status=404, headers={})


class Stream:
    """kopf's continuous_watch stand-in: each call yields `items`, then raises the next error."""

    def __init__(self, *errors: BaseException, items: tuple[Any, ...] = ()) -> None:
        self.errors, self.items, self.calls = list(errors), items, 0

    async def __call__(self, **_kw: Any) -> AsyncIterator[Any]:
        self.calls += 1
        for item in self.items:
            yield item
        if self.errors:
            raise self.errors.pop(0)


async def drain(watch: Any, times: int) -> list[Any]:
    """What kopf's infinite_watch does: open the stream again each time it ends."""
    seen: list[Any] = []
    for _ in range(times):
        seen += [item async for item in watch(**KW)]
    return seen


def test_404s_and_5xx_end_the_stream_quietly_and_each_is_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    inner = Stream(not_found(), APIServerError("etcd", status=503, headers={}), not_found())
    with caplog.at_level(logging.WARNING, logger="infertune.operator"):
        asyncio.run(drain(tolerant(inner, FAST), 4))
    assert inner.calls == 4
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3
    assert "inferenceservices in ns got HTTP 404 (404 page not found)" in lines[0]
    assert "HTTP 503" in lines[1] and "(attempt 3;" in lines[2]


def test_forbidden_ends_the_operator_at_once_naming_the_rbac_to_check() -> None:
    inner = Stream(APIForbiddenError("forbidden", status=403, headers={}))
    with pytest.raises(WatchGaveUpError, match=r"HTTP 403.*ClusterRole"):
        asyncio.run(drain(tolerant(inner, FAST), 2))
    assert inner.calls == 1


def test_a_crd_that_never_appears_ends_the_operator_with_what_to_install() -> None:
    now = [0.0]

    class Slow(Stream):
        async def __call__(self, **kw: Any) -> AsyncIterator[Any]:
            now[0] += 20.0  # each try fails 20 s after the one before
            async for item in super().__call__(**kw):
                yield item

    inner = Slow(*[not_found() for _ in range(30)])
    # Failures at 20, 40, ... s; the 17th is 320 s after the first, past the 300 s allowed.
    with pytest.raises(WatchGaveUpError, match=r"404 for 320 s over 17 attempts.*install the CRDs"):
        asyncio.run(drain(tolerant(inner, FAST, clock=lambda: now[0]), 30))


def test_anything_received_ends_the_outage() -> None:
    """Blips with healthy streams between them are separate outages, never one past the limit."""
    now = [0.0]
    inner = Stream(*[not_found() for _ in range(5)], items=({"type": None},))

    def clock() -> float:
        now[0] += 3600.0
        return now[0]

    watch = tolerant(inner, Backoff(first_s=0.001, give_up_after_s=10), clock)
    assert len(asyncio.run(drain(watch, 6))) == 6  # every stream's item came through


def test_other_errors_are_not_swallowed() -> None:
    with pytest.raises(ValueError, match="a bug"):
        asyncio.run(drain(tolerant(Stream(ValueError("a bug")), FAST), 1))


def test_install_wraps_kopfs_own_watch_once(monkeypatch: pytest.MonkeyPatch) -> None:
    original = watching.continuous_watch
    monkeypatch.setattr(watching, "continuous_watch", original)  # undone after the test
    assert install(FAST)
    wrapped = watching.continuous_watch
    assert wrapped is not original and getattr(wrapped, "infertune_tolerant", False)
    assert install(FAST)
    assert watching.continuous_watch is wrapped  # not wrapped twice


def test_a_kopf_whose_watch_changed_is_left_alone_with_a_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    async def other(*, settings: Any, resource: Any) -> AsyncIterator[Any]:
        yield None

    monkeypatch.setattr(watching, "continuous_watch", other)
    with caplog.at_level(logging.WARNING, logger="infertune.operator"):
        assert not install(FAST)
    assert watching.continuous_watch is other
    assert "not one the operator was tested with" in caplog.text
