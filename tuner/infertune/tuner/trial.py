"""One trial: serve a configuration, load-test it with the spec's traffic, report what it did.

The engine is reused when the next configuration differs only in knobs the engine can change at
runtime. During the load test, intermediate results go to the study (for its pruner) and a trial
whose SLO is already certain to be missed stops early: once more requests have exceeded a bound
than the percentile allows over the whole run, no later request can rescue it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from infertune.tuner.api import SLO, TuningSpec
from infertune.tuner.api.base import PERCENTILES
from infertune.tuner.api.slo import SLO_METRICS
from infertune.tuner.candidate import Candidate
from infertune.tuner.capacity import (
    CAPACITY_KEY,
    MAX_PROBES,
    PROBE_S,
    RESOLUTION,
    Capacity,
    search_capacity,
)
from infertune.tuner.engines import AdapterError, EngineAdapter, get_adapter
from infertune.tuner.hardware import Hardware
from infertune.tuner.loadgen import LoadResult, Options, run_load_sync
from infertune.tuner.models import model_uri, resolve_model, variant_methods
from infertune.tuner.process import EngineProcess, HealthWatch, TrialError
from infertune.tuner.verdict import LATENCY_FIGURE_KEYS, figure_key, judge_figures

# (step, intermediate goodput) -> True when the study's pruner wants the trial stopped.
ReportFn = Callable[[int, float], bool]
# The slowest /health round trip during the load (ms): not an SLO figure, but what the operator
# times its serving pods' probes by (result.py puts it in the summary as healthLatencyMs).
HEALTH_KEY = "healthMaxMs"
FIGURE_KEYS = (
    *LATENCY_FIGURE_KEYS,
    "goodputRps",
    CAPACITY_KEY,
    "requestRate",
    "outputTokensPerSecond",
    "promptTokensMean",
    "outputTokensMean",
)


@dataclass
class Measurement:
    """What a trial measured. `status`: ok, stopped (SLO certainly missed) or failed."""

    config: Candidate
    status: str
    reason: str | None = None
    failure_kind: str | None = None
    figures: dict[str, float] = field(default_factory=dict)
    slo_met: dict[str, bool] = field(default_factory=dict)
    margins_ms: dict[str, float] = field(default_factory=dict)
    peak_memory_bytes: int | None = None
    startup_s: float | None = None
    reused_engine: bool = False
    wall_s: float = 0.0
    requests: int = 0
    failed_requests: int = 0
    saturated: bool = False

    @property
    def goodput(self) -> float:
        return self.figures.get("goodputRps", 0.0)

    @property
    def meets_slo(self) -> bool:
        return self.status == "ok" and bool(self.slo_met) and all(self.slo_met.values())

    def to_dict(self) -> dict[str, Any]:
        return {
            "config": self.config.to_dict(),
            "status": self.status,
            "reason": self.reason,
            "failure_kind": self.failure_kind,
            "figures": self.figures,
            "slo_met": self.slo_met,
            "margins_ms": self.margins_ms,
            "peak_memory_bytes": self.peak_memory_bytes,
            "startup_s": self.startup_s,
            "reused_engine": self.reused_engine,
            "wall_s": self.wall_s,
            "requests": self.requests,
            "failed_requests": self.failed_requests,
            "saturated": self.saturated,
        }


def figures_of(result: LoadResult) -> dict[str, float]:
    out: dict[str, float] = {}
    for metric in SLO_METRICS:
        summary = getattr(result, metric)
        for p in PERCENTILES:
            value = summary.at(p)
            if value is not None:
                out[figure_key(metric, p)] = float(value)
    out["goodputRps"] = float(result.goodput or 0.0)
    out["requestRate"] = float(result.request_throughput)
    out["outputTokensPerSecond"] = float(result.output_throughput)
    prompt = result.prompt_tokens_server or result.prompt_tokens_requested
    if prompt is not None:
        out["promptTokensMean"] = float(prompt)
    ok = [r for r in result.records if r.ok]
    if ok:
        out["outputTokensMean"] = sum(r.output_count for r in ok) / len(ok)
    return out


def slo_margins(figures: dict[str, float], slo: SLO) -> tuple[dict[str, float], dict[str, bool]]:
    """Bound minus measured (ms) per SLO metric at its percentile (negative = missed), and whether
    each bound was met; a bound the trial did not measure is missed."""
    verdict = judge_figures(slo, figures)
    met = {m: verdict.met_by_metric.get(m, False) for m in slo.bounds()}
    return verdict.margins_ms, met


def certain_violation(
    snapshot: LoadResult, slo: SLO, planned: int, out_tokens: float
) -> str | None:
    """The SLO metric that the rest of the run can no longer bring back within its bound."""
    for metric, obj in slo.bounds().items():
        allowed_share = 1.0 - obj.quantile / 100.0
        if metric == "itl":
            over = sum(1 for r in snapshot.records if r.ok for g in r.itl if g > obj.max)
            total = planned * max(out_tokens - 1.0, 1.0)
        else:
            attr = "ttft" if metric == "ttft" else "e2e"
            over = sum(
                1
                for r in snapshot.records
                if r.ok and (v := getattr(r, attr)) is not None and v > obj.max
            )
            total = float(planned)
        over += snapshot.failed  # a failed request misses every bound
        if over > allowed_share * total + 1:
            return f"{metric} {obj.percentile} <= {obj.max.text}: {over} of at most {total:.0f} samples already over"
    return None


class TrialRunner:
    """Runs configurations one after another, keeping the engine up when it can be reused."""

    def __init__(
        self,
        spec: TuningSpec,
        model_dir: Path,
        workdir: Path,
        hardware: Hardware,
        *,
        adapters: dict[str, EngineAdapter] | None = None,
        served_model_name: str | None = None,
        seed: int = 0,
        stop_on_violation: bool = True,
    ) -> None:
        self.spec = spec
        self.model_dir = model_dir
        self.workdir = workdir
        self.hardware = hardware
        self.adapters = adapters or {}
        self.served_model_name = served_model_name or spec.model.served_name
        self.seed = seed
        # A study stops a trial once its SLO is certainly missed; a benchmark comparing goodput
        # runs the whole load instead (goodput over a cut-short run is not comparable).
        self.stop_on_violation = stop_on_violation
        self.engine: EngineProcess | None = None
        self.restarts = 0

    def adapter(self, engine: str) -> EngineAdapter:
        if engine not in self.adapters:
            methods = variant_methods(self.spec.model)
            self.adapters[engine] = get_adapter(engine, quant_methods=methods)
        return self.adapters[engine]

    def model_for(self, config: Candidate) -> Path:
        """The checkpoint `config` loads: the spec's pre-quantized variant for its precision when
        its engine serves variants (models.model_uri), else the tuned model."""
        spec_model = self.spec.model
        if model_uri(spec_model, config.quantization, config.engine) == spec_model.uri:
            return self.model_dir
        try:
            return resolve_model(spec_model, config.quantization, config.engine)
        except ValueError as exc:
            raise TrialError("unsupported", str(exc)) from exc

    def serve(self, config: Candidate) -> tuple[str, str]:
        """An engine serving `config`, left running for the trial that follows (the quality
        guard's): its base URL and served model name. TrialError when it cannot start."""
        engine, _ = self._engine_for(config, float(self.spec.budget.trial_timeout))
        return engine.url, engine.launch.served_model_name

    def close(self) -> None:
        if self.engine is not None:
            self.engine.stop()
            self.engine = None

    def _engine_for(self, config: Candidate, timeout: float) -> tuple[EngineProcess, bool]:
        current = self.engine
        adapter = self.adapter(config.engine)
        if (
            current is not None
            and current.alive()
            and current.config.engine == config.engine
            and not adapter.needs_restart(current.config, config, self.hardware)
        ):
            return current, True
        self.close()
        why = adapter.missing()
        if why:
            raise TrialError("unsupported", why)
        try:
            model_path = adapter.prepare_model(self.model_for(config), config, self.workdir)
            engine = EngineProcess(
                adapter,
                config,
                model_path,
                self.workdir / "engines",
                self.hardware,
                served_model_name=self.served_model_name,
            )
        except AdapterError as exc:
            raise TrialError("unsupported", str(exc)) from exc
        self.restarts += 1
        try:
            engine.start(timeout)
        except BaseException:  # SIGTERM (SystemExit) while it boots must not orphan it
            engine.stop()
            raise
        self.engine = engine
        return engine, False

    def run(
        self,
        config: Candidate,
        report: ReportFn | None = None,
        *,
        rate: float | None = None,
        num_requests: int | None = None,
        timeout: float | None = None,
    ) -> Measurement:
        """Serve `config` and load it with the spec's traffic; `rate` and `num_requests` replace
        the spec's (a capacity probe), `timeout` the spec's trialTimeout."""
        started = time.monotonic()
        timeout = float(self.spec.budget.trial_timeout) if timeout is None else timeout
        deadline = started + timeout
        try:
            engine, reused = self._engine_for(config, timeout)
        except TrialError as exc:
            self.close()
            return Measurement(
                config, "failed", exc.message, exc.kind, wall_s=time.monotonic() - started
            )
        traffic = self.spec.traffic
        if rate is not None:
            traffic = traffic.model_copy(
                update={
                    "rate": rate,
                    "num_requests": num_requests or traffic.num_requests,
                    "duration": None if num_requests else traffic.duration,
                    "concurrency": None,
                }
            )
        planned = traffic.num_requests or int((traffic.rate or 1.0) * float(traffic.duration or 60))
        out_tokens = traffic.output_tokens.expected
        stop_reason: list[str] = []
        step = [0]

        def should_stop(snapshot: LoadResult) -> bool:
            engine.sample_memory()
            step[0] += 1
            if time.monotonic() > deadline:
                stop_reason.append(
                    f"timeout: trial exceeded budget.trialTimeout={self.spec.budget.trial_timeout.text}"
                )
                return True
            if not engine.alive():
                stop_reason.append("engine died during the load test")
                return True
            if report is not None and report(step[0], float(snapshot.goodput or 0.0)):
                stop_reason.append("pruned: the study's pruner stopped it")
                return True
            why = (
                certain_violation(snapshot, self.spec.slo, planned, out_tokens)
                if self.stop_on_violation
                else None
            )
            if why:
                stop_reason.append(f"SLO already missed: {why}")
                return True
            return False

        tokenizer = self.model_dir if (self.model_dir / "tokenizer.json").exists() else None
        health = HealthWatch(engine.url + engine.launch.health_path)
        try:
            with health:
                result = run_load_sync(
                    engine.url,
                    traffic,
                    self.spec.slo,
                    model=engine.launch.served_model_name,
                    tokenizer_dir=tokenizer,
                    options=Options(
                        timeout=max(1.0, deadline - time.monotonic()),
                        seed=self.seed,
                        progress_interval=0.5,
                    ),
                    should_stop=should_stop,
                )
        except (ValueError, OSError) as exc:
            self.close()
            return Measurement(
                config,
                "failed",
                f"load test failed: {exc}",
                "error",
                wall_s=time.monotonic() - started,
            )
        m = self._measurement(config, engine, reused, result, stop_reason, started)
        if health.worst_ms is not None:
            m.figures[HEALTH_KEY] = round(health.worst_ms, 3)
        return m

    def capacity(
        self,
        config: Candidate,
        floor: Measurement,
        *,
        max_probes: int = MAX_PROBES,
        resolution: float = RESOLUTION,
    ) -> Capacity:
        """The SLO capacity of `config` (capacity.py), ramping from the spec's rate on the engine
        `floor` (the trial at the spec's rate) left running, within what is left of the trial's
        timeout. Closed-loop traffic (no rate) has no rate to ramp: its capacity is not measured."""
        rate = self.spec.traffic.rate
        if rate is None:
            return Capacity(0.0, floor.meets_slo, stopped="closed-loop traffic has no rate")
        timeout = float(self.spec.budget.trial_timeout)
        end = time.monotonic() + max(0.0, timeout - floor.wall_s)

        def probe(r: float, n: int) -> tuple[bool, str]:
            m = self.run(config, rate=r, num_requests=n, timeout=max(1.0, end - time.monotonic()))
            why = m.reason or ("" if m.meets_slo else "a percentile over its bound")
            return m.meets_slo, why

        # A probe's own length is about PROBE_S of arrivals and its drain: none starts that could
        # not finish before the trial's timeout.
        return search_capacity(
            probe,
            rate,
            floor.meets_slo,
            max_probes=max_probes,
            resolution=resolution,
            deadline=end - 2 * PROBE_S,
        )

    def _measurement(
        self,
        config: Candidate,
        engine: EngineProcess,
        reused: bool,
        result: LoadResult,
        stop_reason: list[str],
        started: float,
    ) -> Measurement:
        peak = engine.sample_memory()
        figures = figures_of(result)
        margins, met = slo_margins(figures, self.spec.slo)
        m = Measurement(
            config,
            "ok",
            figures=figures,
            slo_met=met,
            margins_ms=margins,
            peak_memory_bytes=peak or None,
            startup_s=engine.startup_s,
            reused_engine=reused,
            requests=result.sent,
            failed_requests=result.failed,
            saturated=result.saturation.saturated,
        )
        if not engine.alive():
            failure = engine.failure()
            self.close()
            m.status, m.failure_kind, m.reason = "failed", failure.kind, failure.message
        elif stop_reason and stop_reason[0].startswith("timeout"):
            m.status, m.failure_kind, m.reason = "failed", "timeout", stop_reason[0]
            self.close()
        elif result.completed == 0:
            m.status, m.failure_kind = "failed", "error"
            m.reason = f"no request succeeded: {result.errors}"
        elif stop_reason:
            m.status, m.reason = "stopped", stop_reason[0]
            m.slo_met = {k: False for k in met} if "SLO" in stop_reason[0] else met
        elif result.failed:
            m.reason = f"{result.failed} of {result.sent} requests failed: {result.errors}"
        m.wall_s = time.monotonic() - started
        return m
