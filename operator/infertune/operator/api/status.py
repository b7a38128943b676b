"""InferenceService status: standard conditions plus what was measured, tuned and observed."""

from __future__ import annotations

from typing import Any, ClassVar, Literal, Self

from pydantic import Field, create_model

from infertune.tuner.api import ApiModel
from infertune.tuner.candidate import Candidate
from infertune.tuner.engines.options import EngineOptions
from infertune.tuner.knobs import SERVING_KNOBS, KnobSet

ConditionType = Literal["Profiled", "Tuned", "RolledOut", "SLOMet", "Schedulable", "Ready"]
CONDITION_TYPES: tuple[str, ...] = (
    "ModelFetched",
    "Profiled",
    "Tuned",
    "RolledOut",
    "SLOMet",
    "Schedulable",
    "Ready",
)


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


class RatioInterval(ApiModel):
    """How much better the winner is than another configuration: the ratio of their mean
    objective over repeated runs (> 1: the winner is better), with a confidence interval."""

    ratio: float | None = None
    low: float | None = Field(default=None, description="Lower end of the interval.")
    high: float | None = Field(default=None, description="Upper end of the interval.")
    level: float | None = Field(default=None, description="The interval's confidence, e.g. 0.9.")
    runs: int = Field(default=0, description="The winner's measurements.")
    other_runs: int = Field(default=0, description="The other configuration's measurements.")


class Advantage(ApiModel):
    """The tuner's race (the best few re-measured in alternation before a winner is declared)."""

    settled: bool = Field(
        default=False,
        description="The order of the raced configurations was settled before the budget ended.",
    )
    remeasured: int = Field(default=0, description="Trials the race spent re-measuring.")
    over_runner_up: RatioInterval | None = None
    over_default: RatioInterval | None = Field(
        default=None,
        description="Over the engine's default configuration (when the tuner knows it and the "
        "searched space holds it).",
    )


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
    gpu_product: str | None = Field(
        default=None,
        description="GPU product the result holds for, in the nvidia.com/gpu.product label form "
        "(NVML's name with dashes for spaces).",
    )
    gpu_memory_mib: int | None = Field(
        default=None, description="Memory of that GPU in MiB (nvidia.com/gpu.memory), if known."
    )
    replicas: int | None = Field(
        default=None,
        description="Replicas the service's traffic was shared among: the tuner loaded one "
        "replica with traffic.rate / replicas (replicaRate), so the measured figures of best and "
        "live are one replica's.",
    )
    replica_rate: float | None = Field(
        default=None, description="Requests/s the tuner loaded its one replica with."
    )
    warm_start_trials: int | None = Field(
        default=None,
        description="Trials of earlier studies of this model that seeded this run's study "
        "(enqueued best configurations and trials transferred to the sampler); 0: a cold start.",
    )
    advantage: Advantage | None = Field(
        default=None,
        description="The winner's advantage over the runner-up and over the engine's default, "
        "with intervals from repeated runs.",
    )


class Figures(ApiModel):
    """Measured latency percentiles (milliseconds) and throughput."""

    # One field per SLO metric and percentile the API accepts (test_one_verdict holds them so).

    ttft_p50_ms: float | None = None
    ttft_p90_ms: float | None = None
    ttft_p95_ms: float | None = None
    ttft_p99_ms: float | None = None
    itl_p50_ms: float | None = None
    itl_p90_ms: float | None = None
    itl_p95_ms: float | None = None
    itl_p99_ms: float | None = None
    e2e_p50_ms: float | None = None
    e2e_p90_ms: float | None = None
    e2e_p95_ms: float | None = None
    e2e_p99_ms: float | None = None
    goodput_rps: float | None = None
    capacity_rps: float | None = Field(
        default=None,
        description="SLO capacity: the highest Poisson rate (requests/s, one replica) at which "
        "every SLO bound held at its percentile, found by a ramp from the spec's rate.",
    )
    request_rate: float | None = None
    output_tokens_per_second: float | None = None
    prompt_tokens_mean: float | None = None
    output_tokens_mean: float | None = None


class EngineRecord(ApiModel):
    """The engine version a configuration was measured with, and which of the flags that differ
    between versions it has: what the adapter needs to render the same argv for the Deployment."""

    version: str = Field(max_length=64)
    flags: list[str] = Field(default_factory=list, max_length=16)

    def options(self, engine: str) -> EngineOptions:
        return EngineOptions.from_wire(engine, self.model_dump())


class ServingConfigBase(ApiModel):
    """What a serving configuration carries besides its knobs, and the typed view of those.

    The knob fields themselves come from the knob declaration (:func:`serving_config_model`), so a
    knob added there appears in the status, the CRD and the tuner's summary without an edit here.
    """

    knob_set: ClassVar[KnobSet] = SERVING_KNOBS

    config_hash: str | None = None
    measured: Figures | None = Field(
        default=None,
        description="What the tuner measured on ONE replica under its share of the traffic "
        "(status.tuning.replicaRate); requestRate here is per replica.",
    )
    cost_per_million_tokens: float | None = Field(
        default=None,
        description="USD per million output tokens at the SLO: gpusPerReplica x price per "
        "GPU-hour / (output tokens/s x 3600) x 1e6; absent when no GPU price is known.",
    )
    slo_margins_ms: dict[str, float] = Field(
        default_factory=dict,
        description="Bound minus measured, per SLO metric (negative = missed).",
    )
    startup_s: float | None = Field(
        default=None, description="Seconds the winning trial's engine took to answer /health."
    )
    health_latency_ms: float | None = Field(
        default=None,
        description="Slowest /health round trip while the trial's load ran (sets probe timeouts).",
    )

    engine_options: EngineRecord | None = Field(
        default=None,
        description="The engine version the tuner measured (vLLM/SGLang): the Deployment's flags "
        "are rendered for it.",
    )

    quantization_method: str | None = Field(
        default=None,
        max_length=64,
        description="The --quantization method of the pre-quantized checkpoint "
        "(spec.model.variants) this int8/int4 configuration was measured with (vLLM/SGLang).",
    )
    model_bytes: int | None = Field(
        default=None,
        ge=0,
        description="Bytes of the hf:// checkpoint this configuration serves, as the tuning pod's "
        "fetch step downloaded it; sizes the serving pods' emptyDir model cache when neither "
        "spec.model.cache.size nor the chart's modelCache.size does.",
    )

    def adapter_options(self) -> EngineOptions | None:
        """The engine version's options to render this configuration's flags (None: unknown)."""
        return self.engine_options.options(self.candidate().engine) if self.engine_options else None

    def candidate(self) -> Candidate:
        """The knobs as the tuner's typed configuration (what the engine adapters take)."""
        return Candidate.from_dict(self.model_dump(include=set(self.knob_set.names)), self.knob_set)

    def describe(self, *, figures: bool = False) -> str:
        """``vllm/bf16 seqs=32 tokens=2048 block=16 graph`` for messages; with `figures`, what the
        tuner measured for it (TTFT p95, goodput)."""
        text = self.candidate().label()
        m = self.measured
        if figures and m is not None and m.ttft_p95_ms is not None:
            text += f", TTFT p95 {m.ttft_p95_ms:.0f}ms"
        if figures and m is not None and m.goodput_rps is not None:
            text += f", goodput {m.goodput_rps:.2f} req/s"
        return text

    @classmethod
    def of(cls, config: Candidate, **extra: Any) -> Self:
        """A status configuration of `config`'s knobs plus `extra` (measured, margins, hash)."""
        return cls.model_validate({**config.to_dict(), **extra})


def knob_fields(knobs: KnobSet) -> type[ApiModel]:
    """A model with one field per knob, in declared order, described as the declaration says."""
    fields: dict[str, Any] = {
        k.name: (k.type, Field(description=k.description))
        if k.default is None
        else (k.type, Field(default=k.default, description=k.description))
        for k in knobs
    }
    model: type[ApiModel] = create_model("ServingKnobs", __base__=ApiModel, **fields)
    return model


def serving_config_model(knobs: KnobSet) -> type[ServingConfigBase]:
    """The status model of a serving configuration over `knobs` (the declared set, or a test's).

    The knobs' model comes last among the bases so that their fields come first on the wire."""
    return type(
        "ServingConfig",
        (ServingConfigBase, knob_fields(knobs)),
        {"__module__": __name__, "knob_set": knobs, "__doc__": ServingConfig.__doc__},
    )


_DeclaredKnobs: Any = knob_fields(SERVING_KNOBS)


class ServingConfig(ServingConfigBase, _DeclaredKnobs):  # type: ignore[misc]
    """A serving configuration: the declared knobs, its hash, and what the tuner measured."""


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
    rollout_strategy: Literal["Surge", "ReplaceInPlace"] | None = Field(
        default=None,
        description=(
            "What spec.rollout.strategy Auto resolved to: ReplaceInPlace once a surge or canary "
            "pod could not be scheduled; reset to surging when a new config rolls out."
        ),
    )
    last_retune_time: str | None = None
    history: list[HistoryEntry] = Field(default_factory=list, max_length=20)
