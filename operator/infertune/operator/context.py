"""One InferenceService being handled: the parsed object, the status as read (the baseline) and
the working copy; `commit` writes only the difference, conditionally on the resourceVersion."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import kopf
from pydantic import ValidationError

from infertune.operator.api import API_VERSION, KIND, InferenceService, InferenceServiceStatus
from infertune.operator.conditions import (
    add_history,
    derive_phase,
    derive_ready,
    now_iso,
    set_condition,
)
from infertune.operator.reconcile import merge_patch
from infertune.operator.runtime import Key, Runtime
from infertune.operator.validation import name_problems, parse_spec, storage_problems

log = logging.getLogger("infertune.operator")


def load_status(raw: Any) -> InferenceServiceStatus:
    try:
        return InferenceServiceStatus.model_validate(raw or {})
    except ValidationError:
        log.warning("status does not match the current schema; starting from an empty status")
        return InferenceServiceStatus()


@dataclass
class Ctx:
    rt: Runtime
    body: dict[str, Any]
    isvc: InferenceService
    baseline: InferenceServiceStatus
    status: InferenceServiceStatus
    now: str = field(default_factory=now_iso)
    events: list[tuple[str, str, str]] = field(default_factory=list)

    @property
    def key(self) -> Key:
        return (self.isvc.namespace, self.isvc.name)

    @property
    def generation(self) -> int | None:
        gen = self.isvc.metadata.get("generation")
        return int(gen) if gen is not None else None

    def condition(self, type_: str, status: str, reason: str, message: str = "") -> None:
        self.status.conditions = set_condition(
            self.status.conditions,
            type_,
            status,
            reason,
            message,
            now=self.now,
            generation=self.generation,
        )

    def history(
        self, event: str, reason: str, message: str = "", config_hash: str | None = None
    ) -> None:
        self.status.history = add_history(
            self.status.history, event, reason, message, now=self.now, config_hash=config_hash
        )

    def event(self, type_: str, reason: str, message: str) -> None:
        self.events.append((type_, reason, message))

    def event_target(self) -> dict[str, Any]:
        meta = self.isvc.metadata
        return {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "metadata": {k: meta[k] for k in ("name", "namespace", "uid") if k in meta},
        }


def load(rt: Runtime, body: Any) -> Ctx:
    """Parse the body once at the handler edge; InvalidSpec carries every problem."""
    raw = dict(body)
    meta = dict(raw.get("metadata") or {})
    status = load_status(raw.get("status"))
    spec_raw = raw.get("spec")
    problems = name_problems(meta.get("name"))
    spec = None
    try:
        spec = parse_spec(spec_raw)
        problems += storage_problems(spec, rt.settings.storage_secret_ref is not None)
    except ValueError as exc:
        problems.append(str(exc))
    if problems or spec is None:
        ctx = Ctx(
            rt,
            raw,
            InferenceService.model_construct(metadata=meta),  # type: ignore[call-arg]
            status,
            status.model_copy(deep=True),
        )
        raise InvalidSpecError(ctx, "; ".join(problems))
    isvc = InferenceService.model_validate(
        {"apiVersion": API_VERSION, "kind": KIND, "metadata": meta, "spec": spec}
    )
    return Ctx(rt, raw, isvc, status, status.model_copy(deep=True))


class InvalidSpecError(Exception):
    def __init__(self, ctx: Ctx, message: str) -> None:
        super().__init__(message)
        self.ctx = ctx


async def load_owner(rt: Runtime, namespace: str, name: str) -> Ctx | None:
    """The InferenceService a child's event (or a timer) is about, read fresh; None when it is gone
    or its spec is invalid (the spec handlers report that, once)."""
    body = await rt.kube.get("InferenceService", namespace, name)
    if body is None:
        return None
    try:
        return load(rt, body)
    except InvalidSpecError:
        return None


async def commit(ctx: Ctx) -> bool:
    """Derive Ready/phase, write the status difference (if any), post the queued events."""
    st = ctx.status
    st.observed_generation = ctx.generation
    st.conditions = derive_ready(st.conditions, now=ctx.now, generation=ctx.generation)
    st.phase = derive_phase(st)
    patch = merge_patch(ctx.baseline.to_wire(), st.to_wire())
    wrote = False
    if patch:
        rv = (ctx.body.get("metadata") or {}).get("resourceVersion")
        result = await ctx.rt.kube.patch_status(ctx.isvc.namespace, ctx.isvc.name, patch, rv)
        ctx.body = result or ctx.body
        ctx.baseline = st.model_copy(deep=True)
        wrote = True
    target = kopf.Body(ctx.event_target())  # type: ignore[arg-type]
    for type_, reason, message in ctx.events:
        # kopf.event posts whatever the posting level (which is set to keep kopf's chatter out).
        kopf.event(target, type=type_, reason=reason, message=message[:1024])
    ctx.events.clear()
    return wrote
