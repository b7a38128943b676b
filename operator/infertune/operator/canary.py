"""Canary rollouts (`spec.rollout.canary`): a new config that would replace a live one first serves
beside it on `canary.replicas` pods (the Service selects both tracks, so they take a share of the
traffic). Each check judges the canary's own live figures against the SLOs; it is promoted only when
it met them in at least one check with traffic and missed them in none for the whole window, and
rolled back otherwise (at once on a miss when `rollbackOnSLOBreach`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from infertune.operator.api import CanaryRun, ServingConfig
from infertune.operator.builders import desired_deployment
from infertune.operator.builders.deployment import deployment_name
from infertune.operator.context import Ctx
from infertune.operator.reconcile import ensure
from infertune.operator.schedulable import canary_fits, effective_strategy

CANARY = "canary"
Verdict = Literal["wait", "promote", "rollback"]


@dataclass(frozen=True)
class Judgement:
    verdict: Verdict
    reason: str  # condition/history reason: CanaryRunning, CanaryPromoted, SLOBreach, Unproven
    message: str


UNPROVEN_AFTER = 3  # windows without any traffic on the canary before it is given up


def judge(
    run: CanaryRun,
    since_start_s: float,
    since_proving_s: float | None,
    window_s: float,
    rollback_on_breach: bool,
) -> Judgement:
    """Pure: what to do with a canary after its latest check (already counted into `run`).

    The window runs from the first check that saw traffic on the canary (pods take a while to
    load weights); a canary no traffic reaches for UNPROVEN_AFTER windows is rolled back."""
    breach = "canary missed the SLOs: " + "; ".join(run.violating)
    if run.violating and rollback_on_breach:
        return Judgement("rollback", "SLOBreach", breach)
    if since_proving_s is None:
        if since_start_s >= UNPROVEN_AFTER * window_s:
            return Judgement(
                "rollback", "Unproven", f"no traffic reached the canary in {since_start_s:.0f}s"
            )
        return Judgement("wait", "CanaryRunning", "waiting for traffic on the canary")
    if since_proving_s < window_s:
        return Judgement("wait", "CanaryRunning", f"{run.checks_met} check(s) met so far")
    if run.violating:
        return Judgement("rollback", "SLOBreach", breach)
    return Judgement(
        "promote",
        "CanaryPromoted",
        f"met the SLOs in {run.checks_met} check(s) over {since_proving_s:.0f}s",
    )


def record(run: CanaryRun, met: bool | None, violating: list[str], now: str) -> CanaryRun:
    """Fold one check of the canary's pods into its run (None: no traffic reached it)."""
    if met is None:
        return run
    update: dict[str, object] = {"proving_since": run.proving_since or now}
    if met:
        update["checks_met"] = run.checks_met + 1
    else:
        update["violating"] = violating
    return run.model_copy(update=update)


def describe(config: ServingConfig) -> str:
    return f"{config.describe()} (config {config.config_hash})"


def strategy(ctx: Ctx) -> str:
    return effective_strategy(ctx.isvc.spec.rollout.strategy, ctx.status.rollout_strategy)


def no_room(ctx: Ctx) -> str | None:
    """Why a canary cannot run when pods are replaced in place (None when it can)."""
    rollout = ctx.isvc.spec.rollout
    mode = effective_strategy(rollout.strategy, ctx.status.rollout_strategy)
    if canary_fits(mode, rollout.replicas, rollout.canary.replicas):
        return None
    return (
        f"no spare GPU for a canary: pods are replaced in place and a canary of "
        f"{rollout.canary.replicas} replica(s) would leave none of the {rollout.replicas} stable "
        "replica(s); raise spec.rollout.replicas, set spec.rollout.strategy to Surge with a free "
        "GPU, or turn the canary off"
    )


def refuse(ctx: Ctx, config: ServingConfig, why: str) -> None:
    """The canary cannot run: the live config stays, and the condition and an event say why."""
    message = f"{describe(config)} not tried: {why}"
    ctx.condition("Canary", "False", "NoSpareGPU", message)
    ctx.history("CanaryRefused", "NoSpareGPU", message, config.config_hash)
    ctx.event("Warning", "NoSpareGPU", message)


async def start(ctx: Ctx, config: ServingConfig) -> bool:
    """Serve `config` on the canary track beside the live Deployment (replacing pods in place,
    in the slots of as many stable replicas); False when it cannot run (see no_room)."""
    spec = ctx.isvc.spec.rollout.canary
    why = no_room(ctx)
    if why is not None:
        refuse(ctx, config, why)
        return False
    await ensure(
        ctx.rt.kube,
        desired_deployment(
            ctx.isvc,
            config,
            ctx.rt.settings,
            track=CANARY,
            replicas=spec.replicas,
            strategy=strategy(ctx),
        ),
    )
    ctx.status.canary = CanaryRun(config=config, started_at=ctx.now, replicas=spec.replicas)
    message = f"canary {describe(config)} on {spec.replicas} replica(s) for {spec.window}"
    ctx.condition("Canary", "Unknown", "CanaryRunning", message)
    ctx.history("CanaryStarted", "Canary", message, config.config_hash)
    ctx.event("Normal", "CanaryStarted", message)
    ctx.rt.service(ctx.key).scrapers.pop(CANARY, None)
    return True


async def finish(ctx: Ctx, judgement: Judgement) -> ServingConfig | None:
    """Remove the canary Deployment; returns the config to promote (None on a rollback)."""
    run = ctx.status.canary
    assert run is not None
    await ctx.rt.kube.delete("Deployment", ctx.isvc.namespace, deployment_name(ctx.isvc, CANARY))
    ctx.status.canary = None
    ctx.rt.service(ctx.key).scrapers.pop(CANARY, None)
    config = run.config
    if judgement.verdict == "promote":
        message = f"{describe(config)} promoted: {judgement.message}"
        ctx.condition("Canary", "True", "CanaryPromoted", message)
        ctx.history("CanaryPromoted", judgement.reason, message, config.config_hash)
        ctx.event("Normal", "CanaryPromoted", message)
        return config
    live = ctx.status.live
    message = (
        f"{describe(config)} rolled back ({judgement.reason}): {judgement.message}; "
        f"live config {live.config_hash if live else None} kept"
    )
    ctx.condition("Canary", "False", "CanaryRolledBack", message)
    ctx.history("CanaryRolledBack", judgement.reason, message, config.config_hash)
    ctx.event("Warning", "CanaryRolledBack", message)
    return None


async def sync(ctx: Ctx) -> None:
    """Keep a running canary's Deployment as the spec says (replicas), or drop it when the user
    turned canaries off meanwhile (the live config then stays; the next retune rolls directly)."""
    run = ctx.status.canary
    if run is None:
        return
    spec = ctx.isvc.spec.rollout.canary
    if not spec.enabled:
        await ctx.rt.kube.delete(
            "Deployment", ctx.isvc.namespace, deployment_name(ctx.isvc, CANARY)
        )
        ctx.status.canary = None
        ctx.condition("Canary", "False", "CanaryCancelled", "canary turned off in the spec")
        return
    await ensure(
        ctx.rt.kube,
        desired_deployment(
            ctx.isvc,
            run.config,
            ctx.rt.settings,
            track=CANARY,
            replicas=spec.replicas,
            strategy=strategy(ctx),
        ),
    )
    ctx.status.canary = run.model_copy(update={"replicas": spec.replicas})
