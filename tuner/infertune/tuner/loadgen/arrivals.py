"""Arrival processes for open-loop load: when each request should be sent.

All three are renewal processes at mean rate `rate`: poisson (exponential gaps, coefficient of
variation 1), constant (no variation) and gamma with shape `burstiness` (CV = 1/sqrt(shape), so a
shape below 1 gives bursts and idle gaps; shape 1 is exactly Poisson). The same definitions as vLLM's
`bench serve`, so offered loads mean the same thing in both tools.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

ARRIVALS: tuple[str, ...] = ("poisson", "constant", "gamma")


def check_arrival(arrival: str, rate: float, burstiness: float = 1.0) -> None:
    if arrival not in ARRIVALS:
        raise ValueError(f"traffic.arrival {arrival!r} is not allowed; allowed values: {ARRIVALS}")
    if not rate > 0:
        raise ValueError(f"traffic.rate must be > 0 requests/s, got {rate}")
    if arrival == "gamma" and not burstiness > 0:
        raise ValueError(f"traffic.burstiness must be > 0 for arrival=gamma, got {burstiness}")


def interarrival_times(
    arrival: str,
    rate: float,
    n: int,
    *,
    burstiness: float = 1.0,
    rng: np.random.Generator,
) -> np.ndarray:
    """`n` gaps in seconds between consecutive arrivals, mean 1/rate."""
    check_arrival(arrival, rate, burstiness)
    if arrival == "constant":
        return np.full(n, 1.0 / rate)
    if arrival == "poisson":
        return rng.exponential(1.0 / rate, n)
    # Gamma with shape k and scale 1/(rate*k) has mean 1/rate whatever k is.
    return rng.gamma(burstiness, 1.0 / (rate * burstiness), n)


def arrival_offsets(
    arrival: str,
    rate: float,
    *,
    burstiness: float = 1.0,
    seed: int | None = None,
    batch: int = 4096,
) -> Iterator[float]:
    """Send times in seconds after the start, forever (the caller stops by count or duration).

    The first request goes at 0: a run measures the server, not an initial idle gap.
    """
    rng = np.random.default_rng(seed)
    t = 0.0
    yield t
    while True:
        for gap in interarrival_times(arrival, rate, batch, burstiness=burstiness, rng=rng):
            t += float(gap)
            yield t
