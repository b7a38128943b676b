"""Reactions to the InferenceService's own events: a new or changed spec (retune only when the
tuning-relevant part changed, else keep serving), its first sighting, and an invalid spec."""

from __future__ import annotations

from typing import Any

import kopf

from infertune.operator import canary
from infertune.operator.context import InvalidSpecError, commit, load
from infertune.operator.hashing import tuning_hash
from infertune.operator.rollout import ensure_serving
from infertune.operator.runtime import Runtime
from infertune.operator.tuning_run import start_run


async def invalid_spec(err: InvalidSpecError) -> None:
    ctx = err.ctx
    ctx.condition("Ready", "False", "InvalidSpec", str(err))
    ctx.event("Warning", "InvalidSpec", str(err))
    await commit(ctx)
    raise kopf.PermanentError(f"invalid spec: {err}")


async def on_spec(rt: Runtime, body: Any, trigger: str) -> None:
    """Create/update/resume: retune only when the tuning-relevant part changed; else keep serving."""
    try:
        ctx = load(rt, body)
    except InvalidSpecError as err:
        rt.metrics.reconciles.labels(trigger, "invalid").inc()
        await invalid_spec(err)
        return
    spec_hash = tuning_hash(ctx.isvc.spec)
    run = ctx.status.tuning
    if run is None or run.spec_hash != spec_hash:
        reason = "Created" if run is None else "SpecChanged"
        await start_run(ctx, reason, ctx.isvc.spec.tuning_spec())
    await canary.sync(ctx)  # first: a canary turned off gives its slots back to the stable pods
    if ctx.status.live is not None:
        await ensure_serving(ctx, ctx.status.live)
    await commit(ctx)
    rt.metrics.reconciles.labels(trigger, "ok").inc()


async def on_first_sight(rt: Runtime, body: Any) -> None:
    """A valid object never handled before: start its tuning run now (see handlers.first_sight).
    Invalid specs are left to the create handler, which reports them once."""
    try:
        load(rt, body)
    except InvalidSpecError:
        return
    await on_spec(rt, body, "FirstSight")


__all__ = ["invalid_spec", "on_first_sight", "on_spec"]
