"""Warm-started retunes: a new study of the same model starts from what earlier studies measured.

A TrafficDrift or HardwareChanged retune of the same model searches the same knobs again; most of
what the earlier study learned (which precisions are far off, which step sizes stall decode) still
holds. Two things carry over, both down-weighted by how far the context moved (`Context.distance`:
the log-ratios of rate, mean prompt and mean output length, plus one for other hardware;
weight = exp(-distance)):

* **Enqueued seeds**: the prior study's best few feasible configurations are measured first, here
  (they cost trials like any other): between 1 and WARM_SEEDS of them, more the closer the context.
* **A transferred prior**: a share `weight` of the prior's measured trials (at least MIN_TRANSFER,
  spread evenly over its ranking so the bad regions come along with the good) are added to the new
  study as completed trials, with their constraints, for the sampler's model only. Their values are
  rescaled by the rate ratio (both the capacity and the goodput objective are rates). They are
  marked duplicates (study.DUPLICATE_ATTR), so they never count against the budget, never answer a
  measurement, and never win: only configurations measured in this study are reported.

Prior studies are found in the study storage: every study whose `warm_key` user attribute (model
and engines) equals this one's, newest first, at most MAX_PRIOR_STUDIES.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution
from optuna.study import StudyDirection
from optuna.trial import TrialState

from infertune.tuner.api import TuningSpec
from infertune.tuner.candidate import Candidate
from infertune.tuner.search import constraint_names, evaluation_of
from infertune.tuner.space import Space
from infertune.tuner.study import (
    DUPLICATE_ATTR,
    SEED_ATTR,
    param_name,
    params_of,
)

TRANSFERRED_ATTR = "transferred_from"  # "<study>#<trial number>"
CONTEXT_ATTR = "warm_context"
KEY_ATTR = "warm_key"
WARM_SEEDS = 3
MIN_TRANSFER = 3
MAX_PRIOR_STUDIES = 3


@dataclass(frozen=True)
class Context:
    """What a study was tuned for, as far as warm starting cares."""

    rate: float | None
    prompt_tokens: float
    output_tokens: float
    hardware: str

    @classmethod
    def of(cls, spec: TuningSpec, hardware: str) -> Context:
        t = spec.traffic
        return cls(t.rate, t.prompt_tokens.expected, t.output_tokens.expected, hardware)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> Context:
        return cls(raw.get("rate"), float(raw["prompt_tokens"]), float(raw["output_tokens"]),
                   str(raw.get("hardware", "")))  # fmt: skip

    def distance(self, other: Context) -> float:
        def log_gap(a: float | None, b: float | None) -> float:
            if a is None or b is None or a <= 0 or b <= 0:
                return 0.0 if a == b else 1.0
            return abs(math.log(a / b))

        return (
            log_gap(self.rate, other.rate)
            + log_gap(self.prompt_tokens, other.prompt_tokens)
            + log_gap(self.output_tokens, other.output_tokens)
            + (0.0 if self.hardware == other.hardware else 1.0)
        )


def weight(here: Context, prior: Context) -> float:
    return math.exp(-here.distance(prior))


def warm_key(spec: TuningSpec, space: Space) -> str:
    """Studies share what they learned when they tuned the same model over the same engines."""
    return f"{spec.model.uri}|{','.join(sorted(space.engines))}"


@dataclass
class PriorTrial:
    config: Candidate
    value: float
    constraints: list[float]
    feasible: bool
    source: str  # "<study>#<number>"


@dataclass
class Prior:
    study: str
    context: Context
    trials: list[PriorTrial]
    maximise: bool = True


def prior_of(study: optuna.Study, spec: TuningSpec) -> Prior | None:
    """The measured trials of a finished study (None: it recorded no context)."""
    raw = study.user_attrs.get(CONTEXT_ATTR)
    if not raw:
        return None
    trials: list[PriorTrial] = []
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        if t.user_attrs.get(DUPLICATE_ATTR) or not t.values:
            continue
        ev = evaluation_of(t)
        if ev is None:
            continue
        trials.append(
            PriorTrial(
                ev.config,
                float(t.values[0]),
                ev.constraints(spec),
                ev.feasible(spec),
                f"{study.study_name}#{t.number}",
            )
        )
    maximise = study.directions[0] == StudyDirection.MAXIMIZE
    return Prior(study.study_name, Context.from_dict(raw), trials, maximise)


def find_priors(
    storage: optuna.storages.BaseStorage | str | None,
    key: str,
    exclude: str,
    spec: TuningSpec,
) -> list[Prior]:
    """Earlier single-objective studies in `storage` with this `key`, newest first."""
    if storage is None:
        return []
    out: list[Prior] = []
    summaries = optuna.get_all_study_summaries(storage, include_best_trial=False)
    newest_first = sorted(summaries, key=lambda s: s.datetime_start or datetime.min, reverse=True)
    for s in newest_first:
        if s.study_name == exclude or s.user_attrs.get(KEY_ATTR) != key or len(s.directions) != 1:
            continue
        prior = prior_of(optuna.load_study(study_name=s.study_name, storage=storage), spec)
        if prior is not None and prior.trials:
            out.append(prior)
        if len(out) >= MAX_PRIOR_STUDIES:
            break
    return out


@dataclass
class WarmStart:
    studies: list[str] = field(default_factory=list)
    weights: list[float] = field(default_factory=list)
    enqueued: list[Candidate] = field(default_factory=list)
    transferred: int = 0

    @property
    def prior_trials(self) -> int:
        """Prior trials this study used: transferred ones and enqueued seeds."""
        return self.transferred + len(self.enqueued)

    def to_dict(self) -> dict[str, Any]:
        return {
            "studies": self.studies,
            "weights": [round(w, 4) for w in self.weights],
            "enqueued": [c.to_dict() for c in self.enqueued],
            "transferred": self.transferred,
            "priorTrials": self.prior_trials,
        }


def _spread(ranked: list[PriorTrial], n: int) -> list[PriorTrial]:
    """`n` of `ranked`, evenly spaced over the ranking, best and worst included."""
    if n >= len(ranked):
        return list(ranked)
    if n <= 1:
        return ranked[:1]
    step = (len(ranked) - 1) / (n - 1)
    return [ranked[round(i * step)] for i in range(n)]


def seed_study(
    study: optuna.Study,
    space: Space,
    spec: TuningSpec,
    here: Context,
    priors: list[Prior],
    *,
    seeds: int = WARM_SEEDS,
) -> WarmStart:
    """Enqueue the priors' best and add their transferred trials to `study` (a new, empty one;
    a resumed study keeps what it has)."""
    out = WarmStart()
    if study.get_trials(deepcopy=False) or not priors:
        return out
    maximise = study.directions[0] == StudyDirection.MAXIMIZE
    names = constraint_names(spec)
    seen: set[Candidate] = set()
    for prior in priors:
        if prior.maximise != maximise:
            continue  # another objective's direction: its values do not transfer
        w = weight(here, prior.context)
        usable = [t for t in prior.trials if _fits(t.config, space)]
        if not usable:
            continue
        out.studies.append(prior.study)
        out.weights.append(w)
        sign = -1.0 if maximise else 1.0
        ranked = sorted(usable, key=lambda t: (not t.feasible, sign * t.value))
        k = max(1, min(seeds, round(seeds * w + 0.5)))
        for t in ranked:
            if len(out.enqueued) >= k * len(out.studies) or not t.feasible:
                break
            if t.config not in seen:
                seen.add(t.config)
                out.enqueued.append(t.config)
                study.enqueue_trial(
                    params_of(t.config, space),
                    user_attrs={SEED_ATTR: True, "warm_start_of": t.source},
                )
        scale = 1.0
        if here.rate and prior.context.rate:
            scale = here.rate / prior.context.rate
            scale = scale if maximise else 1.0 / scale
        for t in _spread(ranked, max(MIN_TRANSFER, round(w * len(ranked)))):
            params = params_of(t.config, space)
            dists = _distributions(t.config, space)
            study.add_trial(
                optuna.trial.create_trial(
                    params=params,
                    distributions=dists,
                    value=t.value * scale,
                    user_attrs={DUPLICATE_ATTR: t.source, TRANSFERRED_ATTR: t.source},
                    constraints=dict(zip(names, t.constraints, strict=True)),
                )
            )
            out.transferred += 1
    return out


def _fits(config: Candidate, space: Space) -> bool:
    engine = space.engines.get(config.engine)
    if engine is None:
        return False
    return all(config[k] in values for k, values in engine.by_knob().items())


def _distributions(config: Candidate, space: Space) -> dict[str, BaseDistribution]:
    """The distributions `study.suggest` uses, so the sampler sees the same parameters."""
    out: dict[str, BaseDistribution] = {}
    if len(space.engines) > 1:
        out["engine"] = CategoricalDistribution(sorted(space.engines))
    for knob, values in space.engines[config.engine].by_knob().items():
        out[param_name(knob, config.engine, space)] = CategoricalDistribution(values)
    return out


def mark(study: optuna.Study, spec: TuningSpec, space: Space, hardware: str) -> None:
    """Record this study's context and key, so a later retune finds it."""
    study.set_user_attr(CONTEXT_ATTR, Context.of(spec, hardware).to_dict())
    study.set_user_attr(KEY_ATTR, warm_key(spec, space))
