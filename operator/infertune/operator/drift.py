"""Pure decisions for the keep-checking loop: SLO checks over a window, traffic drift against the
tuned profile, GPU product changes, cooldown, and whether a retuned config beats the live one."""

from __future__ import annotations

from dataclasses import dataclass, field

from infertune.operator.api import Figures, RetunePolicy, ServingConfig
from infertune.tuner.api import SLO, LengthDistribution, TrafficProfile
from infertune.tuner.api.traffic import MAX_TOKENS
from infertune.tuner.gpu_identity import GpuIdentity
from infertune.tuner.lognormal import max_lognormal_p95
from infertune.tuner.verdict import judge, judge_figures

REASON_SLO = "SLOViolation"
REASON_DRIFT = "TrafficDrift"
REASON_HARDWARE = "HardwareChanged"


def slo_check(slo: SLO, at_percentile: dict[str, float | None]) -> tuple[bool | None, list[str]]:
    """(met, violating) from each bound metric's observed value (ms) at the SLO's own percentile:
    the tuner's verdict (:func:`infertune.tuner.verdict.judge`) on a live window.

    met is None when no bound metric has an observation (no traffic in the window).
    """
    verdict = judge(slo, at_percentile)
    return verdict.met, verdict.violating


@dataclass
class RetuneTimers:
    """Since when a condition has held continuously (monotonic seconds); kept per service in memory."""

    violating_since: float | None = None
    drifting_since: float | None = None
    drift_detail: list[str] = field(default_factory=list)

    def update(self, now: float, *, violated: bool | None, drifted: list[str] | None) -> None:
        if violated is True:
            self.violating_since = self.violating_since if self.violating_since is not None else now
        elif violated is False:
            self.violating_since = None  # a clean sample restarts the window; no traffic keeps it
        if drifted:
            self.drifting_since = self.drifting_since if self.drifting_since is not None else now
            self.drift_detail = drifted
        elif drifted is not None:
            self.drifting_since, self.drift_detail = None, []

    def held(self, since: float | None, now: float, window: float) -> bool:
        return since is not None and now - since >= window


@dataclass(frozen=True)
class TrafficRef:
    """The traffic a live config was tuned for; `rate` is one replica's (requests/s)."""

    rate: float | None
    prompt_tokens: float | None
    output_tokens: float | None


def tuned_traffic(
    config: ServingConfig | None, traffic: TrafficProfile, replicas: int = 1
) -> TrafficRef:
    """What the tuner measured the winner under (one replica's load), falling back to the spec's
    traffic (the service's total, so its rate is shared among `replicas`)."""
    m = config.measured if config is not None and config.measured is not None else Figures()
    share = traffic.rate / max(1, replicas) if traffic.rate is not None else None
    return TrafficRef(
        rate=m.request_rate if m.request_rate is not None else share,
        prompt_tokens=m.prompt_tokens_mean
        if m.prompt_tokens_mean is not None
        else traffic.prompt_tokens.expected,
        output_tokens=m.output_tokens_mean
        if m.output_tokens_mean is not None
        else traffic.output_tokens.expected,
    )


def _relative(observed: float, reference: float) -> float:
    return abs(observed - reference) / reference if reference > 0 else 0.0


def traffic_drift(
    ref: TrafficRef, observed: Figures, policy: RetunePolicy, replicas: int = 1
) -> list[str]:
    """Dimensions whose relative change exceeds the policy's thresholds.

    Like with like, per replica: the live rate is the sum over the `replicas` serving pods it was
    read from, so it is divided by them before it meets the tuned rate (one replica's load)."""
    out: list[str] = []
    live_rate = observed.request_rate
    per_pod = live_rate / max(1, replicas) if live_rate is not None else None
    pairs = (
        ("rate", ref.rate, per_pod, policy.drift.rate, "req/s per replica"),
        (
            "promptTokens",
            ref.prompt_tokens,
            observed.prompt_tokens_mean,
            policy.drift.prompt_tokens,
            "tokens",
        ),
        (
            "outputTokens",
            ref.output_tokens,
            observed.output_tokens_mean,
            policy.drift.output_tokens,
            "tokens",
        ),
    )
    for name, reference, value, threshold, unit in pairs:
        if reference is None or value is None:
            continue
        change = _relative(value, reference)
        if change > threshold:
            signed = (value - reference) / reference  # a fall reads as one: -76%, not +76%
            out.append(
                f"{name} {value:.3g} {unit} vs tuned {reference:.3g} "
                f"({signed:+.0%} beyond the {threshold:.0%} threshold)"
            )
    return out


def hardware_change(tuned: GpuIdentity | None, serving: set[GpuIdentity]) -> str | None:
    """A message when a serving pod's node has a GPU other than the one tuned on (compared as one
    identity, :mod:`infertune.tuner.gpu_identity`: NVML's and the node label's spellings agree)."""
    if tuned is None or not serving:
        return None
    others = sorted({str(gpu) for gpu in serving if not gpu.same_as(tuned)})
    if not others:
        return None
    return f"serving on {', '.join(others)} but tuned on {tuned}"


def in_cooldown(last_retune_epoch: float | None, now_epoch: float, cooldown_s: float) -> bool:
    return last_retune_epoch is not None and now_epoch - last_retune_epoch < cooldown_s


@dataclass(frozen=True)
class Decision:
    reason: str | None
    message: str = ""
    cooldown: bool = False  # a trigger fired but the cooldown holds it back


def decide_retune(
    policy: RetunePolicy,
    timers: RetuneTimers,
    now: float,
    *,
    violating: list[str],
    hardware: str | None,
    in_cooldown_now: bool,
) -> Decision:
    """First trigger that fired and is enabled: hardware (immediate), then drift and SLO (after a
    window). Drift ranks before the SLO: when the traffic changed and the SLOs are missed with it,
    the change is the cause and the miss its symptom -- the retune is for the new traffic either
    way, and the reason should say why (the message keeps the miss)."""
    if not policy.enabled:
        return Decision(None)
    window = float(policy.violation_window)
    fired: list[tuple[str, str]] = []
    # Only on evidence from this check: with no traffic the window neither resets nor extends, and
    # a violation that held before the traffic stopped is no reason to retune now.
    slo_held = (
        REASON_SLO in policy.triggers
        and bool(violating)
        and timers.held(timers.violating_since, now, window)
    )
    missed = "SLOs missed for the violation window: " + "; ".join(violating)
    if hardware and REASON_HARDWARE in policy.triggers:
        fired.append((REASON_HARDWARE, hardware))
    if REASON_DRIFT in policy.triggers and timers.held(timers.drifting_since, now, window):
        drift = "traffic drifted: " + "; ".join(timers.drift_detail)
        fired.append((REASON_DRIFT, f"{drift}; {missed}" if slo_held else drift))
    if slo_held:
        fired.append((REASON_SLO, missed))
    if not fired:
        return Decision(None)
    reason, message = fired[0]
    return Decision(reason, message, cooldown=in_cooldown_now)


MIN_RETUNE_REQUESTS = 20


def observed_traffic(
    base: TrafficProfile,
    observed: Figures,
    prompt_p95: float | None,
    output_p95: float | None,
    notes: list[str] | None = None,
) -> TrafficProfile:
    """The spec's traffic with rate and lengths replaced by what live traffic shows.

    Live lengths can be heavier-tailed than any lognormal (p95 above ~3.87x the mean): such a p95
    is clamped to the largest the load generator can produce for that mean, and `notes` (when
    given) gets one line per clamp for the history and the log.
    """

    def lengths(
        name: str, mean: float | None, p95: float | None, fallback: LengthDistribution
    ) -> LengthDistribution:
        if mean is None or mean < 1:
            return fallback
        m = min(MAX_TOKENS, max(1, round(mean)))
        if p95 is not None and round(p95) > m:
            seen = min(MAX_TOKENS, round(p95))
            largest = max_lognormal_p95(m)
            if seen > largest and notes is not None:
                notes.append(
                    f"observed {name} p95 {seen} is beyond any lognormal with mean {m}; "
                    f"tuning for p95 {largest}, the largest the load generator can produce"
                )
            return LengthDistribution(distribution="lognormal", mean=m, p95=min(seen, largest))
        return LengthDistribution(distribution="fixed", mean=m)

    update: dict[str, object] = {
        "prompt_tokens": lengths(
            "promptTokens", observed.prompt_tokens_mean, prompt_p95, base.prompt_tokens
        ),
        "output_tokens": lengths(
            "outputTokens", observed.output_tokens_mean, output_p95, base.output_tokens
        ),
    }
    if observed.request_rate is not None and observed.request_rate > 0:
        rate = round(observed.request_rate, 3)
        update.update(rate=rate, concurrency=None)
        if base.rate and base.num_requests and rate < base.rate:
            # Keep each retune trial about as long as the first tuning's: at a fifth of the rate
            # the same request count would make every trial five times longer. Never below
            # MIN_RETUNE_REQUESTS, so that a p95 still rests on enough requests.
            scaled = round(base.num_requests * rate / base.rate)
            update["num_requests"] = max(min(MIN_RETUNE_REQUESTS, base.num_requests), scaled)
    return TrafficProfile.model_validate({**base.model_dump(), **update})


def beats_live(
    candidate: ServingConfig,
    live: ServingConfig,
    live_observed: Figures | None,
    live_violating: list[str],
    slo: SLO,
    min_gain: float,
) -> tuple[bool, str]:
    """Whether a retuned winner should replace the live config, and why (for the history).

    The candidate's figures were measured by the tuner on the new traffic; the live config's come
    from the live observation on that same traffic. Both sides are judged by the one verdict and
    compared on the one goodput (:mod:`infertune.tuner.verdict`): the tuner counts good requests,
    the live check estimates the same count from its histograms.
    """
    if candidate.config_hash is not None and candidate.config_hash == live.config_hash:
        return False, "the retune chose the live configuration again"
    measured = (candidate.measured or Figures()).to_wire()
    cand_ok = judge_figures(slo, measured).fully_met
    if cand_ok and live_violating:
        return True, "meets the SLOs the live configuration misses (" + "; ".join(
            live_violating
        ) + ")"
    if not cand_ok and not live_violating and live_observed is not None:
        return False, "misses SLOs the live configuration meets"
    m = candidate.measured or Figures()
    lo = live_observed or Figures()
    key = "goodput_rps" if slo.objective == "goodput" else "output_tokens_per_second"
    new, old = getattr(m, key), getattr(lo, key)
    if new is None:
        return False, f"the retune reported no {key}"
    if old is None or old <= 0:
        return True, f"{key} {new:.3g} with no live figure to compare"
    if new > old * (1 + min_gain):
        return True, f"{key} {new:.3g} vs live {old:.3g} (+{new / old - 1:.0%})"
    return False, f"{key} {new:.3g} vs live {old:.3g}: gain below {min_gain:.0%}"
