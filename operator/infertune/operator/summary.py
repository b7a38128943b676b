"""Read the tuner's compact summary (the tuning pod's termination message) into status models."""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from infertune.operator.api import Figures, Profile, ServingConfig
from infertune.operator.api.status import Advantage, EngineRecord, PhaseProfile, RatioInterval
from infertune.tuner.api.base import to_camel
from infertune.tuner.candidate import Candidate

SUMMARY_VERSION = 1


def figures_by_field(measured: dict[str, float | None]) -> dict[str, float]:
    """Contract keys -> Figures field names (by name, not alias: the aliases differ for e2e)."""
    names = {to_camel(name): name for name in Figures.model_fields}
    return {names[k]: v for k, v in measured.items() if k in names and v is not None}


class _Camel(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)


class SummaryBest(_Camel):
    """The winner: its knobs (camelCase, as the declaration names them), figures and margins."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    measured: dict[str, float | None] = Field(default_factory=dict)
    slo_margins_ms: dict[str, float] = Field(default_factory=dict, alias="sloMarginsMs")
    startup_s: float | None = Field(default=None, alias="startupS")
    health_latency_ms: float | None = Field(default=None, alias="healthLatencyMs")
    cost_per_million_tokens: float | None = Field(default=None, alias="costPerMillionTokens")
    engine_options: EngineRecord | None = Field(default=None, alias="engineOptions")
    quantization_method: str | None = Field(default=None, alias="quantizationMethod")

    @model_validator(mode="after")
    def _knobs_complete(self) -> SummaryBest:
        self.candidate()  # raises ValueError naming a missing or mistyped knob
        return self

    def candidate(self) -> Candidate:
        return Candidate.from_wire(self.model_extra or {})


class SummaryRatio(_Camel):
    ratio: float | None = None
    low: float | None = None
    high: float | None = None
    level: float | None = None
    runs: int = 0
    other_runs: int = Field(default=0, alias="otherRuns")

    def status(self) -> RatioInterval:
        return RatioInterval.model_validate(self.model_dump())


class SummaryRace(_Camel):
    """The tuner's race (result._race): the winner's advantages with their intervals."""

    settled: bool = False
    remeasured: int = 0
    over_runner_up: SummaryRatio | None = Field(default=None, alias="overRunnerUp")
    over_default: SummaryRatio | None = Field(default=None, alias="overDefault")


class SummaryWarmStart(_Camel):
    prior_trials: int = Field(default=0, alias="priorTrials")
    transferred: int = 0
    enqueued: int = 0
    studies: list[str] = Field(default_factory=list)


class Summary(_Camel):
    """The contract's schema (`infertune.tuner.result.compact_summary`), validated at the edge."""

    version: int
    status: Literal["succeeded", "infeasible", "failed"]
    reason: str = ""
    study: str | None = None
    trials_completed: int = Field(default=0, alias="trialsCompleted")
    trials_total: int = Field(default=0, alias="trialsTotal")
    hardware: str | None = None
    gpu_product: str | None = Field(default=None, alias="gpuProduct")
    gpu_memory_mib: int | None = Field(default=None, alias="gpuMemoryMib")
    best: SummaryBest | None = None
    binding_constraint: str | None = Field(default=None, alias="bindingConstraint")
    profile: dict[str, Any] | None = None
    race: SummaryRace | None = None
    warm_start: SummaryWarmStart | None = Field(default=None, alias="warmStart")

    def advantage(self) -> Advantage | None:
        r = self.race
        if r is None:
            return None
        return Advantage(
            settled=r.settled,
            remeasured=r.remeasured,
            over_runner_up=r.over_runner_up.status() if r.over_runner_up else None,
            over_default=r.over_default.status() if r.over_default else None,
        )

    def serving_config(self) -> ServingConfig | None:
        if self.best is None:
            return None
        b = self.best
        return ServingConfig.of(
            b.candidate(),
            measured=Figures.model_validate(figures_by_field(b.measured)),
            slo_margins_ms=dict(b.slo_margins_ms),
            startup_s=b.startup_s,
            health_latency_ms=b.health_latency_ms,
            cost_per_million_tokens=b.cost_per_million_tokens,
            engine_options=b.engine_options,
            quantization_method=b.quantization_method,
        )

    def status_profile(self) -> Profile | None:
        p = self.profile
        if not p or not p.get("hardware"):
            return None
        phases = {
            k: PhaseProfile.model_validate(p[k])
            for k in ("prefill", "decode")
            if isinstance(p.get(k), dict)
        }
        return Profile(
            hardware=str(p["hardware"]),
            memory_bandwidth_gbps=p.get("memoryBandwidthGbps"),
            peak_tflops=p.get("peakTflops"),
            **phases,
        )


def parse_summary(message: str | None) -> Summary | str:
    """The summary, or a one-line reason why there is none (the log tail of a crash, say)."""
    text = (message or "").strip()
    if not text:
        return "the tuning pod left no termination message"
    try:
        raw = json.loads(text)
    except ValueError:
        tail = text.splitlines()[-1] if text.splitlines() else text
        return f"the tuner did not write a summary; last log line: {tail[:500]}"
    if not isinstance(raw, dict):
        return "the termination message is JSON but not an object"
    if raw.get("version") != SUMMARY_VERSION:
        return (
            f"summary version {raw.get('version')!r} is not supported (expected {SUMMARY_VERSION})"
        )
    try:
        return Summary.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        where = ".".join(str(p) for p in first["loc"])
        return f"the tuner's summary is malformed at {where}: {first['msg']}"
