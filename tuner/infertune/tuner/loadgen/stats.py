"""Summaries of a run: latency percentiles, throughput, goodput, SLO attainment, saturation.

Both SLO questions are answered by :mod:`infertune.tuner.verdict`: goodput counts the requests
that met every bound (ITL by the request's mean gap), and whether the SLO is met is each bound's
stated percentile (over requests, or over all token gaps for ITL) within its `max`.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from infertune.tuner.api import SLO
from infertune.tuner.api.base import PERCENTILES
from infertune.tuner.loadgen.client import RequestRecord
from infertune.tuner.verdict import judge, request_meets

QUANTILES = PERCENTILES
# Saturation: achieved below this share of the offered rate, or a backlog growing this fast.
ACHIEVED_RATE_FLOOR = 0.9
QUEUE_GROWTH_SHARE = 0.05
QUEUE_GROWTH_MIN = 10.0
SEND_LAG_LIMIT_MS = 50.0
# The first and the last request each fall outside the latency-shifted completion window when
# their latency is on the wrong side of the median: up to two completions short with no backlog.
WINDOW_EDGE_REQUESTS = 2


@dataclass(frozen=True, slots=True)
class Summary:
    """Distribution of one latency, in milliseconds (None when there were no samples)."""

    count: int
    mean: float | None = None
    p50: float | None = None
    p90: float | None = None
    p95: float | None = None
    p99: float | None = None
    max: float | None = None

    @classmethod
    def of(cls, seconds: np.ndarray | list[float]) -> Summary:
        arr = np.asarray(seconds, dtype=np.float64) * 1e3
        if arr.size == 0:
            return cls(0)
        qs = np.percentile(arr, list(QUANTILES.values()))
        p50, p90, p95, p99 = (float(q) for q in qs)
        return cls(int(arr.size), float(arr.mean()), p50, p90, p95, p99, float(arr.max()))

    def at(self, percentile: str) -> float | None:
        value: float | None = getattr(self, percentile)
        return value


@dataclass(slots=True)
class Saturation:
    saturated: bool
    reasons: list[str]
    offered_rate: float | None  # requests/s asked for (open loop)
    dispatched_rate: float  # requests/s actually sent
    achieved_rate: float  # requests/s completed
    dispatch_lag_p99_ms: float | None  # how late the generator sent requests (its own health)
    queue_growth_per_s: float  # slope of in-flight requests over the run's second half
    max_in_flight: int


@dataclass(slots=True)
class LoadResult:
    """Everything a run measured; `to_dict()` is the JSON form (milliseconds, requests/s, tokens/s)."""

    mode: str  # "open" (rate) or "closed" (concurrency)
    rate: float | None
    concurrency: int | None
    duration_s: float
    sent: int
    completed: int
    failed: int
    errors: dict[str, int]
    ttft: Summary
    itl: Summary
    tpot: Summary
    e2e: Summary
    request_throughput: float
    output_throughput: float
    input_throughput: float
    goodput: float | None
    slo_attainment: dict[str, float]
    slo_met: dict[str, bool]
    saturation: Saturation
    prompt_tokens_requested: float | None  # mean
    prompt_tokens_server: float | None  # mean of the server's usage counts
    prompt_length_exact: bool
    final: bool = True
    stopped_early: bool = False
    records: list[RequestRecord] = field(default_factory=list, repr=False)

    @property
    def meets_slo(self) -> bool:
        return bool(self.slo_met) and all(self.slo_met.values())

    def to_dict(self, *, with_records: bool = False) -> dict[str, Any]:
        out = asdict(self)
        out.pop("records")
        if with_records:
            out["records"] = [_record_dict(r) for r in self.records]
        return out


def _record_dict(r: RequestRecord) -> dict[str, Any]:
    return {
        "index": r.index,
        "prompt_len": r.prompt_len,
        "max_tokens": r.max_tokens,
        "ttft_ms": None if r.ttft is None else r.ttft * 1e3,
        "e2e_ms": r.e2e * 1e3,
        "itl_ms": [g * 1e3 for g in r.itl],
        "prompt_tokens": r.prompt_tokens,
        "output_tokens": r.output_count,
        "error": r.error,
    }


def error_kind(error: str) -> str:
    """Group errors by their reason, without per-request detail (ports, bodies) after a colon."""
    head = error.split(":", 1)[0]
    return head if head.startswith("HTTP ") or len(head) < 60 else head[:60]


def _good(r: RequestRecord, slo: SLO) -> bool:
    return request_meets(slo, ttft_s=r.ttft, mean_gap_s=r.tpot, e2e_s=r.e2e)


def queue_slope(samples: list[tuple[float, int]]) -> float:
    """Least-squares slope (requests/s) of in-flight count over the second half of the samples."""
    half = samples[len(samples) // 2 :]
    if len(half) < 3:
        return 0.0
    t = np.array([s[0] for s in half])
    y = np.array([s[1] for s in half], dtype=np.float64)
    if float(t.max() - t.min()) <= 0:
        return 0.0
    return float(np.polyfit(t, y, 1)[0])


def summarize(
    records: list[RequestRecord],
    *,
    slo: SLO | None,
    mode: str,
    rate: float | None,
    concurrency: int | None,
    started: float,
    finished: float,
    dispatch_end: float,
    in_flight: list[tuple[float, int]],
    prompt_length_exact: bool,
    final: bool = True,
    stopped_early: bool = False,
) -> LoadResult:
    """Summarise measured (post-warm-up) records of a run that began at `started`."""
    elapsed = max(finished - started, 1e-9)
    ok = [r for r in records if r.ok]
    failed = [r for r in records if not r.ok]
    ttft = [r.ttft for r in ok if r.ttft is not None]
    itl = [g for r in ok for g in r.itl]
    tpot = [t for r in ok if (t := r.tpot) is not None]
    e2e = [r.e2e for r in ok]
    out_tokens = sum(r.output_count for r in ok)
    in_tokens = sum(r.prompt_tokens if r.prompt_tokens is not None else r.prompt_len for r in ok)
    summaries = {
        "ttft": Summary.of(ttft),
        "itl": Summary.of(itl),
        "tpot": Summary.of(tpot),
        "e2e": Summary.of(e2e),
    }
    goodput, attainment, met = None, {}, {}
    if slo is not None:
        goodput = sum(_good(r, slo) for r in ok) / elapsed
        n = len(records)
        verdict = judge(slo, {m: summaries[m].at(o.percentile) for m, o in slo.bounds().items()})
        for metric, obj in slo.bounds().items():
            if metric == "ttft":
                within = sum(1 for r in ok if r.ttft is not None and r.ttft <= obj.max)
            elif metric == "e2e":
                within = sum(1 for r in ok if r.e2e <= obj.max)
            else:
                within = sum(1 for r in ok if (t := r.tpot) is None or t <= obj.max)
            # A failed request did not meet any objective.
            attainment[metric] = within / n if n else 0.0
            # A run with failed requests met nothing, whatever its percentiles.
            met[metric] = verdict.met_by_metric.get(metric, False) and not failed
    sat = _saturation(records, rate, started, dispatch_end, in_flight)
    served = [r.prompt_tokens for r in ok if r.prompt_tokens is not None]
    return LoadResult(
        mode=mode,
        rate=rate,
        concurrency=concurrency,
        duration_s=elapsed,
        sent=len(records),
        completed=len(ok),
        failed=len(failed),
        errors=dict(Counter(error_kind(r.error) for r in failed if r.error)),
        **summaries,
        request_throughput=len(ok) / elapsed,
        output_throughput=out_tokens / elapsed,
        input_throughput=in_tokens / elapsed,
        goodput=goodput,
        slo_attainment=attainment,
        slo_met=met,
        saturation=sat,
        prompt_tokens_requested=float(np.mean([r.prompt_len for r in records]))
        if records
        else None,
        prompt_tokens_server=float(np.mean(served)) if served else None,
        prompt_length_exact=prompt_length_exact,
        final=final,
        stopped_early=stopped_early,
        records=records,
    )


def _saturation(
    records: list[RequestRecord],
    rate: float | None,
    started: float,
    dispatch_end: float,
    in_flight: list[tuple[float, int]],
) -> Saturation:
    n = len(records)
    window = dispatch_end - started
    # What the arrival process actually produced: n requests span n - 1 gaps (the first goes at 0).
    # A short Poisson run offers noticeably more or less than `rate`, so this, not `rate`, is what
    # the completions are compared with.
    dispatched = (n - 1) / window if n > 1 and window > 0 else 0.0
    ok = [r for r in records if r.ok]
    achieved, counted = 0.0, 0
    if len(ok) > 1 and window > 0:
        # Completions trail arrivals by the latency: count those in the dispatch window shifted
        # by the median latency. A server that keeps up completes as many as were sent; one that
        # cannot leaves a backlog that ends after the window.
        shift = float(np.median([r.e2e for r in ok]))
        lo, hi = started + shift, dispatch_end + shift
        counted = sum(1 for r in ok if lo < r.end <= hi)
        achieved = counted / window
    lags = [r.start - r.scheduled for r in records if r.scheduled]
    lag_p99 = float(np.percentile(lags, 99) * 1e3) if lags else None
    slope = queue_slope(in_flight)
    half_span = (in_flight[-1][0] - in_flight[len(in_flight) // 2][0]) if in_flight else 0.0
    reasons: list[str] = []
    if rate is not None and len(ok) > 1:
        if counted + WINDOW_EDGE_REQUESTS < ACHIEVED_RATE_FLOOR * (n - 1):
            reasons.append(
                f"completed {achieved:.1f} req/s, below {ACHIEVED_RATE_FLOOR:.0%} of the "
                f"{dispatched:.1f} req/s sent (offered {rate:g} req/s)"
            )
        # Requests held back (by a concurrency cap or a CPU-starved generator) queue on our side:
        # fewer were sent than offered, and they left late. Either alone can be chance.
        if (
            dispatched < ACHIEVED_RATE_FLOOR * rate
            and lag_p99 is not None
            and lag_p99 > SEND_LAG_LIMIT_MS
        ):
            reasons.append(
                f"sent only {dispatched:.1f} of the offered {rate:g} req/s; requests waited up to "
                f"{lag_p99:.0f} ms (p99) to be sent"
            )
        # Poisson arrivals make the backlog wander; only a sustained climb of more than a few
        # requests counts as growing without bound.
        if slope > QUEUE_GROWTH_SHARE * rate and slope * half_span > QUEUE_GROWTH_MIN:
            reasons.append(f"in-flight requests grow by {slope:.1f}/s without bound")
    return Saturation(
        saturated=bool(reasons),
        reasons=reasons,
        offered_rate=rate,
        dispatched_rate=dispatched,
        achieved_rate=achieved,
        dispatch_lag_p99_ms=lag_p99,
        queue_growth_per_s=slope,
        max_in_flight=max((s[1] for s in in_flight), default=0),
    )
