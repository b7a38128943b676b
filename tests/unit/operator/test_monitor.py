"""Live figures from /metrics: parsing, differencing two scrapes, PromQL-equivalent quantiles."""

from __future__ import annotations

import asyncio
import random
import socket
from typing import Any

import pytest
from aiohttp import web
from fake_engine_metrics import FakeEngine

from infertune.operator.histograms import (
    E2E,
    FAMILIES,
    ITL,
    ITL_DEPRECATED,
    PROMPT,
    SGLANG_NAMES,
    TTFT,
    parse_exposition,
)
from infertune.operator.histograms import Histogram as Hist
from infertune.operator.monitor import (
    PrometheusError,
    PrometheusSource,
    Scraper,
    ScrapeWindows,
    Window,
    promql_bucket_query,
    summarise,
)
from infertune.tuner.api import SLO


def test_quantiles_match_histogram_quantile_semantics() -> None:
    h = Hist({0.1: 0.0, 0.2: 50.0, 0.4: 100.0, float("inf"): 100.0}, 20.0, 100.0)
    assert h.quantile(0.5) == pytest.approx(0.2)
    assert h.quantile(0.75) == pytest.approx(0.3)
    assert h.quantile(0.25) == pytest.approx(0.15)
    assert h.fraction_below(0.3) == pytest.approx(0.75)
    assert h.mean == pytest.approx(0.2)
    overflow = Hist({0.1: 1.0, float("inf"): 10.0}, 5.0, 10.0)
    assert overflow.quantile(0.99) == 0.1  # PromQL returns the highest finite bound
    assert Hist().quantile(0.5) is None


async def _serve(app: web.Application) -> tuple[web.AppRunner, int]:
    """``app`` on a free loopback port: the runner (to clean up) and the port."""
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, int(site._server.sockets[0].getsockname()[1])  # type: ignore[union-attr]


def test_difference_of_two_scrapes_is_the_window_and_resets_are_survived() -> None:
    engine = FakeEngine()
    for _ in range(100):
        engine.request(ttft=0.02, itl=0.01, prompt=40, output=10)  # before the window
    before = parse_exposition(engine.text())
    for _ in range(50):
        engine.request(ttft=0.4, itl=0.03, prompt=700, output=20)  # the window
    after = parse_exposition(engine.text())
    window = {name: after[name].minus(before[name]) for name in after}
    assert window[E2E].count == 50
    assert window[PROMPT].mean == pytest.approx(700)
    assert 0.25 <= (window[TTFT].quantile(0.95) or 0) <= 0.5
    restarted = parse_exposition(FakeEngine().text())
    assert restarted[E2E].minus(after[E2E]).count == 0  # reset: counts from zero, never negative


def test_summary_of_a_window_gives_figures_and_slo_percentiles() -> None:
    rng = random.Random(7)
    engine = FakeEngine()
    start = parse_exposition(engine.text())
    for _ in range(200):
        engine.request(
            ttft=rng.uniform(0.05, 0.2), itl=0.02, prompt=rng.randint(64, 128), output=32
        )
    end = parse_exposition(engine.text())
    window = Window(seconds=20.0, hists={n: end[n].minus(start[n]) for n in end})
    slo = SLO.model_validate({"ttft": {"max": "150ms", "percentile": "p90"}, "e2e": {"max": "2s"}})
    live = summarise(window, slo)
    f = live.figures
    assert f.request_rate == pytest.approx(10.0)
    assert f.output_tokens_mean == pytest.approx(
        32
    ) and f.output_tokens_per_second == pytest.approx(320)
    assert 90 <= (f.prompt_tokens_mean or 0) <= 102
    assert live.at_percentile["ttft"] is not None and 100 <= live.at_percentile["ttft"] <= 250
    assert f.ttft_p50_ms is not None and f.ttft_p99_ms is not None and f.ttft_p50_ms < f.ttft_p99_ms
    # About a third of the requests exceed 150ms TTFT, so goodput is well below the rate.
    assert f.goodput_rps is not None and 5.0 < f.goodput_rps < 8.5
    assert live.requests == 200


def test_scraper_needs_two_scrapes_and_sums_pods() -> None:
    engines = [FakeEngine(), FakeEngine()]

    async def scenario() -> tuple[ScrapeWindows | None, Window | None]:
        app = web.Application()

        def handler(eng: FakeEngine) -> Any:
            async def serve(_request: web.Request) -> web.Response:
                return web.Response(text=eng.text())

            return serve

        for i, eng in enumerate(engines):
            app.router.add_get(f"/{i}/metrics", handler(eng))
        runner, port = await _serve(app)
        targets = {f"pod-{i}": f"http://127.0.0.1:{port}/{i}/metrics" for i in range(2)}
        targets["gone"] = f"http://127.0.0.1:{port}/missing/metrics"
        scraper = Scraper(timeout_s=2)
        first = await scraper.windows(targets)
        for eng in engines:
            for _ in range(5):
                eng.request(ttft=0.1, itl=0.01, prompt=100, output=8)
        second = await scraper.windows(targets)
        await runner.cleanup()
        return first, second.recent if second else None

    first, second = asyncio.run(scenario())
    assert first is None
    assert second is not None and second.requests == 10


def test_traffic_windows_span_the_minimum_so_a_slow_service_counts_toward_drift() -> None:
    """Checks every 15 s on a service doing 10 requests per check: the traffic window spans 30 s
    (as the Prometheus source's does) and holds 20 requests, enough for a drift verdict; it grows
    from the first scrape until it is that long, then slides. SLO verdicts keep the window since
    the previous check, so a short stall is not diluted."""
    engine = FakeEngine()
    clock = [0.0]

    async def scenario() -> list[ScrapeWindows | None]:
        app = web.Application()

        async def serve(_request: web.Request) -> web.Response:
            return web.Response(text=engine.text())

        app.router.add_get("/metrics", serve)
        runner, port = await _serve(app)
        scraper = Scraper(timeout_s=2, min_span_s=30.0, clock=lambda: clock[0])
        seen = []
        for check in range(5):
            clock[0] = 15.0 * check + (0.4 if check == 2 else 0.0)  # a check a little late
            seen.append(await scraper.windows({"pod": f"http://127.0.0.1:{port}/metrics"}))
            for _ in range(10):
                engine.request(ttft=0.1, itl=0.01, prompt=100, output=8)
        await runner.cleanup()
        return seen

    first, *rest = asyncio.run(scenario())
    assert first is None
    windows = [w for w in rest if w is not None]
    traffic = [(round(w.traffic.seconds, 3), w.traffic.requests) for w in windows]
    assert traffic == [(15.0, 10), (30.4, 20), (30.0, 20), (29.6, 20)]
    recent = [(round(w.recent.seconds, 3), w.recent.requests) for w in windows]
    assert recent == [(15.0, 10), (15.4, 10), (14.6, 10), (15.0, 10)]
    live = summarise(windows[-1].traffic, SLO.model_validate({"e2e": {"max": "2s"}}))
    assert live.requests == 20 and live.figures.request_rate == pytest.approx(20 / 29.6, abs=1e-3)


def test_promql_selects_the_deployments_pods() -> None:
    q = promql_bucket_query(TTFT, "team-a", "tiny-demo-[a-z0-9]+-[a-z0-9]+", 60)
    assert q == (
        "sum by (le) (increase(vllm:time_to_first_token_seconds_bucket"
        '{namespace="team-a",pod=~"tiny-demo-[a-z0-9]+-[a-z0-9]+"}[60s]))'
    )


def test_prometheus_failures_are_one_error_type_with_a_short_reason() -> None:
    """The monitor falls back to scraping pods on PrometheusError; every way Prometheus can fail
    must surface as that error, with a message stable enough for a condition."""

    async def scenario() -> list[str]:
        app = web.Application()

        async def bad_query(_request: web.Request) -> web.Response:
            return web.json_response(
                {"status": "error", "errorType": "bad_data", "error": "parse error"}, status=400
            )

        async def not_json(_request: web.Request) -> web.Response:
            return web.Response(text="<html>proxy error</html>", status=502)

        app.router.add_get("/bad/api/v1/query", bad_query)
        app.router.add_get("/html/api/v1/query", not_json)
        runner, port = await _serve(app)
        with socket.socket() as s:  # a port nobody listens on
            s.bind(("127.0.0.1", 0))
            closed = s.getsockname()[1]
        messages = []
        for url in (f"http://127.0.0.1:{port}/bad", f"http://127.0.0.1:{port}/html",
                    f"http://127.0.0.1:{closed}"):  # fmt: skip
            with pytest.raises(PrometheusError) as err:
                await PrometheusSource(url, timeout_s=2).window("ns", "x-.*", 30)
            messages.append(str(err.value))
        await runner.cleanup()
        return messages

    bad, html, closed = asyncio.run(scenario())
    assert "parse error" in bad
    assert "query failed" in html
    assert "Connect" in closed and len(closed) < 300


def test_an_engine_with_the_deprecated_itl_name_is_read_and_one_with_both_is_not_counted_twice() -> (
    None
):
    old, both = FakeEngine(itl_names=(ITL_DEPRECATED,)), FakeEngine(itl_names=(ITL, ITL_DEPRECATED))
    for engine in (old, both):
        for _ in range(10):
            engine.request(ttft=0.1, itl=0.02, prompt=40, output=11)
    assert parse_exposition(old.text())[ITL].count == 100
    hists = parse_exposition(both.text())
    assert hists[ITL].count == 100 and ITL_DEPRECATED not in hists


def test_an_sglang_server_gets_the_same_figures_as_vllm_for_the_same_traffic() -> None:
    """SGLang (--enable-metrics) exports the same histograms as sglang:*; the live check reads them
    as the same families, so a SGLang Deployment gets SLO verdicts, goodput and drift too."""
    vllm, sglang = FakeEngine(), FakeEngine(itl_names=(SGLANG_NAMES[ITL],), names=SGLANG_NAMES)
    windows = []
    for engine in (vllm, sglang):
        start = parse_exposition(engine.text())
        rng = random.Random(3)
        for _ in range(100):
            engine.request(
                ttft=rng.uniform(0.05, 0.3), itl=0.02, prompt=rng.randint(64, 128), output=16
            )
        end = parse_exposition(engine.text())
        assert set(end) == set(FAMILIES)
        windows.append(Window(seconds=10.0, hists={n: end[n].minus(start[n]) for n in end}))
    slo = SLO.model_validate({"ttft": {"max": "150ms"}, "itl": {"max": "50ms"}})
    assert "sglang:time_to_first_token_seconds_bucket" in sglang.text()
    assert "vllm:" not in sglang.text()
    from_vllm, from_sglang = (summarise(w, slo) for w in windows)
    assert from_sglang == from_vllm
    assert from_sglang.figures.goodput_rps is not None and from_sglang.prompt_p95 is not None


def test_prometheus_reads_a_family_under_sglangs_name_when_vllms_is_absent() -> None:
    engine = FakeEngine(itl_names=(SGLANG_NAMES[ITL],), names=SGLANG_NAMES)
    for _ in range(10):
        engine.request(ttft=0.1, itl=0.02, prompt=40, output=11)
    exported = parse_exposition(engine.text())
    asked: list[str] = []

    async def scenario() -> Window:
        app = web.Application()

        async def query(request: web.Request) -> web.Response:
            promql = request.query["query"]
            asked.append(promql)
            rows: list[dict[str, Any]] = []
            for family, name in SGLANG_NAMES.items():
                hist = exported[family]
                if f"({name}_bucket" in promql:
                    rows = [
                        {"metric": {"le": str(le)}, "value": [0, str(n)]}
                        for le, n in hist.buckets.items()
                    ]
                elif f"({name}_sum" in promql:
                    rows = [{"metric": {}, "value": [0, str(hist.sum)]}]
            return web.json_response({"status": "success", "data": {"result": rows}})

        app.router.add_get("/api/v1/query", query)
        runner, port = await _serve(app)
        window = await PrometheusSource(f"http://127.0.0.1:{port}", timeout_s=2).window(
            "ns", "x-.*", 30
        )
        await runner.cleanup()
        return window

    window = asyncio.run(scenario())
    assert window.requests == 10 and window.hists[ITL].count == 100
    assert any("sglang:inter_token_latency_seconds_bucket" in q for q in asked)
