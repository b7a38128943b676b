"""Arrival processes are statistically right: KS tests on inter-arrival times."""

from __future__ import annotations

import numpy as np
import pytest
from loadgen_helpers import ServerFactory, boosted_priority
from scipy import stats

from infertune.tuner.api import TrafficProfile
from infertune.tuner.loadgen import run_load_sync
from infertune.tuner.loadgen.arrivals import arrival_offsets, interarrival_times

ALPHA = 1e-3  # fixed seeds make the sampler tests deterministic; this only guards the live one


def test_poisson_gaps_are_exponential_with_the_rate() -> None:
    gaps = interarrival_times("poisson", 40.0, 20_000, rng=np.random.default_rng(1))
    assert stats.kstest(gaps, "expon", args=(0, 1 / 40.0)).pvalue > ALPHA
    assert gaps.mean() == pytest.approx(1 / 40.0, rel=0.03)


@pytest.mark.parametrize("shape", [0.25, 1.0, 4.0])
def test_gamma_gaps_have_the_shape_and_the_mean_rate(shape: float) -> None:
    rate = 25.0
    gaps = interarrival_times("gamma", rate, 20_000, burstiness=shape, rng=np.random.default_rng(2))
    assert stats.kstest(gaps, "gamma", args=(shape, 0, 1 / (rate * shape))).pvalue > ALPHA
    assert gaps.mean() == pytest.approx(1 / rate, rel=0.05)
    # Coefficient of variation 1/sqrt(shape): burstier below 1, smoother above.
    assert gaps.std() / gaps.mean() == pytest.approx(1 / np.sqrt(shape), rel=0.05)


def test_a_wrong_distribution_is_rejected_by_the_same_test() -> None:
    # The KS test above has power: gamma(4) gaps at the same mean are not exponential.
    gaps = interarrival_times("gamma", 40.0, 5_000, burstiness=4.0, rng=np.random.default_rng(3))
    assert stats.kstest(gaps, "expon", args=(0, 1 / 40.0)).pvalue < ALPHA


def test_constant_gaps_are_exact() -> None:
    offsets = arrival_offsets("constant", 8.0, seed=0)
    first = [next(offsets) for _ in range(5)]
    assert first == pytest.approx([0.0, 0.125, 0.25, 0.375, 0.5])


def test_bad_arrival_names_the_allowed_values() -> None:
    with pytest.raises(ValueError, match="allowed values"):
        interarrival_times("bursty", 1.0, 3, rng=np.random.default_rng())


def test_requests_leave_on_the_poisson_schedule(scripted_server: ServerFactory) -> None:
    """The live send times (not just the sampler) follow the arrival process."""
    url = scripted_server()
    rate = 100.0
    traffic = TrafficProfile.model_validate(
        {
            "rate": rate,
            "arrival": "poisson",
            "numRequests": 400,
            "warmupRequests": 0,
            "promptTokens": {"mean": 4},
            "outputTokens": {"mean": 2},
        }
    )
    with boosted_priority():
        result = run_load_sync(url, traffic, model="scripted")
    assert result.completed == 400
    scheduled = np.array(sorted(r.scheduled for r in result.records))
    sent = np.array(sorted(r.start for r in result.records))
    # A live run on a loaded 2-core machine: a looser level than the seeded sampler tests. A wrong
    # process (constant, or the wrong rate) still scores p < 1e-20 at n = 400.
    live_alpha = ALPHA / 10
    assert stats.kstest(np.diff(scheduled), "expon", args=(0, 1 / rate)).pvalue > live_alpha
    assert stats.kstest(np.diff(sent), "expon", args=(0, 1 / rate)).pvalue > live_alpha
    assert result.saturation.dispatched_rate == pytest.approx(rate, rel=0.2)
    assert not result.saturation.saturated
