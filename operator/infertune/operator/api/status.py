"""InferenceService status: standard conditions plus what was measured, tuned and observed."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from infertune.tuner.api import ApiModel

ConditionType = Literal["Profiled", "Tuned", "RolledOut", "SLOMet", "Ready"]
CONDITION_TYPES: tuple[str, ...] = ("Profiled", "Tuned", "RolledOut", "SLOMet", "Ready")


class Condition(ApiModel):
    type: str
    status: Literal["True", "False", "Unknown"]
    reason: str = Field(pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$", max_length=1024)
    message: str = Field(default="", max_length=32768)
    last_transition_time: str
    observed_generation: int | None = None


class PhaseProfile(ApiModel):
    bound: Literal["compute", "memory", "launch", "unknown"]
    measured_ms: float | None = None
    roofline_floor_ms: float | None = None
    percent_of_roofline: float | None = None


class Profile(ApiModel):
    hardware: str = Field(description="GPU product or CPU model the profile was measured on.")
    memory_bandwidth_gbps: float | None = None
    peak_tflops: float | None = None
    prefill: PhaseProfile | None = None
    decode: PhaseProfile | None = None


class TuningRun(ApiModel):
    job: str | None = None
    study: str | None = None
    spec_hash: str | None = None
    reason: str | None = Field(
        default=None, description="Why this run started (Created, SLOViolation…)."
    )
    trials_completed: int = 0
    trials_total: int = 0
    started_at: str | None = None
    finished_at: str | None = None
    gpu_product: str | None = None


class Figures(ApiModel):
    """Measured latency percentiles (milliseconds) and throughput."""

    ttft_p50_ms: float | None = None
    ttft_p95_ms: float | None = None
    ttft_p99_ms: float | None = None
    itl_p50_ms: float | None = None
    itl_p95_ms: float | None = None
    itl_p99_ms: float | None = None
    e2e_p50_ms: float | None = None
    e2e_p95_ms: float | None = None
    e2e_p99_ms: float | None = None
    goodput_rps: float | None = None
    request_rate: float | None = None
    output_tokens_per_second: float | None = None
    prompt_tokens_mean: float | None = None
    output_tokens_mean: float | None = None


class ServingConfig(ApiModel):
    engine: str
    quantization: str
    max_num_seqs: int
    max_num_batched_tokens: int
    kv_block_size: int
    cuda_graph: bool
    config_hash: str | None = None
    measured: Figures | None = None
    slo_margins_ms: dict[str, float] = Field(
        default_factory=dict,
        description="Bound minus measured, per SLO metric (negative = missed).",
    )


class Observation(ApiModel):
    time: str
    source: Literal["prometheus", "scrape"]
    figures: Figures
    slo_met: bool
    violating: list[str] = Field(default_factory=list)


class HistoryEntry(ApiModel):
    time: str
    event: str
    reason: str
    message: str = ""
    config_hash: str | None = None


class CanaryRun(ApiModel):
    """A new config serving beside the live one on a share of replicas, until it proves itself."""

    config: ServingConfig
    started_at: str
    replicas: int = 1
    proving_since: str | None = Field(
        default=None,
        description="First check with traffic on the canary: the window runs from here.",
    )
    checks_met: int = Field(
        default=0, description="Check windows with traffic in which it met the SLOs."
    )
    violating: list[str] = Field(default_factory=list, description="What it missed, if it did.")


class InferenceServiceStatus(ApiModel):
    observed_generation: int | None = None
    phase: str | None = Field(
        default=None, description="One-word summary for `kubectl get`, derived from conditions."
    )
    conditions: list[Condition] = Field(default_factory=list)
    profile: Profile | None = None
    tuning: TuningRun | None = None
    best: ServingConfig | None = None
    live: ServingConfig | None = Field(default=None, description="The configuration serving now.")
    observed: Observation | None = None
    canary: CanaryRun | None = None
    last_retune_time: str | None = None
    history: list[HistoryEntry] = Field(default_factory=list, max_length=20)
