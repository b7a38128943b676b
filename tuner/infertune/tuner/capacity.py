"""SLO capacity: the highest Poisson arrival rate at which a configuration holds every SLO bound at
its percentile (DistServe's goodput), found by a short ramp from the spec's rate.

Why: scored at the spec's rate alone, every configuration that meets the SLOs scores about that
rate, and the study's winner is picked by measurement noise (issue 24: 7 of 10 demo trials within
1% of the offered rate). Capacity ranks them by headroom.

The spec's rate is the feasibility floor: the trial measures it first, with the spec's own traffic
(its figures are the trial's figures, its verdict the trial's constraints). Only a configuration
that meets it is ramped: the rate grows by `growth` until a probe misses, then the bracket
[highest met, lowest missed) is bisected, all within `max_probes` probes and the trial's deadline.
A probe reuses the running engine, offers about `probe_s` seconds of arrivals and stops as soon as
its SLO is certainly missed (trial.certain_violation), so a miss is cheap. Each probe is judged by
verdict.judge_figures through the trial's Measurement (Measurement.meets_slo): one SLO verdict.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

CAPACITY_KEY = "capacityRps"  # figure key: the highest rate met (0 when the floor was missed)
CAPACITY_UPPER_KEY = "capacityUpperRps"  # the lowest rate missed above it (absent: none missed)
PROBES_KEY = "capacityProbes"
GROWTH = 2.0
MAX_PROBES = 4
PROBE_S = 6.0  # seconds of arrivals per probe
MIN_PROBE_REQUESTS = 16
RESOLUTION = 0.15  # stop bisecting when (missed - met) / met is below this


@dataclass(frozen=True)
class Probe:
    rate: float
    requests: int
    met: bool
    wall_s: float
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "rate": round(self.rate, 4),
            "requests": self.requests,
            "met": self.met,
            "wall_s": round(self.wall_s, 3),
            "note": self.note,
        }


@dataclass
class Capacity:
    """`rps`: the highest rate met (0.0 when the spec's rate was missed); `upper`: the lowest rate
    missed above it (None: every probe met, the ramp ran out of probes or time)."""

    rps: float
    floor_met: bool
    upper: float | None = None
    probes: list[Probe] = field(default_factory=list)
    stopped: str | None = None  # why the ramp ended before settling (deadline, probe budget)

    def figures(self) -> dict[str, float]:
        out = {CAPACITY_KEY: self.rps, PROBES_KEY: float(len(self.probes))}
        if self.upper is not None:
            out[CAPACITY_UPPER_KEY] = self.upper
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "rps": self.rps,
            "floor_met": self.floor_met,
            "upper": self.upper,
            "probes": [p.to_dict() for p in self.probes],
            "stopped": self.stopped,
        }


def probe_requests(rate: float, probe_s: float = PROBE_S) -> int:
    """Requests of a probe at `rate`: about `probe_s` seconds of arrivals, at least enough for a
    p95 to rest on more than one request."""
    return max(MIN_PROBE_REQUESTS, math.ceil(rate * probe_s))


def search_capacity(
    probe: Callable[[float, int], tuple[bool, str]],
    floor_rate: float,
    floor_met: bool,
    *,
    growth: float = GROWTH,
    max_probes: int = MAX_PROBES,
    probe_s: float = PROBE_S,
    resolution: float = RESOLUTION,
    deadline: float | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> Capacity:
    """Ramp from `floor_rate` (already measured: `floor_met`). `probe(rate, requests)` measures one
    rate and returns (SLO met, a note); `deadline` (on `clock`) stops the ramp before a probe that
    would start after it."""
    if not floor_met:
        return Capacity(0.0, False)
    out = Capacity(floor_rate, True)
    lo, hi = floor_rate, None

    def step(rate: float) -> bool | None:
        if len(out.probes) >= max_probes:
            out.stopped = f"probe budget ({max_probes}) spent"
            return None
        if deadline is not None and clock() >= deadline:
            out.stopped = "trial deadline reached"
            return None
        n = probe_requests(rate, probe_s)
        t0 = clock()
        met, note = probe(rate, n)
        out.probes.append(Probe(rate, n, met, clock() - t0, note))
        return met

    while hi is None:  # bracket: grow until a probe misses
        met = step(lo * growth)
        if met is None:
            break
        if met:
            lo = lo * growth
        else:
            hi = lo * growth
    while hi is not None and (hi - lo) / lo > resolution:  # bisect the bracket
        mid = math.sqrt(lo * hi)  # geometric: the bracket spans a factor, not a width
        met = step(mid)
        if met is None:
            break
        if met:
            lo = mid
        else:
            hi = mid
    out.rps, out.upper = lo, hi
    return out
