"""Use the profile before any trial: prune precisions that cannot meet the SLO, and pick the seeds.

Torch-free. Pruning is conservative: a precision goes only when its decode floor at batch 1 (the
best case for inter-token latency) or its prefill floor for a mean prompt alone (the best case for
time to first token) already exceeds the bound. Only floors prune: a measured step includes this machine's noise and
overheads a different engine may not have, so measurements only rank (seed), never exclude. Seeds are the configurations the step-time model predicts best, spread
over precisions and batch limits so the sampler starts from several good regions.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from math import exp, log

from infertune.tuner.api import TuningSpec
from infertune.tuner.candidate import Candidate
from infertune.tuner.model_shape import ModelShape
from infertune.tuner.modelprofile import ModelProfile
from infertune.tuner.roofline import Prediction, StepModel, decode_floor, predict, prefill_floor
from infertune.tuner.space import Space
from infertune.tuner.verdict import figure_key


def prune_by_roofline(
    space: Space, spec: TuningSpec, shape: ModelShape, profile: ModelProfile
) -> None:
    slo = spec.slo
    prompt = max(1, round(spec.traffic.prompt_tokens.expected))
    ceilings = profile.ceilings
    for engine, e in list(space.engines.items()):
        verdicts: dict[str, tuple[float, str]] = {}
        for q in list(e.quantizations):
            reasons: list[str] = []
            worst = 0.0
            measured = profile.precisions.get(q)
            if slo.itl is not None:
                floor = decode_floor(shape, ceilings, q, 1, prompt).floor_ms
                if measured is not None:
                    floor = _credible(floor, measured.decode.measured_ms)
                worst = max(worst, floor / slo.itl.max.ms)
                if floor > slo.itl.max.ms:
                    reasons.append(
                        f"decode floor at batch 1 is {floor:.2f}ms > ITL bound {slo.itl.max.text}"
                    )
            if slo.ttft is not None:
                floor = prefill_floor(shape, ceilings, q, prompt).floor_ms
                if measured is not None and measured.prefill.tokens == prompt:
                    floor = _credible(floor, measured.prefill.measured_ms)
                worst = max(worst, floor / slo.ttft.max.ms)
                if floor > slo.ttft.max.ms:
                    reasons.append(
                        f"prefill floor for a {prompt}-token prompt is {floor:.1f}ms > TTFT bound {slo.ttft.max.text}"
                    )
            if reasons:
                verdicts[q] = (worst, "; ".join(reasons))
        if len(verdicts) == len(e.quantizations):
            # Every precision is hopeless: keep the least hopeless one so the study still returns
            # the closest configuration and names the binding constraint.
            keep = min(verdicts, key=lambda q: verdicts[q][0])
            verdicts.pop(keep)
        for q, (_, why) in verdicts.items():
            space.drop_quantization(engine, q, why, "roofline")


def _credible(floor_ms: float, measured_ms: float) -> float:
    """A floor above a measured time is no floor (its ceiling was measured low, e.g. on a busy
    machine, or the kernel is not the plain matmul the ceiling timed): never prune above what
    this machine has already done."""
    return min(floor_ms, measured_ms) if measured_ms > 0 else floor_ms


@dataclass
class Seed:
    config: Candidate
    prediction: Prediction
    score: float


def _score(p: Prediction, spec: TuningSpec) -> float:
    """Predicted goodput when every bound is predicted met; otherwise minus the worst overshoot."""
    over = 0.0
    for metric, obj in spec.slo.bounds().items():
        value = {"ttft": p.ttft_ms, "itl": p.itl_at(obj.quantile), "e2e": p.e2e_ms}[metric]
        over = max(over, value / obj.max.ms - 1.0)
    if not p.stable:
        over = max(over, 1.0)
    return p.goodput_rps if over <= 0 else -over


# Predicted scores within this share of each other are a tie: the step-time model is too crude to
# rank them, and below saturation every stable configuration is predicted to serve the whole rate.
TIE_SHARE = 0.02
# ITL "binds" when the predicted inter-token latency uses this share of its bound or more.
ITL_BINDS = 0.8


def _tie_break(p: Prediction, c: Candidate, spec: TuningSpec) -> tuple[float, ...]:
    """Order among predicted ties (smaller first).

    Batching is what raises throughput (and headroom for bursts above the mean rate), and larger
    prefill chunks cut TTFT, so the larger batch and token limits come first -- unless the ITL
    bound binds, where every extra sequence or prefill token in a step lengthens each token's
    gap, and the configuration with the lower predicted ITL comes first (after every tied
    configuration whose ITL does not bind).
    """
    itl = spec.slo.itl
    if itl is not None and p.itl_at(itl.quantile) >= ITL_BINDS * itl.max.ms:
        return (1.0, p.itl_at(itl.quantile), -c.max_num_seqs, c.max_num_batched_tokens)
    capacity = c.max_num_seqs / max(p.e2e_ms, 1e-9)  # requests/ms the batch limit can retire
    return (0.0, -capacity, -c.max_num_batched_tokens, p.ttft_ms)


def _bucket(score: float, best: float) -> int:
    """Scores within TIE_SHARE of each other (relative to the best) share a bucket."""
    scale = max(abs(best), 1e-9) * TIE_SHARE
    return -round(score / scale)


def prediction_for(c: Candidate, spec: TuningSpec, profile: ModelProfile) -> Prediction:
    """The step-time model's steady state for `c` under the spec's traffic."""
    t = spec.traffic
    step = profile.step_model(c.quantization, c.engine) or StepModel(1.0, 0.1)
    return predict(
        step,
        rate=t.rate,
        concurrency=t.concurrency,
        prompt_tokens=t.prompt_tokens.expected,
        output_tokens=t.output_tokens.expected,
        max_num_seqs=c.max_num_seqs,
        max_num_batched_tokens=c.max_num_batched_tokens,
    )


# measured / predicted per SLO metric; 1.0 = the model as profiled.
Scale = dict[str, float]


def _scaled(p: Prediction, scale: Scale) -> Prediction:
    ttft, itl = scale.get("ttft", 1.0), scale.get("itl", 1.0)
    return replace(
        p,
        ttft_ms=p.ttft_ms * ttft,
        itl_ms=p.itl_ms * itl,
        itl_tail_ms=p.itl_tail_ms * itl,
        e2e_ms=p.e2e_ms * scale.get("e2e", 1.0),
    )


def rank(
    space: Space, spec: TuningSpec, profile: ModelProfile, scale: Scale | None = None
) -> list[Seed]:
    """Every candidate, best predicted first (ties broken by `_tie_break`)."""
    out: list[Seed] = []
    for c in space.candidates():
        p = _scaled(prediction_for(c, spec, profile), scale or {})
        out.append(Seed(c, p, _score(p, spec)))
    best = max((s.score for s in out), default=0.0)
    out.sort(
        key=lambda s: (
            _bucket(s.score, best),
            *_tie_break(s.prediction, s.config, spec),
            s.config.kv_block_size,
            s.config.quantization,
        )
    )
    return out


def seeds(space: Space, spec: TuningSpec, profile: ModelProfile, count: int) -> list[Seed]:
    """The `count` best-ranked candidates, no two sharing (engine, precision, max_num_seqs)."""
    chosen: list[Seed] = []
    seen: set[tuple[str, str, int]] = set()
    for s in rank(space, spec, profile):
        key = (s.config.engine, s.config.quantization, s.config.max_num_seqs)
        if key in seen:
            continue
        seen.add(key)
        chosen.append(s)
        if len(chosen) >= count:
            break
    # Adjacent seeds that share the engine and precision restart less when an engine can be reused.
    chosen.sort(key=lambda s: (s.config.engine, s.config.quantization, -s.score))
    return chosen


def calibrate(
    spec: TuningSpec, profile: ModelProfile, measured: Mapping[Candidate, Mapping[str, float]]
) -> Scale:
    """How far off the step model was on the trials already run, per SLO metric: the geometric
    mean of measured / predicted at the bound's percentile. The profile times bare forward passes;
    a served request also pays HTTP, tokenization, scheduling and a load generator on the same
    cores, and on a small model that overhead is most of a step."""
    scale: Scale = {}
    for metric, obj in spec.slo.bounds().items():
        key = figure_key(metric, obj.percentile)
        ratios = []
        for c, figures in measured.items():
            got = figures.get(key, 0.0)
            p = prediction_for(c, spec, profile)
            want = {"ttft": p.ttft_ms, "itl": p.itl_at(obj.quantile), "e2e": p.e2e_ms}[metric]
            if got > 0 and want > 0 and p.stable:
                ratios.append(log(got / want))
        if ratios:
            scale[metric] = min(20.0, max(0.2, exp(sum(ratios) / len(ratios))))
    return scale


class SeedPlanner:
    """The study's first trials, planned one at a time: the first is the profile's best
    prediction; each next one is the best prediction after recalibrating the step model on
    everything measured so far (so a first seed that misses its ITL bound by 2x moves the next
    one to smaller prefill chunks instead of repeating the miss in another precision)."""

    def __init__(self, space: Space, spec: TuningSpec, profile: ModelProfile, count: int) -> None:
        self.space, self.spec, self.profile, self.count = space, spec, profile, count
        self.planned: list[Candidate] = []

    @staticmethod
    def _key(c: Candidate) -> tuple[str, str, int, int]:
        # The KV block size does not enter the model: configurations differing only there tie.
        return (c.engine, c.quantization, c.max_num_seqs, c.max_num_batched_tokens)

    def next(self, measured: Mapping[Candidate, Mapping[str, float]]) -> Candidate | None:
        """The next seed, or None once `count` are planned."""
        if len(self.planned) >= self.count:
            return None
        done = {self._key(c) for c in [*measured, *self.planned]}
        scale = calibrate(self.spec, self.profile, measured)
        for s in rank(self.space, self.spec, self.profile, scale):
            if self._key(s.config) not in done:
                self.planned.append(s.config)
                return s.config
        return None
