"""Is this SLO met? One answer for the trial, the search, the live check, the canary and the retune.

Two questions, each with one definition here:

* **The verdict**: each bound of the SLO against the figure measured *at that bound's own
  percentile* (TTFT and end-to-end per request; ITL per gap between consecutive tokens, as vLLM's
  ``inter_token_latency`` histogram and the load generator's ITL both count it). :func:`judge`.
* **Goodput**: requests per second that met *every* bound, as DistServe and vLLM's benchmark define
  it: TTFT and end-to-end per request, and ITL by the request's mean gap (its time per output
  token), since one request has many gaps. :func:`request_meets` says it for one request measured
  whole (the tuner's load generator); :func:`goodput_from_shares` estimates it from per-metric
  histograms (the live monitor), where only each bound's share is known.

Torch-free; imports nothing above the API models, so the operator and the tuner share it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from infertune.tuner.api.base import PERCENTILES
from infertune.tuner.api.slo import SLO, SLO_METRICS


def figure_key(metric: str, percentile: str) -> str:
    """The figure's key on the wire: ``figure_key("ttft", "p95") == "ttftP95Ms"``."""
    return f"{metric}{percentile.upper()}Ms"


# Every latency figure a trial reports: each SLO metric at each percentile the API accepts.
LATENCY_FIGURE_KEYS: tuple[str, ...] = tuple(
    figure_key(m, p) for m in SLO_METRICS for p in PERCENTILES
)


@dataclass(frozen=True)
class Verdict:
    """The SLO against measured values (ms), bound by bound.

    ``met``: None when no bound was measured (no traffic), else whether every measured bound holds.
    ``complete``: every bound was measured. A trial needs both; a live window with some traffic
    judges what it saw.
    """

    met: bool | None
    complete: bool
    margins_ms: dict[str, float] = field(default_factory=dict)  # bound - measured; -inf: unmeasured
    met_by_metric: dict[str, bool] = field(default_factory=dict)
    violating: list[str] = field(default_factory=list)

    @property
    def fully_met(self) -> bool:
        return self.met is True and self.complete


def judge(slo: SLO, at_percentile: Mapping[str, float | None]) -> Verdict:
    """Judge each bound of `slo` against `at_percentile[metric]`, the value in milliseconds at
    that bound's own percentile (None or absent: not measured)."""
    margins: dict[str, float] = {}
    met_by: dict[str, bool] = {}
    violating: list[str] = []
    for metric, objective in slo.bounds().items():
        value = at_percentile.get(metric)
        if value is None:
            margins[metric] = -math.inf
            continue
        margins[metric] = objective.max.ms - value
        met_by[metric] = value <= objective.max.ms
        if not met_by[metric]:
            violating.append(
                f"{metric} {objective.percentile} {value:.1f}ms > {objective.max.ms:g}ms"
            )
    met = None if not met_by else all(met_by.values())
    return Verdict(met, len(met_by) == len(margins), margins, met_by, violating)


def judge_figures(slo: SLO, figures: Mapping[str, float]) -> Verdict:
    """:func:`judge` on a trial's figures (keys from :func:`figure_key`)."""
    return judge(
        slo, {m: figures.get(figure_key(m, o.percentile)) for m, o in slo.bounds().items()}
    )


def request_meets(
    slo: SLO, *, ttft_s: float | None, mean_gap_s: float | None, e2e_s: float
) -> bool:
    """Whether one completed request met every bound (the goodput rule). A request with no first
    token failed TTFT; one with a single output token has no gap and cannot fail ITL."""
    if ttft_s is None:
        return False
    if slo.ttft is not None and ttft_s > slo.ttft.max:
        return False
    if slo.e2e is not None and e2e_s > slo.e2e.max:
        return False
    return slo.itl is None or mean_gap_s is None or mean_gap_s <= slo.itl.max


def goodput_from_shares(rate: float, shares: Iterable[float | None]) -> float:
    """Goodput from each bound's share of requests within it (histograms know no joint share):
    the smallest share bounds the joint one from above, so this is an upper estimate that equals
    the exact goodput when one bound binds (the usual case near capacity). No known share: every
    request counts."""
    known = [s for s in shares if s is not None]
    return rate * min(known) if known else rate
