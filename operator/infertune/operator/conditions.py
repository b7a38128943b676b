"""Pure status helpers: conditions that move lastTransitionTime only on change, Ready and phase."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime

from infertune.operator.api import CONDITION_TYPES, Condition, HistoryEntry, InferenceServiceStatus

HISTORY_LIMIT = 20


def now_iso(at: datetime | None = None) -> str:
    moment = at or datetime.now(UTC)
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_iso(text: str | None) -> datetime | None:
    if not text:
        return None
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)


def get_condition(conditions: Iterable[Condition], type_: str) -> Condition | None:
    return next((c for c in conditions if c.type == type_), None)


def set_condition(
    conditions: list[Condition],
    type_: str,
    status: str,
    reason: str,
    message: str = "",
    *,
    now: str,
    generation: int | None = None,
) -> list[Condition]:
    """A new list with `type_` set; lastTransitionTime kept unless the status flips."""
    old = get_condition(conditions, type_)
    since = old.last_transition_time if old is not None and old.status == status else now
    new = Condition.model_validate(
        {
            "type": type_,
            "status": status,
            "reason": reason,
            "message": message[:32768],
            "last_transition_time": since,
            "observed_generation": generation,
        }
    )
    out = [c for c in conditions if c.type != type_] + [new]
    order = {t: i for i, t in enumerate(CONDITION_TYPES)}
    return sorted(out, key=lambda c: (order.get(c.type, len(order)), c.type))


def derive_ready(
    conditions: list[Condition], *, now: str, generation: int | None
) -> list[Condition]:
    """Ready = tuned and rolled out. Invalid specs keep the Ready=False they were given."""
    ready = get_condition(conditions, "Ready")
    if (
        ready is not None
        and ready.reason == "InvalidSpec"
        and ready.observed_generation == generation
    ):
        return conditions
    tuned = get_condition(conditions, "Tuned")
    rolled = get_condition(conditions, "RolledOut")
    if rolled is not None and rolled.status == "True":
        return set_condition(
            conditions, "Ready", "True", "Serving", rolled.message, now=now, generation=generation
        )
    for cond in (rolled, tuned):
        if cond is not None and cond.status == "False":
            return set_condition(
                conditions,
                "Ready",
                "False",
                cond.reason,
                cond.message,
                now=now,
                generation=generation,
            )
    waiting = rolled if rolled is not None else tuned
    reason = waiting.reason if waiting is not None else "Pending"
    message = waiting.message if waiting is not None else "waiting for the first reconcile"
    return set_condition(
        conditions, "Ready", "Unknown", reason, message, now=now, generation=generation
    )


def derive_phase(status: InferenceServiceStatus) -> str:
    """One word for `kubectl get`, derived from the conditions (never a state machine of its own)."""
    conds = status.conditions
    ready = get_condition(conds, "Ready")
    tuned = get_condition(conds, "Tuned")
    rolled = get_condition(conds, "RolledOut")
    slo = get_condition(conds, "SLOMet")
    if ready is not None and ready.reason == "InvalidSpec":
        return "Invalid"
    tuning_now = tuned is not None and tuned.status == "Unknown" and tuned.reason == "Tuning"
    serving = rolled is not None and rolled.status == "True"
    if tuning_now:
        return "Retuning" if status.live is not None else "Tuning"
    failed_run = ("TuningFailed", "ModelFetchFailed")
    if tuned is not None and tuned.status == "False" and tuned.reason in failed_run:
        return "Failed" if not serving else "Degraded"
    if serving:
        if slo is not None and slo.status == "False":
            return "Degraded"
        return "Serving"
    if rolled is not None and rolled.status == "False" and rolled.reason != "RollingOut":
        return "Failed"
    if tuned is not None and tuned.status != "Unknown":
        return "RollingOut"
    return "Pending"


def add_history(
    history: list[HistoryEntry],
    event: str,
    reason: str,
    message: str = "",
    *,
    now: str,
    config_hash: str | None = None,
) -> list[HistoryEntry]:
    entry = HistoryEntry(
        time=now, event=event, reason=reason, message=message[:1000], config_hash=config_hash
    )
    return [*history, entry][-HISTORY_LIMIT:]
