"""A serving pod that stalls, goes unready or is replaced still counts in the live window.

Each pod is the built-in engine's own metrics (EngineMetrics, the text its /metrics serves) behind a
real HTTP server on its own loopback address, read by the keep-checking loop's scrape path
(checking._observe with the pods as the pod index summarises them). Before the fix the scraper
deleted the history of every pod missing from the Ready targets, so with two replicas the requests
that made one stall never reached a window: SLOMet stayed True while users waited six seconds.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
from aiohttp import web

from infertune.engine.engine import EngineStats
from infertune.engine.metrics import CONTENT_TYPE, EngineMetrics
from infertune.operator.api import InferenceService, InferenceServiceStatus
from infertune.operator.checking import _observe
from infertune.operator.context import Ctx
from infertune.operator.drift import slo_check
from infertune.operator.monitor import Scraper, summarise
from infertune.operator.runtime import Runtime
from infertune.operator.settings import OperatorSettings
from infertune.tuner.api import SLO

FAST_TTFT, STALLED_TTFT, GAP, TOKENS = 0.08, 6.0, 0.02, 16


class Pod:
    """One serving pod's engine metrics, answering /metrics unless it is `stalled`."""

    def __init__(self, uid: str, ip: str) -> None:
        self.uid, self.ip = uid, ip
        self.metrics = EngineMetrics("m", EngineStats())
        self.stalled = False  # /metrics does not answer (the whole server is stuck)
        self.scrapes = 0

    def serve(self, n: int, ttft: float) -> None:
        """`n` finished requests, each with its first token after `ttft` s, then TOKENS - 1 gaps."""
        for _ in range(n):
            times = [ttft + GAP * i for i in range(TOKENS)]
            self.metrics.observe_tokens(0.0, None, times)
            self.metrics.observe_finished(
                reason="stop",
                prompt_tokens=100,
                token_times=times,
                arrival=0.0,
                end=times[-1],
                queue_time=0.0,
            )

    async def handle(self, _request: web.Request) -> web.Response:
        self.scrapes += 1
        if self.stalled:
            raise web.HTTPServiceUnavailable()
        return web.Response(body=self.metrics.render(), headers={"Content-Type": CONTENT_TYPE})

    def summary(self, ready: bool) -> dict[str, Any]:
        """The pod as pods.pod_summary gives it to the keep-checking loop."""
        return {"uid": self.uid, "ip": self.ip, "component": "serving", "track": "stable",
                "ready": ready, "phase": "Running"}  # fmt: skip


def _free_port() -> int:
    with socket.socket() as a, socket.socket() as b:
        a.bind(("127.0.0.1", 0))
        port = int(a.getsockname()[1])
        b.bind(("127.0.0.2", port))  # the same port on the second address must be free too
        return port


@asynccontextmanager
async def _pods(port: int, *pods: Pod) -> AsyncIterator[None]:
    runners = []
    for pod in pods:
        app = web.Application()
        app.router.add_get("/metrics", pod.handle)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, pod.ip, port).start()
        runners.append(runner)
    try:
        yield
    finally:
        for runner in runners:
            await runner.cleanup()


def _ctx(isvc: InferenceService, port: int, clock: Callable[[], float]) -> Ctx:
    settings = OperatorSettings(serving_port=port)
    rt = Runtime(settings=settings, kube=None, metrics=None)  # type: ignore[arg-type]
    rt.service((isvc.namespace, isvc.name)).scrapers["stable"] = Scraper(
        settings.scrape_timeout_s, clock=clock
    )
    status = InferenceServiceStatus()
    return Ctx(rt=rt, body={}, isvc=isvc, baseline=status, status=status)


def test_a_pod_that_stalls_and_goes_unready_keeps_its_slow_requests_in_the_verdict(
    isvc: InferenceService,
) -> None:
    """Two replicas; B stalls, answers 10 requests after 6 s each, fails readiness, still answers
    /metrics: the check must judge those 10 requests (TTFT p95 bound 2 s)."""
    port, clock = _free_port(), [0.0]
    a, b = Pod("uid-a", "127.0.0.1"), Pod("uid-b", "127.0.0.2")
    ctx = _ctx(isvc, port, lambda: clock[0])

    async def scenario() -> list[Any]:
        seen = []
        async with _pods(port, a, b):
            for t, ready_b, (fast_a, fast_b, stalled_b) in (
                (0.0, True, (0, 0, 0)),
                (15.0, True, (20, 20, 0)),
                (30.0, False, (20, 0, 10)),
            ):
                a.serve(fast_a, FAST_TTFT)
                b.serve(fast_b, FAST_TTFT)
                b.serve(stalled_b, STALLED_TTFT)
                clock[0] = t
                seen.append(await _observe(ctx, [a.summary(True), b.summary(ready_b)]))
        return seen

    baseline, steady, stalled = asyncio.run(scenario())
    assert baseline[0] is None
    slo = isvc.spec.slo
    assert slo_check(slo, steady[0].at_percentile)[0] is True and steady[0].requests == 40
    live = stalled[0]
    assert live is not None and live.requests == 30  # A's 20 and the 10 B answered late
    met, violating = slo_check(slo, live.at_percentile)
    assert met is False and violating and violating[0].startswith("ttft p95")
    assert (live.at_percentile["ttft"] or 0) > 2000


def test_an_unreachable_stalled_pod_is_counted_when_it_answers_again_at_its_own_rate(
    isvc: InferenceService,
) -> None:
    """B's /metrics does not answer during the stall (it is unready, still in the cluster): its
    history waits, and the next scrape that reaches it counts everything since, over its own
    30 s, beside A's 15 s: the rate is the sum of the pods' rates, not the total over 30 s."""
    port, clock = _free_port(), [0.0]
    a, b = Pod("uid-a", "127.0.0.1"), Pod("uid-b", "127.0.0.2")
    ctx = _ctx(isvc, port, lambda: clock[0])

    async def scenario() -> list[Any]:
        seen = []
        async with _pods(port, a, b):
            for t, ready_b, stalled, (fast_a, stalled_b) in (
                (0.0, True, False, (0, 0)),
                (15.0, True, False, (15, 0)),
                (30.0, False, True, (15, 0)),  # B: unready, /metrics unreachable
                (45.0, False, False, (15, 30)),  # B answers again, still unready
            ):
                a.serve(fast_a, FAST_TTFT)
                b.serve(stalled_b, STALLED_TTFT)
                b.stalled, clock[0] = stalled, t
                seen.append(await _observe(ctx, [a.summary(True), b.summary(ready_b)]))
        return seen

    *_, during, after = asyncio.run(scenario())
    slo = isvc.spec.slo
    assert during[0] is not None and during[0].requests == 15  # A alone; B's history kept
    assert slo_check(slo, during[0].at_percentile)[0] is True
    live = after[0]
    assert live is not None and live.requests == 45
    assert slo_check(slo, live.at_percentile)[0] is False
    # A: 15 requests / 15 s, B: 30 requests / 30 s -> 2 req/s (not 45 / 30 s = 1.5).
    assert live.figures.request_rate == pytest.approx(2.0)
    assert live.figures.output_tokens_per_second == pytest.approx(2.0 * TOKENS)
    assert live.figures.goodput_rps is not None and live.figures.goodput_rps < 2.0


def test_a_replaced_pod_is_read_once_more_then_forgotten(isvc: InferenceService) -> None:
    """B is deleted (gone from the pod index) while its server still drains: the last scrape
    counts what it answered since the previous check; after that it is never read again. The
    same when the last pod goes."""
    port, clock = _free_port(), [0.0]
    a, b = Pod("uid-a", "127.0.0.1"), Pod("uid-b", "127.0.0.2")
    ctx = _ctx(isvc, port, lambda: clock[0])

    async def scenario() -> list[Any]:
        seen = []
        async with _pods(port, a, b):
            for t, pods, (fast_a, stalled_b) in (
                (0.0, [a.summary(True), b.summary(True)], (0, 0)),
                (15.0, [a.summary(True)], (20, 10)),  # B gone from the cluster
                (30.0, [a.summary(True)], (20, 0)),
                (45.0, [], (5, 0)),  # scaled to zero: A's last requests, then nothing is kept
            ):
                a.serve(fast_a, FAST_TTFT)
                b.serve(stalled_b, STALLED_TTFT)
                clock[0] = t
                seen.append(await _observe(ctx, pods))
        return seen

    _, last, later, emptied = asyncio.run(scenario())
    assert last[0] is not None and last[0].requests == 30
    assert slo_check(isvc.spec.slo, last[0].at_percentile)[0] is False
    assert later[0] is not None and later[0].requests == 20
    assert b.scrapes == 2
    assert emptied[0] is not None and emptied[0].requests == 5
    assert ctx.rt.scraper(ctx.key).history == {}


def test_without_the_pod_list_a_pod_lingers_a_bounded_time_and_a_reused_ip_is_not_counted() -> None:
    """Scraper alone (no `present`): a pod that left the targets is read for `linger_s`, then
    forgotten; if its address now belongs to another pod it is forgotten at once, so the new pod's
    counters are not read twice."""
    port, clock = _free_port(), [0.0]
    a, b = Pod("uid-a", "127.0.0.1"), Pod("uid-b", "127.0.0.2")
    url = {p.uid: f"http://{p.ip}:{port}/metrics" for p in (a, b)}
    slo = SLO.model_validate({"ttft": {"max": "2s", "percentile": "p95"}})
    scraper = Scraper(timeout_s=2, linger_s=60.0, clock=lambda: clock[0])

    async def scenario() -> list[Any]:
        seen = []
        async with _pods(port, a, b):
            for t, targets, (fast_a, stalled_b) in (
                (0.0, url, (0, 0)),
                (15.0, {"uid-a": url["uid-a"]}, (10, 10)),  # B left the targets
                (60.0, {"uid-a": url["uid-a"]}, (10, 0)),  # still within linger_s
                (75.0, {"uid-a": url["uid-a"]}, (10, 0)),  # 60 s since it left: last read
                (90.0, {"uid-a": url["uid-a"]}, (10, 0)),
            ):
                a.serve(fast_a, FAST_TTFT)
                b.serve(stalled_b, STALLED_TTFT)
                clock[0] = t
                seen.append(await scraper.windows(targets))
            scrapes_b = b.scrapes
            # A new pod at B's address: B (had it stayed) must not be read under the new uid too.
            reuse = Scraper(timeout_s=2, clock=lambda: clock[0])
            for t, targets in ((0.0, url), (15.0, {"uid-a": url["uid-a"], "uid-c": url["uid-b"]})):
                b.serve(5, FAST_TTFT)
                clock[0] = t
                await reuse.windows(targets)
            seen.append(set(reuse.history))
        return [*seen, scrapes_b]

    _, left, lingering, last, after, reused, scrapes_b = asyncio.run(scenario())
    assert left.recent.requests == 20
    assert summarise(left.recent, slo).at_percentile["ttft"] > 2000
    assert lingering.recent.requests == 10 and last.recent.requests == 10
    assert after.recent.requests == 10 and "uid-b" not in scraper.history
    assert scrapes_b == 4  # read at 0, 15, 60 and 75 s; not at 90
    assert reused == {"uid-a", "uid-c"}


def test_an_evicted_pod_still_in_the_index_is_not_read_after_it_ended(
    isvc: InferenceService,
) -> None:
    """An evicted pod (phase Failed) stays in the API with its podIP while the IP may go to
    another pod: once it ended it is read no more, so another pod's requests at that address are
    not counted as this service's."""
    port, clock = _free_port(), [0.0]
    a, b = Pod("uid-a", "127.0.0.1"), Pod("uid-b", "127.0.0.2")
    ctx = _ctx(isvc, port, lambda: clock[0])
    evicted = {**b.summary(False), "phase": "Failed"}

    async def scenario() -> list[Any]:
        seen = []
        async with _pods(port, a, b):
            for t, pods, (fast_a, other_b) in (
                (0.0, [a.summary(True), b.summary(True)], (0, 0)),
                (15.0, [a.summary(True), evicted], (10, 0)),
                (30.0, [a.summary(True), evicted], (10, 50)),  # another pod now at B's address
            ):
                a.serve(fast_a, FAST_TTFT)
                b.serve(other_b, STALLED_TTFT)
                clock[0] = t
                seen.append(await _observe(ctx, pods))
        return seen

    *_, later = asyncio.run(scenario())
    assert later[0] is not None and later[0].requests == 10
    assert b.scrapes == 2
