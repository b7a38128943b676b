"""Live figures for a serving Deployment: Prometheus (bucket increases over the check window) or,
without it, the pods' own /metrics scraped twice and differenced. Both end in the same histogram
arithmetic, so both sources give the same numbers for the same traffic."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Mapping
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
    # family -> (observations/s, sum/s), each pod's increase divided by its own span, then summed:
    # pods' increases can span different times (one answered again after a stall), so the total
    # over the longest span is not the rate. None: every pod spans `seconds` (Prometheus).
    per_second: dict[str, tuple[float, float]] | None = None

    @property
    def requests(self) -> float:
        return self.hists[E2E].count if E2E in self.hists else 0.0

    def rate(self, family: str) -> tuple[float, float] | None:
        """(observations per second, sum per second) of `family`, or None when absent."""
        if self.per_second is not None:
            return self.per_second.get(family)
        hist = self.hists.get(family)
        if hist is None:
            return None
        seconds = max(self.seconds, 1e-9)
        return hist.count / seconds, hist.sum / seconds


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
    requests = window.requests
    per_second = window.rate(E2E)
    rate = per_second[0] if requests > 0 and per_second else None
    out_hist, prompt_hist = h.get(OUTPUT), h.get(PROMPT)
    out_rate = window.rate(OUTPUT)
    fig["request_rate"] = None if rate is None else round(rate, 4)
    fig["prompt_tokens_mean"] = prompt_hist.mean if prompt_hist else None
    fig["output_tokens_mean"] = out_hist.mean if out_hist else None
    fig["output_tokens_per_second"] = (
        round(out_rate[1], 3) if out_hist and out_hist.count and out_rate else None
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


# How long a pod that left the scrape targets is still scraped when the caller cannot say whether
# it is still in the cluster. A pod that stalls fails its readiness probe (3 x 5 s) and answers
# again later, its counters holding the requests that suffered the stall; bounded, because a
# deleted pod's IP may be given to another pod.
LINGER_S = 120.0


class Scraper:
    """Keeps recent scrapes of every pod; `windows()` returns the increase since the previous
    scrape, and over at least `min_span_s` (since the newest scrape that old, else the oldest).

    A check every 15 s at 0.7 req/s sees ~10 requests between two scrapes: fewer than a drift
    verdict needs, so with only that window a service with no Prometheus never retuned on drift
    (the Prometheus source's windows already span 30 s).

    A pod that stops being a target (unready: it stalled; terminating: it is being replaced) keeps
    its history and is still scraped: the requests it answered belong in the window, and the ones
    that made it unready most of all. Forgetting it at once hid a stall on one of two replicas
    from the verdict (SLOMet stayed True while users waited seconds).
    """

    def __init__(
        self,
        timeout_s: float,
        min_span_s: float = MIN_WINDOW_S,
        clock: Callable[[], float] = time.monotonic,
        linger_s: float = LINGER_S,
    ) -> None:
        self.timeout_s = timeout_s
        self.min_span_s = min_span_s
        self.clock = clock
        self.linger_s = linger_s
        self.history: dict[str, list[Scrape]] = {}  # pod uid -> scrapes, oldest first
        self.urls: dict[str, str] = {}  # pod uid -> its metrics URL when last known
        self.left: dict[str, float] = {}  # pod uid -> when it stopped being a target

    async def _fetch(self, session: aiohttp.ClientSession, url: str) -> str | None:
        try:
            async with session.get(url, timeout=aiohttp.ClientTimeout(total=self.timeout_s)) as r:
                return await r.text() if r.status == 200 else None
        except (aiohttp.ClientError, TimeoutError, OSError):
            return None

    def _to_scrape(
        self, targets: Mapping[str, str], present: Mapping[str, str] | None, now: float
    ) -> tuple[dict[str, str], set[str]]:
        """(uid -> URL to scrape now, uids whose URL now belongs to another pod)."""
        urls = dict(targets)
        owners = {url: uid for uid, url in {**(present or {}), **targets}.items()}
        reused: set[str] = set()
        for uid in self.history:
            if uid in targets:
                self.left.pop(uid, None)
                continue
            self.left.setdefault(uid, now)
            url = (present or {}).get(uid) or self.urls.get(uid)
            if url is None or owners.get(url, uid) != uid:
                reused.add(uid)  # its IP went to another pod: reading it would count that one
            else:
                urls[uid] = url
        return urls, reused

    async def windows(
        self, targets: Mapping[str, str], present: Mapping[str, str] | None = None
    ) -> ScrapeWindows | None:
        """`targets`: pod uid -> metrics URL of the pods serving now (Ready). `present`: the same
        for every pod of the service still in the cluster, Ready or not (terminating included);
        None when the caller cannot tell. A pod with history that is no longer a target is still
        scraped and counted; it is forgotten once gone from `present` (after one last scrape) or,
        without `present`, `linger_s` after it left the targets. None until a pod has a previous
        scrape."""
        now = self.clock()
        urls, reused = self._to_scrape(targets, present, now)
        async with aiohttp.ClientSession() as session:
            texts = await asyncio.gather(*(self._fetch(session, url) for url in urls.values()))
        recent, traffic = _Sum(), _Sum()
        for (uid, url), text in zip(urls.items(), texts, strict=True):
            if text is None:
                continue  # unreachable now (stalled, restarting): its history waits
            self.urls[uid] = url
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
        for uid in list(self.history):
            if uid in targets:
                continue
            if present is not None:
                gone = uid not in present
            else:
                gone = now - self.left[uid] >= self.linger_s
            if gone or uid in reused:
                del self.history[uid]
                self.urls.pop(uid, None)
                self.left.pop(uid, None)
        if not recent.spans:
            return None
        return ScrapeWindows(recent=recent.window(), traffic=traffic.window())


@dataclass
class _Sum:
    """Histogram increases summed over pods, each pod's rate by its own span, and the longest
    span among them."""

    hists: dict[str, Histogram] = field(default_factory=dict)
    spans: list[float] = field(default_factory=list)
    per_second: dict[str, tuple[float, float]] = field(default_factory=dict)

    def add(self, current: Scrape, earlier: Scrape) -> None:
        span = max(current.time - earlier.time, 1e-9)
        self.spans.append(span)
        for name, hist in current.hists.items():
            delta = hist.minus(earlier.hists.get(name, Histogram()))
            self.hists[name] = self.hists.get(name, Histogram()).add(delta)
            count, total = self.per_second.get(name, (0.0, 0.0))
            self.per_second[name] = (count + delta.count / span, total + delta.sum / span)

    def window(self) -> Window:
        return Window(seconds=max(self.spans), hists=self.hists, per_second=self.per_second)


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
