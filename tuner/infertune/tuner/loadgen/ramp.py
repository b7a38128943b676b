"""Goodput search: the highest request rate at which the server still meets the SLOs.

Rates grow geometrically from `start` until a step fails (an SLO missed, requests failed, or the
server saturated), then the gap between the last passing and the first failing rate is bisected
`refine` times. Each step is an ordinary open-loop run of the same traffic profile at one rate, so
each step's LoadResult is kept and reported.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from infertune.tuner.api import SLO, TrafficProfile
from infertune.tuner.loadgen.runner import Options, run_load
from infertune.tuner.loadgen.stats import LoadResult


@dataclass(frozen=True, slots=True)
class RampSpec:
    """How to sweep: geometric steps from `start` by `factor` up to `max_rate`, then bisection."""

    start: float = 1.0
    max_rate: float = 1024.0
    factor: float = 2.0
    refine: int = 3

    def __post_init__(self) -> None:
        if not 0 < self.start <= self.max_rate:
            raise ValueError(
                f"ramp: need 0 < start <= max, got start={self.start}, max={self.max_rate}"
            )
        if self.factor <= 1:
            raise ValueError(f"ramp: factor must be > 1, got {self.factor}")
        if self.refine < 0:
            raise ValueError(f"ramp: refine must be >= 0, got {self.refine}")

    @classmethod
    def parse(cls, text: str) -> RampSpec:
        """`START:MAX[:FACTOR[:REFINE]]`, e.g. `1:256` or `2:512:2:4` (requests/s)."""
        parts = text.split(":")
        if not 2 <= len(parts) <= 4:
            raise ValueError(f"--ramp {text!r}: write START:MAX[:FACTOR[:REFINE]], e.g. 1:256")
        try:
            start, top = float(parts[0]), float(parts[1])
            factor = float(parts[2]) if len(parts) > 2 else 2.0
            refine = int(parts[3]) if len(parts) > 3 else 3
        except ValueError as exc:
            raise ValueError(f"--ramp {text!r}: {exc}") from exc
        return cls(start, top, factor, refine)


@dataclass(slots=True)
class RampResult:
    best_rate: float | None  # highest rate that passed; None when even `start` failed
    best: LoadResult | None
    steps: list[tuple[float, bool, LoadResult]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "best_rate": self.best_rate,
            "best": self.best.to_dict() if self.best is not None else None,
            "steps": [
                {"rate": rate, "passed": ok, "result": res.to_dict()}
                for rate, ok, res in self.steps
            ],
        }


def step_passes(result: LoadResult, slo: SLO | None) -> bool:
    """A rate is sustained when nothing failed, the server kept up, and every SLO held."""
    if result.failed or result.completed == 0 or result.saturation.saturated:
        return False
    return slo is None or result.meets_slo


async def find_max_rate(
    url: str,
    traffic: TrafficProfile,
    slo: SLO | None,
    ramp: RampSpec,
    *,
    model: str | None = None,
    tokenizer_dir: Path | None = None,
    options: Options | None = None,
    on_step: Callable[[float, bool, LoadResult], None] | None = None,
) -> RampResult:
    """Sweep open-loop rates (the profile's arrival process and lengths) and return the best."""
    out = RampResult(None, None)

    async def trial(rate: float) -> bool:
        step = traffic.model_copy(update={"rate": rate})
        res = await run_load(
            url, step, slo, model=model, tokenizer_dir=tokenizer_dir, options=options
        )
        ok = step_passes(res, slo)
        out.steps.append((rate, ok, res))
        if on_step is not None:
            on_step(rate, ok, res)
        if ok and (out.best_rate is None or rate > out.best_rate):
            out.best_rate, out.best = rate, res
        return ok

    rate, failed_at = ramp.start, None
    while True:
        if not await trial(rate):
            failed_at = rate
            break
        if rate >= ramp.max_rate:
            break
        rate = min(rate * ramp.factor, ramp.max_rate)
    if failed_at is None or out.best_rate is None:
        return out
    low, high = out.best_rate, failed_at
    for _ in range(ramp.refine):
        mid = (low + high) / 2
        if await trial(mid):
            low = mid
        else:
            high = mid
    return out
