"""The tuning result: full JSON for the report and the study record, and the operator's compact summary."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from infertune.tuner.api import SLO
from infertune.tuner.api.base import to_camel
from infertune.tuner.cost import CostBasis
from infertune.tuner.gpu_identity import GpuIdentity, from_nvml
from infertune.tuner.trial import FIGURE_KEYS, HEALTH_KEY
from infertune.tuner.verdict import figure_key

SUMMARY_LIMIT = 4096  # bytes of a Kubernetes termination message
SUMMARY_VERSION = 1


@dataclass
class TrialRecord:
    number: int
    config: dict[str, Any]
    outcome: str  # ok, stopped, failed, infeasible-quality, pruned
    feasible: bool
    objective: float | None
    figures: dict[str, float] = field(default_factory=dict)
    margins_ms: dict[str, float] = field(default_factory=dict)
    constraints: list[float] = field(default_factory=list)
    reason: str | None = None
    peak_memory_bytes: int | None = None
    startup_s: float | None = None
    quality: dict[str, Any] | None = None
    seeded: bool = False
    values: list[float] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {k: _finite(v) for k, v in self.__dict__.items()}


@dataclass
class TuningResult:
    study: str
    status: str  # succeeded, infeasible, failed
    reason: str
    hardware: dict[str, Any]
    objective: str
    slo: dict[str, Any]
    trials: list[TrialRecord]
    trials_total: int
    best: TrialRecord | None = None
    binding_constraint: str | None = None
    pareto: list[TrialRecord] = field(default_factory=list)
    profile: dict[str, Any] | None = None
    profile_wire: dict[str, Any] | None = None
    space: dict[str, Any] | None = None
    quality: dict[str, Any] = field(default_factory=dict)
    seeds: list[dict[str, Any]] = field(default_factory=list)
    report_path: str | None = None
    elapsed_s: float = 0.0
    restarts: int = 0
    importance: dict[str, float] = field(default_factory=dict)
    cost: dict[str, Any] | None = None  # cost_summary: GPUs, price per GPU-hour, the unit
    race: dict[str, Any] | None = None  # racing.RaceResult.to_dict(): the winner's advantages
    warm_start: dict[str, Any] | None = None  # warm_start.WarmStart.to_dict()

    def cost_basis(self) -> CostBasis | None:
        c = self.cost
        if c is None:
            return None
        return CostBasis(int(c.get("gpus") or 1), c.get("gpuHourlyPrice"), c.get("product"))

    def cost_per_million(self, record: TrialRecord | None) -> float | None:
        """USD per million output tokens of a measured trial (None: no price, no figures)."""
        basis = self.cost_basis()
        if basis is None or record is None or not record.figures:
            return None
        return basis.per_million(record.figures.get("outputTokensPerSecond"))

    @property
    def trials_completed(self) -> int:
        """Trials that spent the budget, as study.py counts it: finished ones (measured, pruned or
        failed), not ones still running, never started (waiting) or whose worker died."""
        return sum(
            1 for t in self.trials if t.outcome not in ("running", "waiting", "failed-stale")
        )

    def to_dict(self) -> dict[str, Any]:
        out = {k: v for k, v in self.__dict__.items() if k not in ("trials", "best", "pareto")}
        out["trials"] = [t.to_dict() for t in self.trials]
        out["best"] = None if self.best is None else self.best.to_dict()
        out["pareto"] = [t.to_dict() for t in self.pareto]
        out["trials_completed"] = self.trials_completed
        return _finite(out)  # type: ignore[no-any-return]

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=False)


def cost_summary(basis: CostBasis) -> dict[str, Any]:
    """The cost basis as the result records it (JSON)."""
    return {
        "gpus": basis.gpus,
        "gpuHourlyPrice": basis.hourly_price,
        "product": basis.product,
        "unit": basis.unit,
    }


def _finite(value: Any) -> Any:
    """JSON has no infinity: a margin of -inf (metric never measured) becomes null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def binding_constraint(trials: list[TrialRecord], slo: SLO) -> str | None:
    """The SLO metric no trial met, with the best figure any trial achieved for it."""
    measured = [t for t in trials if t.figures]
    if not measured:
        return None
    worst: tuple[float, str] | None = None
    for metric, obj in slo.bounds().items():
        key = figure_key(metric, obj.percentile)
        values = [t.figures[key] for t in measured if key in t.figures]
        if not values:
            continue
        best = min(values)
        ratio = best / obj.max.ms
        if ratio > 1 and (worst is None or ratio > worst[0]):
            worst = (
                ratio,
                f"{metric} {obj.percentile} <= {obj.max.text}: best achieved {best:.0f}ms",
            )
    if worst is not None:
        return worst[1]
    if slo.min_output_tokens_per_second is not None:
        top = max(t.figures.get("outputTokensPerSecond", 0.0) for t in measured)
        if top < slo.min_output_tokens_per_second:
            return (
                f"output tokens/s >= {slo.min_output_tokens_per_second:g}: best achieved {top:.1f}"
            )
    # Each bound was met by some trial, but never all together by one.
    closest = min(measured, key=lambda t: max(t.constraints or [math.inf]))
    missed = [m for m, v in closest.margins_ms.items() if v is not None and v < 0]
    return f"no configuration meets all bounds at once; the closest misses {', '.join(missed) or 'quality'}"


def _serving(best: TrialRecord) -> dict[str, Any]:
    # The record's knobs as it carries them (each knob's wire name is its camelCase).
    out: dict[str, Any] = {to_camel(k): v for k, v in best.config.items()}
    measured = {k: round(best.figures[k], 3) for k in FIGURE_KEYS if k in best.figures}
    if measured:
        out["measured"] = measured
    margins = {
        k: round(v, 3)
        for k, v in best.margins_ms.items()
        if isinstance(v, float) and math.isfinite(v)
    }
    if margins:
        out["sloMarginsMs"] = margins
    # What the operator times the serving pods' probes by (builders/probes.py).
    if best.startup_s is not None:
        out["startupS"] = round(best.startup_s, 2)
    if HEALTH_KEY in best.figures:
        out["healthLatencyMs"] = round(best.figures[HEALTH_KEY], 1)
    return out


def _gpu(hardware: dict[str, Any]) -> GpuIdentity | None:
    if hardware.get("kind") != "gpu":
        return None
    memory = hardware.get("memory_bytes")
    return from_nvml(
        str(hardware.get("product") or ""), memory if isinstance(memory, int) else None
    )


def compact_summary(result: TuningResult) -> dict[str, Any]:
    """The operator's view (camelCase, <= 4096 bytes as JSON): status, best config, profile."""
    out: dict[str, Any] = {
        "version": SUMMARY_VERSION,
        "status": result.status,
        "reason": result.reason[:600],
        "study": result.study,
        "trialsCompleted": result.trials_completed,
        "trialsTotal": result.trials_total,
        "hardware": str(result.hardware.get("product", ""))[:200],
    }
    gpu = _gpu(result.hardware)
    # The label form (nvidia.com/gpu.product), as the node and spec.hardware.gpuProducts say it.
    out["gpuProduct"] = gpu.product if gpu is not None else None
    out["gpuMemoryMib"] = gpu.memory_mib if gpu is not None else None
    if result.best is not None:
        out["best"] = _serving(result.best)
        # The engine version measured and its version-dependent flags: the operator renders the
        # Deployment's argv for them (engines/options.py).
        engine = (result.space or {}).get("engines", {}).get(result.best.config.get("engine"))
        if engine and engine.get("engineOptions"):
            out["best"]["engineOptions"] = engine["engineOptions"]
        # The --quantization method of the pre-quantized checkpoint the winner was served from.
        method = ((engine or {}).get("quantizationMethods") or {}).get(
            result.best.config.get("quantization")
        )
        if method:
            out["best"]["quantizationMethod"] = method
        cost = result.cost_per_million(result.best)
        if cost is not None:
            out["best"]["costPerMillionTokens"] = round(cost, 6)
    out["bindingConstraint"] = result.binding_constraint
    if result.race is not None:
        out["race"] = _race(result.race)
    if result.warm_start is not None:
        w = result.warm_start
        out["warmStart"] = {
            "priorTrials": int(w.get("priorTrials", 0)),
            "transferred": int(w.get("transferred", 0)),
            "enqueued": len(w.get("enqueued", [])),
            "studies": [str(s)[:120] for s in w.get("studies", [])][:3],
        }
    if result.profile_wire is not None:
        out["profile"] = result.profile_wire
    text = json.dumps(out, separators=(",", ":"))
    # Shed the least important parts until it fits the termination message.
    for drop in ("profile", "reason"):
        if len(text.encode()) <= SUMMARY_LIMIT:
            break
        if drop == "reason":
            out["reason"] = out["reason"][:100]
        else:
            out.pop(drop, None)
        text = json.dumps(out, separators=(",", ":"))
    return out


def _race(race: dict[str, Any]) -> dict[str, Any]:
    """The race's verdict for the operator: the winner's advantage (a ratio of mean objective,
    > 1 better, with its interval from the repeated runs) over the runner-up and over the
    engine's default configuration."""

    def ratio(r: dict[str, Any] | None) -> dict[str, Any] | None:
        if not r:
            return None
        n = r.get("n") or [0, 0]
        return {"ratio": r.get("ratio"), "low": r.get("low"), "high": r.get("high"),
                "runs": int(n[0]), "otherRuns": int(n[1]), "level": r.get("level")}  # fmt: skip

    out: dict[str, Any] = {
        "settled": bool(race.get("settled")),
        "remeasured": int(race.get("remeasured", 0)),
        "overRunnerUp": ratio(race.get("over_runner_up")),
        "overDefault": ratio(race.get("over_default")),
    }
    for key, wire in (("runner_up", "runnerUp"), ("default", "default")):
        cfg = race.get(key)
        if cfg:
            out[wire] = {to_camel(k): v for k, v in cfg.items()}
    return out


def summary_json(result: TuningResult) -> str:
    text = json.dumps(compact_summary(result), separators=(",", ":"))
    if len(text.encode()) > SUMMARY_LIMIT:  # cannot happen with the fields above; guard anyway
        raise ValueError(f"compact summary is {len(text.encode())} bytes, over {SUMMARY_LIMIT}")
    return text
