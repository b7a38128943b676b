"""Serving a config: replace the live one (directly or through a canary), keep the Deployment and
Service as the live config says, and record the stable Deployment's progress as RolledOut."""

from __future__ import annotations

from typing import Any

from infertune.operator import canary
from infertune.operator.api import ServingConfig
from infertune.operator.builders import desired_deployment, desired_service
from infertune.operator.builders.common import ANN_CONFIG
from infertune.operator.builders.deployment import deployment_name
from infertune.operator.conditions import get_condition
from infertune.operator.context import Ctx, commit, load_owner
from infertune.operator.drift import RetuneTimers
from infertune.operator.reconcile import ensure
from infertune.operator.runtime import Runtime
from infertune.operator.schedulable import effective_strategy, stable_replicas


def describe(config: ServingConfig) -> str:
    """The config and what the tuner measured for it, for conditions, events and the history."""
    return config.describe(figures=True)


async def replace_live(ctx: Ctx, config: ServingConfig) -> None:
    """A new winner: straight to the stable Deployment, or first as a canary beside the live
    config when the spec asks for one (the keep-checking loop then promotes or rolls it back)."""
    live = ctx.status.live
    wants_canary = ctx.isvc.spec.rollout.canary.enabled
    if live is not None and wants_canary and live.config_hash != config.config_hash:
        if await canary.start(ctx, config):
            await ensure_serving(ctx, live)  # in place: the canary takes stable replicas' slots
        return
    if ctx.status.canary is not None:  # superseded by a direct rollout
        await ctx.rt.kube.delete(
            "Deployment", ctx.isvc.namespace, deployment_name(ctx.isvc, canary.CANARY)
        )
        ctx.status.canary = None
    await roll_out(ctx, config)


async def roll_out(ctx: Ctx, config: ServingConfig) -> None:
    """Serve `config`: the Deployment (config hash on the pod template) and the Service."""
    if ctx.status.live is None or ctx.status.live.config_hash != config.config_hash:
        ctx.status.rollout_strategy = None  # Auto surges again for a new config
    ctx.status.live = config
    verb = await ensure_serving(ctx, config)
    if verb != "unchanged":
        message = f"rolling out {describe(config)} (config {config.config_hash})"
        ctx.condition("RolledOut", "Unknown", "RollingOut", message)
        ctx.history(
            "RollingOut",
            (ctx.status.tuning.reason or "") if ctx.status.tuning else "",
            message,
            config.config_hash,
        )
        ctx.event("Normal", "RollingOut", message)
        # Old observations describe the old config.
        ctx.rt.service(ctx.key).timers = RetuneTimers()


async def ensure_serving(ctx: Ctx, config: ServingConfig) -> str:
    """The stable Deployment with the strategy Auto resolved to, fewer replicas while a canary
    runs in their place, and the Service."""
    kube, settings, st = ctx.rt.kube, ctx.rt.settings, ctx.status
    rollout = ctx.isvc.spec.rollout
    strategy = effective_strategy(rollout.strategy, st.rollout_strategy)
    replicas = stable_replicas(
        strategy, rollout.replicas, st.canary.replicas if st.canary else None
    )
    desired = desired_deployment(ctx.isvc, config, settings, replicas=replicas, strategy=strategy)
    verb = await ensure(kube, desired)
    await ensure(kube, desired_service(ctx.isvc, settings))
    return verb


def deployment_state(dep: dict[str, Any]) -> tuple[str, str, str]:
    """(status, reason, message) for RolledOut from a Deployment's status."""
    spec, st = dep.get("spec") or {}, dep.get("status") or {}
    want = int(spec.get("replicas", 1))
    updated = int(st.get("updatedReplicas", 0))
    available = int(st.get("availableReplicas", 0))
    current_gen = int(st.get("observedGeneration", 0)) >= int(dep["metadata"].get("generation", 0))
    conds = {c.get("type"): c for c in st.get("conditions") or []}
    progressing = conds.get("Progressing") or {}
    if progressing.get("reason") == "ProgressDeadlineExceeded":
        return "False", "ProgressDeadlineExceeded", str(progressing.get("message", ""))
    total = int(st.get("replicas", 0))
    if current_gen and updated >= want and available >= want and total <= want:
        return "True", "Available", f"{available}/{want} replicas available"
    return "Unknown", "RollingOut", f"{updated}/{want} replicas updated, {available} available"


async def on_deployment(rt: Runtime, dep: dict[str, Any]) -> None:
    """The stable Deployment changed: record its state as RolledOut (canaries are judged apart)."""
    meta = dep["metadata"]
    labels = meta.get("labels") or {}
    if labels.get("infertune.dev/track", "stable") != "stable":
        return
    ctx = await load_owner(rt, meta["namespace"], labels["infertune.dev/inferenceservice"])
    if ctx is None:
        return
    live = ctx.status.live
    if live is None or meta["name"] != deployment_name(ctx.isvc, "stable"):
        return
    if (meta.get("annotations") or {}).get(ANN_CONFIG) != live.config_hash:
        return  # an event about the previous config's template; the next one will tell
    status, reason, message = deployment_state(dep)
    old = get_condition(ctx.status.conditions, "RolledOut")
    ctx.condition("RolledOut", status, reason, f"{message}; config {live.config_hash}")
    if status == "True" and (old is None or old.status != "True"):
        ctx.history("RolledOut", "Available", message, live.config_hash)
        ctx.event("Normal", "RolledOut", f"Deployment {meta['name']} available: {message}")
    await commit(ctx)


__all__ = [
    "deployment_state",
    "describe",
    "ensure_serving",
    "on_deployment",
    "replace_live",
    "roll_out",
]
