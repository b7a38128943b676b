"""Live figures for a serving Deployment: Prometheus (bucket increases over the check window) or,
without it, the pods' own /metrics scraped twice and differenced. Both end in the same histogram
arithmetic, so both sources give the same numbers for the same traffic."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from infertune.operator.api import Figures
from infertune.operator.histograms import (
    E2E,
    FAMILIES,
    ITL,
    OTHER_NAMES,
    OUTPUT,
    PROMPT,
    REQUEST_TPOT,
    TTFT,
    Histogram,
    parse_exposition,
)
from infertune.tuner.api import SLO
from infertune.tuner.api.base import PERCENTILES
from infertune.tuner.verdict import goodput_from_shares

# Each SLO metric's histogram for its percentiles (ITL per gap) ...
METRIC_FAMILY = {"ttft": TTFT, "itl": ITL, "e2e": E2E}
# ... and for a request's goodput verdict (ITL by the request's mean gap; see tuner.verdict).
REQUEST_FAMILY = {"ttft": TTFT, "itl": REQUEST_TPOT, "e2e": E2E}
# The shortest window either source judges: Prometheus' increase() needs two samples of its
# scrape interval, and the operator's own scraper spans the same so that a verdict (and whether
# a window holds enough requests to count toward drift) does not depend on which source answered.
MIN_WINDOW_S = 30.0


@dataclass
class Window:
    """Histogram increases over `seconds`, summed over the serving pods."""

    seconds: float
    hists: dict[str, Histogram] = field(default_factory=dict)

    @property
    def requests(self) -> float:
        return self.hists[E2E].count if E2E in self.hists else 0.0


@dataclass(frozen=True)
class Live:
    figures: Figures
    at_percentile: dict[str, float | None]  # metric -> ms at the SLO's percentile
    requests: float
    prompt_p95: float | None
    output_p95: float | None


def _ms(value: float | None) -> float | None:
    return None if value is None else round(value * 1e3, 3)


def summarise(window: Window, slo: SLO) -> Live:
    """Figures (p50/p95/p99 in ms, rates, mean lengths, estimated goodput) from one window."""
    h = window.hists
    fig: dict[str, Any] = {}
    for metric, family in METRIC_FAMILY.items():
        hist = h.get(family)
        for p, q in PERCENTILES.items():
            fig[f"{metric}_{p}_ms"] = _ms(hist.quantile(q / 100)) if hist else None
    at: dict[str, float | None] = {}
    for metric, objective in slo.bounds().items():
        hist = h.get(METRIC_FAMILY[metric])
        at[metric] = _ms(hist.quantile(objective.quantile / 100)) if hist else None
    seconds = max(window.seconds, 1e-9)
    requests = window.requests
    rate = requests / seconds if requests > 0 else None
    out_hist, prompt_hist = h.get(OUTPUT), h.get(PROMPT)
    fig["request_rate"] = None if rate is None else round(rate, 4)
    fig["prompt_tokens_mean"] = prompt_hist.mean if prompt_hist else None
    fig["output_tokens_mean"] = out_hist.mean if out_hist else None
    fig["output_tokens_per_second"] = (
        round(out_hist.sum / seconds, 3) if out_hist and out_hist.count else None
    )
    # Goodput as the tuner defines it, estimated from each bound's share of requests within it.
    if rate is not None:
        shares = [
            h[REQUEST_FAMILY[m]].fraction_below(float(o.max))
            for m, o in slo.bounds().items()
            if REQUEST_FAMILY[m] in h
        ]
        fig["goodput_rps"] = round(goodput_from_shares(rate, shares), 4)
    return Live(
        figures=Figures.model_validate(fig),
        at_percentile=at,
        requests=requests,
        prompt_p95=prompt_hist.quantile(0.95) if prompt_hist else None,
        output_p95=out_hist.quantile(0.95) if out_hist else None,
    )


@dataclass
class Scrape:
    time: float
    hists: dict[str, Histogram]


@dataclass(frozen=True)
class ScrapeWindows:
    """Since the previous scrape (SLO verdicts: a short stall stays visible), and over at least
    the scraper's ``min_span_s`` (traffic shape: enough requests to count toward drift)."""

    recent: Window
    traffic: Window


class Scraper:
    """Keeps recent scrapes of every pod; `windows()` returns the increase since the previous
    scrape, and over at least `min_span_s` (since the newest scrape that old, else the oldest).

    A check every 15 s at 0.7 req/s sees ~10 requests between two scrapes: fewer than a drift
    verdict needs, so with only that window a service with no Prometheus never retuned on drift
    (the Prometheus source's windows already span 30 s).
    """

    def __init__(
        self,
        timeout_s: float,
        min_span_s: float = MIN_WINDOW_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.timeout_s = timeout_s
        self.min_span_s = min_span_s
        self.clock = clock
        self.history: dict[str, list[Scrape]] = {}  # pod uid -> scrapes, oldest first

    async def _fetch(self, session: aiohttp.ClientSession, url: str) -> str | None:
        try:
            async with session.get(url, timeout=aiohttp.ClientTimeout(total=self.timeout_s)) as r:
                return await r.text() if r.status == 200 else None
        except (aiohttp.ClientError, TimeoutError, OSError):
            return None

    async def windows(self, targets: dict[str, str]) -> ScrapeWindows | None:
        """`targets`: pod uid -> metrics URL. None until a pod has a previous scrape."""
        async with aiohttp.ClientSession() as session:
            texts = await asyncio.gather(*(self._fetch(session, url) for url in targets.values()))
        now = self.clock()
        recent, traffic = _Sum(), _Sum()
        for uid, text in zip(targets, texts, strict=True):
            if text is None:
                continue
            current = Scrape(now, parse_exposition(text, FAMILIES))
            history = self.history.setdefault(uid, [])
            if not history:
                history.append(current)
                continue
            # Checks come a little early or late: 5% slack keeps "two checks of 15 s ago" in.
            old_enough = [s for s in history if now - s.time >= 0.95 * self.min_span_s]
            base = old_enough[-1] if old_enough else history[0]
            recent.add(current, history[-1])
            traffic.add(current, base)
            # Keep the baseline and everything newer: later windows start from those.
            self.history[uid] = [s for s in history if s.time >= base.time] + [current]
        for uid in set(self.history) - set(targets):
            del self.history[uid]  # pods that went away
        if not recent.spans:
            return None
        return ScrapeWindows(recent=recent.window(), traffic=traffic.window())


@dataclass
class _Sum:
    """Histogram increases summed over pods, and the longest span among them."""

    hists: dict[str, Histogram] = field(default_factory=dict)
    spans: list[float] = field(default_factory=list)

    def add(self, current: Scrape, earlier: Scrape) -> None:
        self.spans.append(current.time - earlier.time)
        for name, hist in current.hists.items():
            delta = hist.minus(earlier.hists.get(name, Histogram()))
            self.hists[name] = self.hists.get(name, Histogram()).add(delta)

    def window(self) -> Window:
        return Window(seconds=max(self.spans), hists=self.hists)


def promql_bucket_query(family: str, namespace: str, pod_regex: str, seconds: float) -> str:
    sel = f'namespace="{namespace}",pod=~"{pod_regex}"'
    return f"sum by (le) (increase({family}_bucket{{{sel}}}[{int(seconds)}s]))"


def promql_sum_query(family: str, namespace: str, pod_regex: str, seconds: float) -> str:
    sel = f'namespace="{namespace}",pod=~"{pod_regex}"'
    return f"sum(increase({family}_sum{{{sel}}}[{int(seconds)}s]))"


class PrometheusError(Exception):
    """Prometheus did not answer a query usefully (unreachable, timed out, an error status)."""


class PrometheusSource:
    """Bucket increases from the Prometheus HTTP API (`/api/v1/query`)."""

    def __init__(self, url: str, timeout_s: float) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s

    async def _query(self, session: aiohttp.ClientSession, promql: str) -> list[dict[str, Any]]:
        try:
            async with session.get(
                f"{self.url}/api/v1/query",
                params={"query": promql},
                timeout=aiohttp.ClientTimeout(total=self.timeout_s),
            ) as r:
                status, text = r.status, await r.text()
        except TimeoutError:
            raise PrometheusError(f"no answer within {self.timeout_s:g}s") from None
        except (aiohttp.ClientError, OSError) as exc:
            raise PrometheusError(_short(exc)) from None
        try:
            body = json.loads(text)
        except ValueError:
            body = None
        if not isinstance(body, dict):
            raise PrometheusError(f"query failed: HTTP {status}, not a Prometheus API answer")
        if body.get("status") != "success":
            raise PrometheusError(f"query failed: HTTP {status}: {str(body.get('error'))[:200]}")
        result: list[dict[str, Any]] = body["data"]["result"]
        return result

    async def window(self, namespace: str, pod_regex: str, seconds: float) -> Window:
        span = max(seconds, MIN_WINDOW_S)
        hists: dict[str, Histogram] = {}
        async with aiohttp.ClientSession() as session:
            for family in FAMILIES:
                # An engine that exports a family under another name (an older vLLM's, SGLang's)
                # is read under that name.
                for name in (family, *OTHER_NAMES.get(family, ())):
                    rows = await self._query(
                        session, promql_bucket_query(name, namespace, pod_regex, span)
                    )
                    if rows:
                        break
                if not rows:
                    continue
                buckets = {float(r["metric"]["le"]): float(r["value"][1]) for r in rows}
                sums = await self._query(
                    session, promql_sum_query(name, namespace, pod_regex, span)
                )
                total = max(buckets.values())
                hists[family] = Histogram(
                    buckets, float(sums[0]["value"][1]) if sums else 0.0, total
                )
        return Window(seconds=span, hists=hists)


def _short(exc: BaseException) -> str:
    """A connection error in a few stable words (aiohttp's messages repeat the whole request)."""
    text = str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {text.splitlines()[0][:200]}"
