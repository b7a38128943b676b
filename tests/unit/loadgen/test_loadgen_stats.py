"""Summaries from known records: percentiles, TPOT, goodput, SLO attainment, errors."""

from __future__ import annotations

import numpy as np
import pytest

from infertune.tuner.api import SLO
from infertune.tuner.loadgen.client import RequestRecord
from infertune.tuner.loadgen.stats import LoadResult, Summary, summarize


def _rec(i: int, ttft: float, gap: float, n: int, error: str | None = None) -> RequestRecord:
    r = RequestRecord(i, 10, n, scheduled=i * 0.1, start=i * 0.1)
    r.ttft = ttft
    r.itl = [gap] * (n - 1)
    r.end = r.start + ttft + gap * (n - 1)
    r.output_tokens = n
    r.chunks = n
    r.error = error
    return r


def _summarize(records: list[RequestRecord], slo: SLO | None) -> LoadResult:
    return summarize(
        records,
        slo=slo,
        mode="closed",
        rate=None,
        concurrency=1,
        started=0.0,
        finished=10.0,
        dispatch_end=10.0,
        in_flight=[],
        prompt_length_exact=True,
    )


def test_summary_matches_numpy_in_milliseconds() -> None:
    data = np.random.default_rng(0).lognormal(-3, 0.5, 1001)
    s = Summary.of(data)
    assert s.p50 == pytest.approx(np.percentile(data, 50) * 1e3)
    assert s.p99 == pytest.approx(np.percentile(data, 99) * 1e3)
    assert s.max == pytest.approx(data.max() * 1e3) and s.count == 1001
    assert Summary.of([]).p50 is None


def test_tpot_is_decode_time_over_tokens_after_the_first() -> None:
    r = _rec(0, 0.1, 0.02, 11)
    assert r.tpot == pytest.approx(0.02)
    assert _rec(0, 0.1, 0.02, 1).tpot is None


def test_goodput_and_attainment_count_requests_meeting_every_bound() -> None:
    records = [_rec(i, 0.05, 0.01, 5) for i in range(6)]  # all good
    records += [_rec(10, 0.50, 0.01, 5)]  # TTFT too slow
    records += [_rec(11, 0.05, 0.10, 5)]  # decode too slow (TPOT)
    records += [_rec(12, 0.05, 0.01, 5, error="HTTP 503: busy")]
    slo = SLO.model_validate(
        {"ttft": {"max": "200ms", "percentile": "p50"}, "itl": {"max": "50ms", "percentile": "p50"}}
    )
    res = _summarize(records, slo)
    assert res.goodput == pytest.approx(6 / 10.0)
    assert res.slo_attainment == {"ttft": pytest.approx(7 / 9), "itl": pytest.approx(7 / 9)}
    assert res.errors == {"HTTP 503": 1}
    assert res.completed == 8 and res.failed == 1
    # The percentile bounds hold, but a failed request means the SLO is not met.
    assert res.slo_met == {"ttft": False, "itl": False}
    assert res.request_throughput == pytest.approx(0.8)
    assert res.output_throughput == pytest.approx(8 * 5 / 10.0)


def test_slo_met_follows_the_stated_percentile() -> None:
    records = [_rec(i, 0.01 * (i + 1), 0.01, 3) for i in range(100)]  # TTFT 10..1000 ms
    p50 = SLO.model_validate({"ttft": {"max": "600ms", "percentile": "p50"}})
    p99 = SLO.model_validate({"ttft": {"max": "600ms", "percentile": "p99"}})
    assert _summarize(records, p50).slo_met == {"ttft": True}
    assert _summarize(records, p99).slo_met == {"ttft": False}
    assert _summarize(records, p50).slo_attainment["ttft"] == pytest.approx(0.6)


def test_json_form_has_no_records_unless_asked() -> None:
    res = _summarize([_rec(0, 0.1, 0.01, 3)], None)
    assert "records" not in res.to_dict()
    rows = res.to_dict(with_records=True)["records"]
    assert rows[0]["ttft_ms"] == pytest.approx(100.0) and rows[0]["output_tokens"] == 3


def _open_loop(e2e: list[float]) -> LoadResult:
    """Requests sent at 10 req/s (0.0 .. 0.9 s), each taking the given time."""
    records = [_rec(i, t, 0.0, 1) for i, t in enumerate(e2e)]
    return summarize(
        records,
        slo=None,
        mode="open",
        rate=10.0,
        concurrency=None,
        started=0.0,
        finished=max(r.end for r in records),
        dispatch_end=records[-1].start,
        in_flight=[],
        prompt_length_exact=True,
    )


def test_a_short_run_that_kept_up_is_not_saturated_by_its_edges() -> None:
    """A first request faster and a last one slower than the median fall outside the
    latency-shifted completion window: two of ten uncounted, and nothing queued. (The ramp's
    first 1 s step failed on CI this way and the whole search reported no passing rate.)"""
    result = _open_loop([0.02] + [0.05] * 8 + [0.2])
    assert not result.saturation.saturated, result.saturation.reasons


def test_a_growing_backlog_is_saturation() -> None:
    """Offered 10 req/s, served 5 req/s: each request waits for the one before it."""
    result = _open_loop([0.05 + i * 0.1 for i in range(10)])
    assert result.saturation.saturated
    assert "completed" in result.saturation.reasons[0]
