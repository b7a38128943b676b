"""Pure: pods the scheduler cannot place, as the InferenceService's Schedulable condition, and
what `spec.rollout.strategy` resolves to (Auto surges until a surge or canary pod cannot be placed).

Pods are the operator's pod summaries (pods.pod_summary): `unschedulable` holds the scheduler's
own message (the pod's PodScheduled=False condition) while the pod has no node."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Literal

from infertune.operator.api import Condition, RolloutStrategy

Strategy = Literal["Surge", "ReplaceInPlace"]
Verdict = tuple[str, str, str]  # (status, reason, message) of the Schedulable condition


def unschedulable(pods: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Pods still waiting for a node that the scheduler said it cannot place."""
    return [p for p in pods if p.get("unschedulable") and not p.get("node")]


def role(pod: dict[str, Any]) -> str:
    """'tuning', 'serving' or 'canary serving': what the pod is for, in messages."""
    if pod.get("component") == "tuning":
        return "tuning"
    track = pod.get("track") or "stable"
    return "serving" if track == "stable" else f"{track} serving"


def schedulable_condition(
    pods: Iterable[dict[str, Any]], shown: Condition | None
) -> Verdict | None:
    """Schedulable=False with the scheduler's message while a pod cannot be placed; True once
    they all are, but only after a False (an object whose pods always scheduled says nothing)."""
    stuck = unschedulable(pods)
    if stuck:
        groups: dict[tuple[str, str], list[str]] = {}
        for pod in sorted(stuck, key=lambda p: str(p.get("name"))):
            groups.setdefault((role(pod), str(pod["unschedulable"])), []).append(str(pod["name"]))
        message = "; ".join(
            f"{len(names)} {kind} pod(s) ({', '.join(names)}) cannot be scheduled: {why}"
            for (kind, why), names in groups.items()
        )
        return "False", "Unschedulable", message
    if shown is not None and shown.status == "False":
        return "True", "Scheduled", "every pod is scheduled"
    return None


def effective_strategy(wanted: RolloutStrategy, resolved: Strategy | None) -> Strategy:
    """The strategy the Deployment uses: Auto surges until it resolved to ReplaceInPlace."""
    if wanted == "Auto":
        return resolved or "Surge"
    return wanted


def surge_stuck(pods: Iterable[dict[str, Any]]) -> dict[str, Any] | None:
    """A pod Auto gives surging up for, that cannot be scheduled: a canary pod, or a stable
    serving pod of a new pod template while pods of another template still hold their GPUs."""
    serving = [p for p in pods if p.get("component") == "serving"]
    for pod in unschedulable(serving):
        if (pod.get("track") or "stable") != "stable":
            return pod
        if any(
            (p.get("track") or "stable") == "stable"
            and p.get("revision") != pod.get("revision")
            and not p.get("terminated")
            for p in serving
        ):
            return pod
    return None


def canary_fits(strategy: Strategy, replicas: int, canary_replicas: int) -> bool:
    """Surging, a canary gets pods of its own; replacing in place it takes stable replicas' slots,
    and at least one stable replica must stay."""
    return strategy == "Surge" or replicas > canary_replicas


def stable_replicas(strategy: Strategy, replicas: int, canary_replicas: int | None) -> int:
    """The stable Deployment's replicas: fewer by the canary's while it runs in place."""
    if strategy == "ReplaceInPlace" and canary_replicas:
        return max(replicas - canary_replicas, 0)
    return replicas


__all__ = [
    "Strategy",
    "canary_fits",
    "effective_strategy",
    "schedulable_condition",
    "stable_replicas",
    "surge_stuck",
    "unschedulable",
]
