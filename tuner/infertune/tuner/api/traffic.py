"""The load a configuration is tuned for: arrivals and token-length distributions."""

from __future__ import annotations

from pydantic import Field, model_validator

from infertune.tuner.api.base import ApiModel, Arrival, LengthKind
from infertune.tuner.api.durations import Duration
from infertune.tuner.lognormal import lognormal_problem

MAX_TOKENS = 1_048_576


class LengthDistribution(ApiModel):
    """Token lengths: fixed (`mean`), uniform (`min`..`max`) or lognormal (`mean` and `p95`)."""

    distribution: LengthKind = "fixed"
    mean: int | None = Field(default=None, ge=1, le=MAX_TOKENS)
    min: int | None = Field(default=None, ge=1, le=MAX_TOKENS)
    max: int | None = Field(default=None, ge=1, le=MAX_TOKENS)
    p95: int | None = Field(default=None, ge=1, le=MAX_TOKENS)

    @model_validator(mode="after")
    def _fields_match_distribution(self) -> LengthDistribution:
        kind = self.distribution
        if kind == "fixed" and self.mean is None:
            raise ValueError("distribution 'fixed' needs mean (the token count)")
        if kind == "uniform":
            if self.min is None or self.max is None:
                raise ValueError("distribution 'uniform' needs min and max")
            if self.min > self.max:
                raise ValueError(f"min ({self.min}) must not exceed max ({self.max})")
        if kind == "lognormal":
            if self.mean is None or self.p95 is None:
                raise ValueError("distribution 'lognormal' needs mean and p95")
            if self.p95 < self.mean:
                raise ValueError(f"p95 ({self.p95}) must be at least mean ({self.mean})")
            # The load generator's own rule: accept exactly the shapes it can sample.
            problem = lognormal_problem(self.mean, self.p95)
            if problem is not None:
                raise ValueError(problem)
        return self

    @property
    def expected(self) -> float:
        """Mean token count, used for sizing and drift detection."""
        if self.distribution == "uniform":
            assert self.min is not None and self.max is not None
            return (self.min + self.max) / 2
        assert self.mean is not None
        return float(self.mean)


def _fixed(n: int) -> LengthDistribution:
    return LengthDistribution(distribution="fixed", mean=n)


class TrafficProfile(ApiModel):
    """Open loop (`rate` requests/s) or closed loop (`concurrency` in-flight requests)."""

    arrival: Arrival = Field(default="poisson", description="Inter-arrival process for `rate`.")
    rate: float | None = Field(
        default=None,
        gt=0,
        le=1_000_000,
        description="Requests per second. In an InferenceService, the service's total: each trial "
        "loads one replica with rate / rollout.replicas. For `infertune tune` alone, the one "
        "engine's.",
    )
    concurrency: int | None = Field(
        default=None, ge=1, le=100_000, description="In-flight requests per replica."
    )
    burstiness: float = Field(
        default=1.0, gt=0, le=1000, description="Gamma shape for arrival=gamma (<1 is burstier)."
    )
    prompt_tokens: LengthDistribution = Field(default_factory=lambda: _fixed(128))
    output_tokens: LengthDistribution = Field(default_factory=lambda: _fixed(64))
    replay_file: str | None = Field(
        default=None, description="JSONL of {prompt_tokens, output_tokens} to replay instead."
    )
    duration: Duration | None = Field(default=None, description="Measured time per trial.")
    num_requests: int | None = Field(default=None, ge=1, le=10_000_000)
    warmup_requests: int = Field(default=4, ge=0, le=100_000)

    @model_validator(mode="after")
    def _load_is_defined(self) -> TrafficProfile:
        if self.rate is None and self.concurrency is None:
            raise ValueError(
                "set rate (requests/s, open loop) or concurrency (in-flight requests, closed loop)"
            )
        return self


def default_traffic() -> TrafficProfile:
    return TrafficProfile(concurrency=8, num_requests=64)
