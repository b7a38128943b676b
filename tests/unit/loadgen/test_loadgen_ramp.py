"""Goodput search against a server of known capacity: 2 streams at a time, 18 ms each."""

from __future__ import annotations

import asyncio

import pytest
from loadgen_helpers import ServerFactory, boosted_priority

from infertune.tuner.api import SLO, TrafficProfile
from infertune.tuner.loadgen import RampSpec, find_max_rate

# ttft 10 ms + 4 gaps of 2 ms = 18 ms per request, 2 at once: at most ~111 requests/s.
CAPACITY = 2 / 0.018


def test_ramp_stops_near_the_servers_capacity(scripted_server: ServerFactory) -> None:
    url = scripted_server([10.0], [2.0], slots=2)
    traffic = TrafficProfile.model_validate(
        {
            "rate": 1.0,
            "arrival": "constant",
            "duration": "1s",
            "warmupRequests": 0,
            "promptTokens": {"mean": 8},
            "outputTokens": {"mean": 5},
        }
    )
    slo = SLO.model_validate({"ttft": {"max": "40ms", "percentile": "p90"}})
    ramp = RampSpec(start=20.0, max_rate=400.0, factor=2.0, refine=2)
    with boosted_priority():
        result = asyncio.run(find_max_rate(url, traffic, slo, ramp, model="scripted"))
    rates = [rate for rate, _, _ in result.steps]
    assert rates[:4] == [20.0, 40.0, 80.0, 160.0]
    assert [ok for _, ok, _ in result.steps][:4] == [True, True, True, False]
    assert result.best_rate is not None and result.best is not None
    # Bisection between 80 (passed) and 160 (failed) ends below the capacity.
    assert 80.0 <= result.best_rate < CAPACITY
    over = [res for rate, ok, res in result.steps if rate > CAPACITY]
    assert all(not res.meets_slo or res.saturation.saturated for res in over)
    assert result.to_dict()["best_rate"] == result.best_rate


def test_ramp_spec_parses_and_validates() -> None:
    assert RampSpec.parse("2:64") == RampSpec(2.0, 64.0, 2.0, 3)
    assert RampSpec.parse("1:10:1.5:0") == RampSpec(1.0, 10.0, 1.5, 0)
    with pytest.raises(ValueError, match="factor must be > 1"):
        RampSpec.parse("1:10:1")
    with pytest.raises(ValueError, match="start <= max"):
        RampSpec.parse("10:1")
