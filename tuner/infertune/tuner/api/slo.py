"""Latency service-level objectives and the objective maximised under them."""

from __future__ import annotations

from pydantic import Field, model_validator

from infertune.tuner.api.base import PERCENTILES, ApiModel, Objective, Percentile
from infertune.tuner.api.durations import Duration

SLO_METRICS: tuple[str, ...] = ("ttft", "itl", "e2e")


class LatencyObjective(ApiModel):
    """`max` at `percentile`, e.g. TTFT p95 <= 300ms."""

    max: Duration = Field(description='Latency bound, a Kubernetes duration such as "300ms".')
    percentile: Percentile = Field(default="p95", description="Percentile the bound applies to.")

    @property
    def quantile(self) -> float:
        return PERCENTILES[self.percentile]


class SLO(ApiModel):
    ttft: LatencyObjective | None = Field(default=None, description="Time to first token.")
    itl: LatencyObjective | None = Field(default=None, description="Inter-token latency.")
    e2e: LatencyObjective | None = Field(default=None, description="End-to-end request latency.")
    objective: Objective = Field(
        default="goodput",
        description="What to maximise under the bounds: goodput (requests/s meeting every bound), "
        "throughput (output tokens/s), or cost-per-token (minimised).",
    )
    min_output_tokens_per_second: float | None = Field(
        default=None, gt=0, description="Optional floor on output-token throughput."
    )

    @model_validator(mode="after")
    def _at_least_one_bound(self) -> SLO:
        if not self.bounds():
            raise ValueError("set at least one latency objective: ttft, itl or e2e")
        return self

    def bounds(self) -> dict[str, LatencyObjective]:
        """The objectives that are set, keyed by metric name (ttft, itl, e2e)."""
        found = {"ttft": self.ttft, "itl": self.itl, "e2e": self.e2e}
        return {name: obj for name, obj in found.items() if obj is not None}
