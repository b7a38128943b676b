"""Probe timing for a serving pod, derived from what the tuner measured of the winner: how long
its engine took to start (`startupS`) and how late it answered /health while saturated by the
trial's load (`healthLatencyMs`).

Readiness takes a busy pod out of the Service for a moment; liveness restarts it, so it is kept
well apart: a timeout several times the worst /health seen under load, and enough failures in a
row to span two minutes, so that a pod saturated by a burst is never killed mid-burst.
"""

from __future__ import annotations

import math
from typing import Any

PERIOD_S = 5
LIVENESS_PERIOD_S = 20
# With nothing measured: /health may take seconds under load (the kubelet's default of 1 s is
# what restarted busy engines mid-burst).
DEFAULT_HEALTH_S = 2.0
DEFAULT_STARTUP_S = 200.0
LIVENESS_TOLERANCE_S = 120  # failing /health must last this long before a restart


def _clamp(value: float, low: int, high: int) -> int:
    return max(low, min(high, math.ceil(value)))


def probe_timing(startup_s: float | None, health_ms: float | None) -> dict[str, dict[str, int]]:
    """startupProbe / readinessProbe / livenessProbe timing fields (no handler)."""
    health_s = DEFAULT_HEALTH_S if health_ms is None else max(health_ms / 1000.0, 0.05)
    start_s = DEFAULT_STARTUP_S if startup_s is None else startup_s
    readiness_timeout = _clamp(2 * health_s, 2, 15)
    liveness_timeout = _clamp(5 * health_s, 10, 60)
    # A pod on a cold node downloads weights and compiles kernels the trial had cached: three
    # times the measured start plus two minutes, never under 5 nor over 60 minutes.
    startup_budget = _clamp(3 * start_s + 120, 300, 3600)
    return {
        "startupProbe": {
            "periodSeconds": PERIOD_S,
            "timeoutSeconds": readiness_timeout,
            "failureThreshold": math.ceil(startup_budget / PERIOD_S),
        },
        "readinessProbe": {
            "periodSeconds": PERIOD_S,
            "timeoutSeconds": readiness_timeout,
            "failureThreshold": 3,
            "successThreshold": 1,
        },
        "livenessProbe": {
            "periodSeconds": LIVENESS_PERIOD_S,
            "timeoutSeconds": liveness_timeout,
            "failureThreshold": math.ceil(LIVENESS_TOLERANCE_S / LIVENESS_PERIOD_S),
        },
    }


def serving_probes(
    http: dict[str, Any], startup_s: float | None, health_ms: float | None
) -> dict[str, dict[str, Any]]:
    """The three probes on `http` (an httpGet), timed by :func:`probe_timing`."""
    return {name: {"httpGet": http, **t} for name, t in probe_timing(startup_s, health_ms).items()}
