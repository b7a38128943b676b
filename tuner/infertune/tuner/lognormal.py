"""The load generator's lognormal: (mu, sigma) from the mean and p95 people describe traffic by.

The one rule for which (mean, p95) pairs exist, shared by the generator's sampler
(:mod:`infertune.tuner.loadgen.lengths`) and the API that accepts a spec (so a spec that validates
is one the generator can produce). A leaf module: the API imports it, and the generator imports
the API, so it imports neither.

mean = exp(mu + sigma^2/2) and p95 = exp(mu + z95*sigma), so ln(p95/mean) = z95*sigma - sigma^2/2,
which is largest at sigma = z95: no lognormal has p95/mean above exp(z95^2/2) (about 3.87).
"""

from __future__ import annotations

import math

Z95 = 1.6448536269514722  # standard normal 95th percentile
# The largest p95/mean ratio any lognormal can have: sigma = Z95 maximises z*sigma - sigma^2/2.
MAX_LOGNORMAL_P95_RATIO = math.exp(Z95 * Z95 / 2)


def _exists(mean: float, p95: float) -> bool:
    return 0 < mean <= p95 and Z95 * Z95 - 2 * math.log(p95 / mean) >= 0


def max_lognormal_p95(mean: float) -> int:
    """The largest integer p95 a lognormal with this mean can have."""
    p95 = math.floor(mean * MAX_LOGNORMAL_P95_RATIO)
    while p95 > mean and not _exists(mean, p95):
        p95 -= 1  # float rounding at the boundary: step down to one the rule accepts
    return p95


def lognormal_problem(mean: float, p95: float) -> str | None:
    """Why no lognormal has this mean and p95, or None when one does."""
    if mean <= 0 or p95 < mean:
        return f"lognormal needs 0 < mean <= p95, got mean={mean}, p95={p95}"
    if not _exists(mean, p95):
        largest = max_lognormal_p95(mean)
        return (
            f"no lognormal has p95/mean = {p95 / mean:.2f}; the most a lognormal allows is "
            f"{MAX_LOGNORMAL_P95_RATIO:.2f}, so with mean {mean:g} p95 may be at most {largest} "
            "(raise mean or lower p95)"
        )
    return None


def lognormal_params(mean: float, p95: float, field: str = "lengths") -> tuple[float, float]:
    """(mu, sigma) of the lognormal with this mean and 95th percentile; ValueError if none has."""
    problem = lognormal_problem(mean, p95)
    if problem is not None:
        raise ValueError(f"{field}: {problem}")
    disc = Z95 * Z95 - 2 * math.log(p95 / mean)
    # The smaller root: the larger one is a degenerate, extremely heavy-tailed solution.
    sigma = Z95 - math.sqrt(disc)
    mu = math.log(mean) - sigma * sigma / 2
    return mu, sigma
