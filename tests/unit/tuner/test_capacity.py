"""The SLO-capacity ramp (capacity.py): bracketing from the spec's rate, early stop, the floor.

Each probe is judged by the one SLO verdict (verdict.judge_figures) on figures from a queueing
model of one server: TTFT p95 grows as the offered rate nears the service rate, so a
configuration's capacity under the TTFT bound is known in closed form and the ramp's answer can be
checked against it.
"""

from __future__ import annotations

import math

import pytest

from infertune.tuner.api import SLO
from infertune.tuner.capacity import (
    CAPACITY_KEY,
    CAPACITY_UPPER_KEY,
    MIN_PROBE_REQUESTS,
    probe_requests,
    search_capacity,
)
from infertune.tuner.verdict import judge_figures

SLO_ = SLO.model_validate({"ttft": {"max": "2s", "percentile": "p95"}})
SERVICE_S = 0.1  # seconds per request


def ttft_p95_ms(rate: float) -> float:
    """M/M/1 response time p95: -ln(0.05) / (mu - lambda); infinite at or past saturation."""
    mu = 1 / SERVICE_S
    return math.inf if rate >= mu else 1000 * -math.log(0.05) / (mu - rate)


TRUE_CAPACITY = 1 / SERVICE_S - 1000 * -math.log(0.05) / 2000  # where p95 TTFT == 2 s: 8.50 rps


class Prober:
    def __init__(self) -> None:
        self.rates: list[float] = []
        self.requests: list[int] = []

    def __call__(self, rate: float, n: int) -> tuple[bool, str]:
        self.rates.append(rate)
        self.requests.append(n)
        verdict = judge_figures(SLO_, {"ttftP95Ms": ttft_p95_ms(rate)})
        return verdict.fully_met, "; ".join(verdict.violating)


def test_brackets_then_bisects_to_the_true_capacity() -> None:
    probe = Prober()
    cap = search_capacity(probe, 2.0, True, max_probes=8, resolution=0.05)
    # Doubling from the floor: 4 and 8 hold, 16 misses; then bisection inside (8, 16).
    assert probe.rates[:3] == [4.0, 8.0, 16.0]
    assert all(8.0 < r < 16.0 for r in probe.rates[3:])
    assert cap.rps <= TRUE_CAPACITY < cap.upper  # type: ignore[operator]
    assert (cap.upper - cap.rps) / cap.rps <= 0.05  # type: ignore[operator]
    figures = cap.figures()
    assert figures[CAPACITY_KEY] == cap.rps and figures[CAPACITY_UPPER_KEY] == cap.upper


def test_the_floor_is_the_spec_rate() -> None:
    probe = Prober()
    missed = search_capacity(probe, 9.0, False)
    assert missed.rps == 0.0 and not missed.floor_met and probe.rates == []
    held = search_capacity(Prober(), 8.0, True, max_probes=4)
    # The floor held and every probe above it missed: capacity is the floor, never below it.
    assert held.rps == 8.0 and held.upper is not None and held.upper <= 16.0


def test_probe_budget_bounds_the_ramp() -> None:
    probe = Prober()
    cap = search_capacity(probe, 0.5, True, max_probes=3)
    assert len(probe.rates) == 3 == len(cap.probes)
    assert probe.rates == [1.0, 2.0, 4.0]  # still bracketing when the budget ended
    assert cap.rps == 4.0 and cap.upper is None and "probe budget" in (cap.stopped or "")


def test_deadline_stops_before_a_probe_starts() -> None:
    ticks = iter(range(100))
    probe = Prober()
    # A clock that advances one unit per call: the deadline at 3 allows the first probe only.
    cap = search_capacity(probe, 2.0, True, deadline=3.0, clock=lambda: float(next(ticks)))
    assert len(probe.rates) == 1 and cap.rps == 4.0 and cap.stopped == "trial deadline reached"


def test_a_miss_ends_the_growth_early() -> None:
    probe = Prober()
    search_capacity(probe, 6.0, True, max_probes=6, resolution=0.5)
    # 12 misses at once: no probe beyond the first miss, only bisection below it.
    assert probe.rates[0] == 12.0 and max(probe.rates) == 12.0


@pytest.mark.parametrize("rate", [0.5, 3.0, 40.0])
def test_probes_offer_a_few_seconds_of_arrivals(rate: float) -> None:
    n = probe_requests(rate, 6.0)
    assert n >= MIN_PROBE_REQUESTS and n >= rate * 6.0
