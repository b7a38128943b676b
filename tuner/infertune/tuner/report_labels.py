"""How the report names figures and knobs for a reader: "TTFT p95 (ms)" for `ttftP95Ms`, and a
knob by its own description (knobs.py)."""

from __future__ import annotations

import re

from infertune.tuner.knobs import SERVING_KNOBS

_METRICS = {"ttft": "TTFT", "itl": "ITL", "e2e": "End-to-end latency", "tpot": "TPOT"}
_FIGURES = {
    "goodputRps": "Goodput (req/s)",
    "requestRate": "Request rate achieved (req/s)",
    "outputTokensPerSecond": "Output throughput (tokens/s)",
    "capacityRps": "SLO capacity (req/s)",
    "capacityUpperRps": "Lowest rate missed (req/s)",
    "capacityProbes": "Capacity probes",
}


def figure_label(key: str) -> str:
    """`ttftP95Ms` -> "TTFT p95 (ms)", `goodputRps` -> "Goodput (req/s)"; unknown keys are split
    at their capitals, with the unit their suffix names."""
    m = re.fullmatch(r"([a-z0-9]+)P(\d+)Ms", key)
    if m and m[1] in _METRICS:
        return f"{_METRICS[m[1]]} p{m[2]} (ms)"
    if key in _FIGURES:
        return _FIGURES[key]
    unit = next((u for s, u in (("Ms", "ms"), ("Rps", "req/s"), ("Bytes", "bytes")) if key.endswith(s)), None)  # fmt: skip
    base = key[: -len({"ms": "Ms", "req/s": "Rps", "bytes": "Bytes"}[unit])] if unit else key
    words = re.sub(r"(?<!^)(?=[A-Z])", " ", base).lower().capitalize()
    return f"{words} ({unit})" if unit else words


def knob_label(name: str) -> str:
    """The knob's own description (knobs.py), up to its first parenthesis or full stop."""
    try:
        text = SERVING_KNOBS[name].description
    except (KeyError, ValueError):
        return name.replace("_", " ")
    return re.split(r" \(|\. |;|\.$", text, maxsplit=1)[0]
