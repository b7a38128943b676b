"""`infertune tune`: discover the hardware, profile the model, prune and seed the space, run the
study, guard quality, and assemble the result. The CLI (cli.py) only parses flags and prints."""

from __future__ import annotations

import functools
import math
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

from infertune.engine.config import ConfigError, LlamaConfig
from infertune.tuner.api import TuningSpec
from infertune.tuner.calibration import EngineCalibrator
from infertune.tuner.campaign import apply as apply_campaign
from infertune.tuner.campaign import run_campaign
from infertune.tuner.candidate import Candidate
from infertune.tuner.capacity import Capacity
from infertune.tuner.cost import CostBasis, cost_basis
from infertune.tuner.hardware import Hardware, discover
from infertune.tuner.memory_fit import MemoryBudget, prune_by_memory
from infertune.tuner.model_shape import ModelShape, ShapeError
from infertune.tuner.modelprofile import ModelProfile
from infertune.tuner.models import resolve_model
from infertune.tuner.planning import SeedPlanner, prune_by_roofline
from infertune.tuner.process import in_child, isolate_gpu_work
from infertune.tuner.quality import QualityResult, shortfall
from infertune.tuner.quality_guard import EngineQuality
from infertune.tuner.result import TrialRecord, TuningResult, binding_constraint, cost_summary
from infertune.tuner.roofline import ceiling_dtypes, floor_step_model
from infertune.tuner.search import (
    Evaluation,
    ProgressFn,
    ReportFn,
    evaluation_of,
    minimises,
)
from infertune.tuner.space import Space, build_space, why_unavailable
from infertune.tuner.study import (
    DUPLICATE_ATTR,
    SEED_ATTR,
    STALE_ATTR,
    make_sampler,
    open_study,
    settle,
)
from infertune.tuner.trial import Measurement, TrialRunner

SEED_COUNT = 5


@dataclass
class TuneOptions:
    study_name: str
    out: Path
    storage: str | None = None
    max_trials: int | None = None  # overrides budget.maxTrials (tests, quick looks)
    profile: bool = True
    quality: bool = True
    use_gpu: bool = True
    stale_after: float = 60.0  # seconds without heartbeat before a RUNNING trial is failed
    gpus_per_replica: int | None = None  # None: the GPUs this pod sees (the Job gets a replica's)
    gpu_hourly_prices: dict[str, float] = field(default_factory=dict)  # product ("*": any) -> USD
    progress: ProgressFn | None = None
    log: Callable[[str], None] = print
    extra: dict[str, Any] = field(default_factory=dict)


def _evaluation(
    m: Measurement, quality: QualityResult | None, capacity: Capacity | None = None
) -> Evaluation:
    reason = m.reason
    if m.failure_kind and reason and not reason.startswith(m.failure_kind):
        # The kind (crash, oom, timeout, unsupported) is what a reader of the report looks for.
        reason = f"{m.failure_kind}: {reason}"
    return Evaluation(
        config=m.config,
        outcome=m.status,
        margins_ms=m.margins_ms,
        reason=reason,
        peak_memory_bytes=m.peak_memory_bytes,
        startup_s=m.startup_s,
        quality=None if quality is None else quality.to_dict(),
        figures={**m.figures, **(capacity.figures() if capacity and capacity.floor_met else {})},
        capacity=None if capacity is None else capacity.to_dict(),
    )


def make_evaluator(
    spec: TuningSpec, runner: TrialRunner, quality: EngineQuality
) -> Callable[[Candidate, ReportFn], Evaluation]:
    def evaluate(config: Candidate, report: ReportFn) -> Evaluation:
        q = quality.get(config)  # measured on the engine serving `config`, on first ask
        if q is not None and not q.passed:
            # Infeasible before any load test: the measured figures are recorded.
            return Evaluation(
                config,
                "infeasible-quality",
                reason=q.reason,
                quality=q.to_dict(),
                quality_shortfall=shortfall(q, spec.quality),
            )
        m = runner.run(config, report)
        # The goodput objective ranks by SLO capacity (capacity.py): ramp a configuration that
        # holds the spec's rate, on the engine it left running.
        ramp = spec.slo.objective == "goodput" and m.meets_slo
        return _evaluation(m, q, runner.capacity(config, m) if ramp else None)

    return evaluate


@dataclass
class Analysis:
    """What the tuner knows of the model before any trial: its shape (None when config.json
    cannot be read) and the memory-fit verdicts (MemoryFit.text()) of every precision searched."""

    shape: ModelShape | None
    memory_fit: list[str] = field(default_factory=list)


def prune_before_trials(
    spec: TuningSpec, model_dir: Path, hardware: Hardware, space: Space, opts: TuneOptions
) -> Analysis:
    """Needs no engine: the built-in engine leaves the space when it cannot serve the model, and
    every precision whose weights + one sequence's KV cannot fit one replica is pruned."""
    if "builtin" in space.engines:
        try:
            LlamaConfig.from_dir(model_dir)
        except ConfigError as exc:
            space.drop_engine(
                "builtin", f"the built-in engine cannot serve this model: {exc}", "capability"
            )
    try:
        shape = ModelShape.from_dir(model_dir)
    except (ShapeError, OSError) as exc:
        opts.log(f"no analytic model of {model_dir} ({exc}): memory fit not checked")
        return Analysis(None)
    opts.log(f"model: {shape.describe()}")
    budget = MemoryBudget.of(hardware, opts.gpus_per_replica)
    fits = prune_by_memory(space, spec, shape, hardware, budget)
    if not space.engines:
        reasons = "; ".join(f"{p.engine} {p.knob}={p.value}: {p.reason}" for p in space.pruned)
        raise ValueError(f"no configuration can run: {reasons}")
    return Analysis(shape, [f"{f.engine}: {f.text()}" for f in fits])


def profile_and_plan(
    spec: TuningSpec,
    model_dir: Path,
    hardware: Hardware,
    space: Space,
    opts: TuneOptions,
    analysis: Analysis | None = None,
) -> tuple[ModelProfile | None, SeedPlanner | None]:
    """Ceilings, the analytic floors, the built-in engine's own profile when `builtin` is
    searched, roofline pruning, and the planner of the seeds."""
    if not opts.profile:
        return None, None
    from infertune.tuner.profiler import measure_all

    shape = analysis.shape if analysis else None
    quants = sorted({q for e in space.engines.values() for q in e.quantizations})
    prompt = max(1, round(spec.traffic.prompt_tokens.expected))
    batch = min(max(max(e.max_num_seqs) for e in space.engines.values()), 16)
    builtin = "builtin" in space.engines
    isolate = isolate_gpu_work(hardware.is_gpu)
    opts.log(
        f"measuring ceilings on {hardware.describe()} (cached per machine)"
        + (
            f", profiling prefill ({prompt} tokens) and decode (batch 1, {batch})"
            if builtin
            else ""
        )
        + (" in a child process that frees the GPU before any engine starts" if isolate else "")
    )
    measure = functools.partial(
        measure_all, hardware, ceiling_dtypes(quants), model_dir if builtin else None, quants,
        prompt_tokens=prompt, batch=batch, reference=spec.quality.reference,
    )  # fmt: skip
    ceilings, profile = in_child(measure) if isolate else measure()
    opts.log(
        f"  memory bandwidth {ceilings.memory_bandwidth_gbps:.1f} GB/s, peak "
        + ", ".join(f"{d} {f / 1e9:.1f} GFLOP/s" for d, f in sorted(ceilings.peak_flops.items()))
    )
    # Seam: calibration of the engines under test through their own API (TTFT at a few prompt
    # lengths, ITL at a few batch sizes) fills profile.precisions here; until then a precision
    # the built-in engine did not measure is planned from its floors (profile.analytic).
    if shape is None:
        return profile, SeedPlanner(space, spec, profile, SEED_COUNT)
    profile.model = shape.to_dict()
    profile.memory_fit = list(analysis.memory_fit) if analysis else []
    profile.analytic = {q: floor_step_model(shape, ceilings, q, prompt) for q in quants}
    prune_by_roofline(space, spec, shape, profile)
    return profile, SeedPlanner(space, spec, profile, SEED_COUNT)


def startup_trials(seed_count: int, max_trials: int) -> int:
    """Trials before TPE models the objective: the seeds, then random ones for contrast only when
    the budget is large. Replayed on the recorded landscape (benchmarks/bench_search.py, 16
    trials), two random trials after three seeds gave a median of 0.925 of the optimum and five
    calibrated seeds with none 0.963: on a small budget a random trial mostly lands in a precision
    the calibrated model already ranks far off."""
    return max(seed_count, min(10, max_trials // 3))


def run_tuning(spec: TuningSpec, opts: TuneOptions) -> TuningResult:
    started = time.monotonic()
    hardware = discover(use_gpu=opts.use_gpu)
    # The space first: an engine that cannot run here is reported before any model download.
    space = build_space(spec, hardware)
    if not space.engines:
        raise ValueError(
            f"no engine in search.engines can run on {hardware.describe()}:\n"
            + why_unavailable(space)
        )
    model_dir = resolve_model(spec.model)
    analysis = prune_before_trials(spec, model_dir, hardware, space, opts)
    profile, planner = profile_and_plan(spec, model_dir, hardware, space, opts, analysis)
    for p in space.pruned:
        opts.log(f"pruned {p.engine} {p.knob}={p.value}: {p.reason}")
    max_trials = opts.max_trials or spec.budget.max_trials
    multi = spec.search.sampler == "nsga2"
    seed = spec.search.seed
    sampler = make_sampler(
        spec.search.sampler,
        space,
        seed=seed,
        multi_objective=multi,
        startup_trials=startup_trials(SEED_COUNT, max_trials),
    )
    cost = cost_basis(
        opts.gpu_hourly_prices, hardware.gpu_product, hardware.count if hardware.is_gpu else 1
    )
    study = open_study(
        opts.study_name, opts.storage, sampler, multi_objective=multi, minimise=minimises(spec)
    )

    def plan_next(measured: dict[Candidate, dict[str, float]]) -> Candidate | None:
        if planner is None:
            return None
        planned = planner.next(measured)
        if planned is not None:
            calibrated = " (model recalibrated on the trials so far)" if measured else ""
            opts.log(f"seed {len(planner.planned)}/{SEED_COUNT}: {planned.label()}{calibrated}")
        return planned

    runner = TrialRunner(spec, model_dir, opts.out / "work", hardware, seed=seed or 0)
    # Quality and calibration through the API of the engine under test, on the trials' engines:
    # no weights are loaded in the tuner.
    calibrator = EngineCalibrator(
        spec, profile, analysis.shape, vocab=analysis.shape.vocab_size if analysis.shape else 0,
        log=opts.log,
    )  # fmt: skip
    quality = EngineQuality(spec, model_dir, runner.serve, log=opts.log, on_served=calibrator)
    try:
        calibrator.before_study(space, runner.serve, quality)
        campaign = run_campaign(
            study,
            space,
            spec,
            make_evaluator(spec, runner, quality),
            hardware=hardware.describe(),
            gpu=hardware.is_gpu,
            max_trials=max_trials,
            max_seconds=float(spec.budget.max_duration),
            multi_objective=multi,
            log=opts.log,
            progress=opts.progress,
            stale_after=opts.stale_after,
            plan_next=plan_next,
            cost=cost,
        )
    finally:
        runner.close()
    settle(study, opts.stale_after)  # other workers' last trials (budget.parallelTrials)
    result = assemble(study, spec, hardware, profile, space, quality, max_trials, multi, cost)
    apply_campaign(result, campaign)  # the race's winner, its advantages, the warm start
    result.seeds = [c.to_dict() for c in planner.planned] if planner else []
    result.restarts = runner.restarts
    result.importance = importance(study, minimise=minimises(spec))
    result.elapsed_s = time.monotonic() - started
    return result


def trial_records(study: optuna.Study, spec: TuningSpec) -> list[TrialRecord]:
    """The trials this run started: COMPLETE, PRUNED, FAIL, and RUNNING when another worker was
    still measuring at the end. Not WAITING ones -- an enqueued warm-start seed or a dead worker's
    retry that no worker took before the budget ran out never ran -- nor duplicates (repeats
    answered from an earlier measurement, warm-start trials transferred from a prior study,
    trials given back over the budget): none of them is a measurement of this run."""
    out: list[TrialRecord] = []
    for t in study.get_trials(deepcopy=False):
        if t.state == TrialState.WAITING or t.user_attrs.get(DUPLICATE_ATTR):
            continue
        ev = evaluation_of(t)
        if ev is None:
            reason = t.user_attrs.get("failure_reason") or f"trial {t.state.name.lower()}"
            outcome = "failed" if t.state == TrialState.FAIL else t.state.name.lower()
            if t.user_attrs.get(STALE_ATTR):
                outcome = "failed-stale"  # its worker died; the configuration was retried
            out.append(TrialRecord(t.number, dict(t.params), outcome, False, None, reason=reason))
            continue
        out.append(
            TrialRecord(
                number=t.number,
                config=ev.config.to_dict(),
                outcome=ev.outcome,
                feasible=ev.feasible(spec),
                objective=t.values[0] if t.values else None,
                figures=ev.figures,
                margins_ms=ev.margins_ms,
                constraints=ev.constraints(spec),
                reason=ev.reason,
                peak_memory_bytes=ev.peak_memory_bytes,
                startup_s=ev.startup_s,
                quality=ev.quality,
                seeded=bool(t.user_attrs.get(SEED_ATTR)),
                values=list(t.values) if t.values else None,
            )
        )
    return out


def assemble(
    study: optuna.Study,
    spec: TuningSpec,
    hardware: Hardware,
    profile: ModelProfile | None,
    space: Space,
    quality: EngineQuality,
    max_trials: int,
    multi: bool,
    cost: CostBasis | None = None,
) -> TuningResult:
    records = trial_records(study, spec)
    measured = [r for r in records if r.figures]
    feasible = [r for r in records if r.feasible]
    result = TuningResult(
        study=study.study_name,
        status="failed",
        reason="",
        hardware=hardware.to_dict(),
        objective=spec.slo.objective,
        slo=spec.slo.to_wire(),
        trials=records,
        trials_total=max_trials,
        profile=None if profile is None else profile.to_dict(),
        profile_wire=None if profile is None else profile.to_wire(),
        space=space.to_dict(),
        quality={q: r.to_dict() for q, r in quality.results.items()},
    )
    if multi:
        front = [t.number for t in study.best_trials]
        result.pareto = [r for r in records if r.number in front]
    sign = -1.0 if minimises(spec) else 1.0  # best first: the highest, or the cheapest
    if cost is not None:
        result.cost = cost_summary(cost)

    def rank(r: TrialRecord) -> float:
        return sign * (r.objective if r.objective is not None else -sign * math.inf)

    if feasible:
        best = max(feasible, key=lambda r: (rank(r), -(r.peak_memory_bytes or 0)))
        result.best, result.status = best, "succeeded"
        result.reason = (
            f"best of {len(feasible)} feasible configurations out of {len(records)} trials"
        )
    elif measured:
        closest = min(measured, key=lambda r: (max(r.constraints or [1e9]), -rank(r)))
        result.best, result.status = closest, "infeasible"
        result.binding_constraint = binding_constraint(measured, spec.slo)
        result.reason = (
            f"no configuration met the SLOs in {len(records)} trials; closest shown "
            f"({result.binding_constraint})"
        )
    else:
        kinds = sorted({r.reason or r.outcome for r in records})[:3]
        result.reason = f"no trial produced a measurement ({'; '.join(kinds) or 'no trials ran'})"
    if not multi and measured:
        # Pareto front of throughput vs p95 end-to-end latency over measured trials, for the report.
        result.pareto = pareto_front(measured)
    return result


def importance(study: optuna.Study, *, minimise: bool = False) -> dict[str, float]:
    """PED-ANOVA importance of each knob for the objective (empty when too few trials vary)."""
    try:
        with warnings.catch_warnings():
            # PED-ANOVA warns that it ranks knobs for *low* targets even when given the minus sign.
            warnings.simplefilter("ignore", UserWarning)
            raw = optuna.importance.get_param_importances(
                study,
                # Optuna's default (PED-ANOVA, no scikit-learn needed) ranks knobs by how they
                # reach *low* targets; a maximised objective takes the minus sign.
                target=lambda t: (t.values[0] if minimise else -t.values[0]) if t.values else 0.0,
            )
    except (ValueError, RuntimeError, ZeroDivisionError, ImportError):
        return {}
    return {k: float(v) for k, v in raw.items()}


def pareto_front(records: list[TrialRecord]) -> list[TrialRecord]:
    def point(r: TrialRecord) -> tuple[float, float]:
        return r.figures.get("outputTokensPerSecond", 0.0), r.figures.get("e2eP95Ms", 1e12)

    front = []
    for r in records:
        tr, lat = point(r)
        dominated = any(
            (o_tr >= tr and o_lat <= lat) and (o_tr > tr or o_lat < lat)
            for o_tr, o_lat in (point(o) for o in records)
        )
        if not dominated:
            front.append(r)
    return sorted(front, key=lambda r: point(r)[0])
