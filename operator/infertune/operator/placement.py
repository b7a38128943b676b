"""Pods the scheduler cannot place (called by the keep-checking timer with the pod index): the
Schedulable condition and a Warning event with the scheduler's own message, for tuning and serving
pods alike; and Auto's switch to replacing pods in place when a surge or canary pod is stuck."""

from __future__ import annotations

from typing import Any

from infertune.operator import canary, model_fetch
from infertune.operator.builders.deployment import deployment_name
from infertune.operator.conditions import get_condition
from infertune.operator.context import Ctx, InvalidSpecError, commit, load, log
from infertune.operator.rollout import ensure_serving
from infertune.operator.runtime import Runtime
from infertune.operator.schedulable import role, schedulable_condition, surge_stuck


def _report(ctx: Ctx, pods: list[dict[str, Any]]) -> bool:
    shown = get_condition(ctx.status.conditions, "Schedulable")
    verdict = schedulable_condition(pods, shown)
    if verdict is None or (
        shown is not None and (shown.status, shown.reason, shown.message) == verdict
    ):
        return False
    status, reason, message = verdict
    ctx.condition("Schedulable", status, reason, message)
    if status == "False":
        log.warning("%s/%s: %s", *ctx.key, message)
        ctx.event("Warning", reason, message)
    else:
        ctx.event("Normal", reason, message)
    return True


def _report_oom(ctx: Ctx, pods: list[dict[str, Any]]) -> bool:
    """MemoryFits=False/OOMKilled with a Warning event while a pod's container was killed by the
    kernel at its memory limit (spec.hardware.memory is too small for the configuration)."""
    killed = [p for p in pods if p.get("oom_killed")]
    shown = get_condition(ctx.status.conditions, "MemoryFits")
    if not killed:
        if shown is None or shown.status == "True":
            return False
        ctx.condition("MemoryFits", "True", "NoOOMKill", "no container is being OOM-killed")
        return True
    pod = killed[0]
    oom = pod["oom_killed"]
    message = (
        f"{role(pod)} pod {pod.get('name')}: container {oom.get('container')} was OOMKilled at "
        f"its memory limit (spec.hardware.memory {ctx.isvc.spec.hardware.memory}; "
        f"{oom.get('restarts')} restarts)"
    )
    if shown is not None and (shown.status, shown.reason, shown.message) == (
        "False",
        "OOMKilled",
        message,
    ):
        return False
    ctx.condition("MemoryFits", "False", "OOMKilled", message)
    log.warning("%s/%s: %s", *ctx.key, message)
    ctx.event("Warning", "OOMKilled", message)
    return True


async def _stop_surging(ctx: Ctx, pods: list[dict[str, Any]]) -> bool:
    """Auto: a surge or canary pod the scheduler cannot place means no spare GPU; replace pods in
    place from now on (until a new config rolls out, which tries surging again)."""
    st = ctx.status
    if ctx.isvc.spec.rollout.strategy != "Auto" or st.rollout_strategy == "ReplaceInPlace":
        return False
    if st.live is None:
        return False
    stuck = surge_stuck(pods)
    if stuck is None:
        return False
    st.rollout_strategy = "ReplaceInPlace"
    message = (
        f"no free GPU for {role(stuck)} pod {stuck.get('name')} ({stuck.get('unschedulable')}): "
        "replacing pods in place (maxSurge 0, maxUnavailable 1)"
    )
    ctx.history("ReplaceInPlace", "Auto", message, st.live.config_hash)
    ctx.event("Normal", "ReplaceInPlace", message)
    run = st.canary
    if run is not None:
        why = canary.no_room(ctx)
        if why is not None:
            await ctx.rt.kube.delete(
                "Deployment", ctx.isvc.namespace, deployment_name(ctx.isvc, canary.CANARY)
            )
            st.canary = None
            canary.refuse(ctx, run.config, why)
    await ensure_serving(ctx, st.live)
    return True


async def check(rt: Runtime, body: Any, pods: list[dict[str, Any]]) -> bool:
    """True when the status was written (the timer's body is stale then)."""
    try:
        ctx = load(rt, body)
    except InvalidSpecError:
        return False
    changed = _report(ctx, pods)
    changed = _report_oom(ctx, pods) or changed
    changed = model_fetch.report_serving(ctx, pods) or changed  # a serving pod's hf:// fetch
    changed = await _stop_surging(ctx, pods) or changed
    return await commit(ctx) if changed else False


__all__ = ["check"]
