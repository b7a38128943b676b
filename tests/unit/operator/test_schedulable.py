"""A full GPU pool: the scheduler's message as the Schedulable condition, the rollout strategies
the Deployment gets, and when Auto gives surging up."""

from __future__ import annotations

from typing import Any

from operator_samples import demo_doc, isvc_from

from infertune.operator.api import ServingConfig
from infertune.operator.builders import desired_deployment
from infertune.operator.builders.deployment import rollout_strategy
from infertune.operator.conditions import set_condition
from infertune.operator.pods import pod_summary
from infertune.operator.schedulable import (
    canary_fits,
    effective_strategy,
    schedulable_condition,
    stable_replicas,
    surge_stuck,
)
from infertune.operator.settings import OperatorSettings

FULL = "0/2 nodes are available: 2 Insufficient nvidia.com/gpu."


def pending(
    name: str, component: str = "serving", track: str = "stable", revision: str = "new"
) -> dict[str, Any]:
    return {"name": name, "component": component, "track": track, "node": None, "revision": revision,
            "unschedulable": FULL}  # fmt: skip


def running(name: str, track: str = "stable", revision: str = "old") -> dict[str, Any]:
    return {"name": name, "component": "serving", "track": track, "node": "n", "revision": revision}


def test_pod_summary_keeps_the_schedulers_message_only_while_the_pod_has_no_node() -> None:
    cond = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": FULL}
    body = {"metadata": {"name": "p", "labels": {"pod-template-hash": "abc"}},
            "spec": {}, "status": {"phase": "Pending", "conditions": [cond]}}  # fmt: skip
    s = pod_summary(body)
    assert s["unschedulable"] == FULL and s["revision"] == "abc"
    body["spec"]["nodeName"] = "n"  # bound since: the stale condition no longer counts
    assert "unschedulable" not in pod_summary(body)


def test_condition_carries_the_schedulers_message_for_tuning_and_serving_pods() -> None:
    verdict = schedulable_condition(
        [pending("svc-tune-1-x", "tuning"), pending("svc-a"), pending("svc-b"), running("svc-c")],
        None,
    )
    assert verdict is not None
    status, reason, message = verdict
    assert (status, reason) == ("False", "Unschedulable")
    assert f"1 tuning pod(s) (svc-tune-1-x) cannot be scheduled: {FULL}" in message
    assert f"2 serving pod(s) (svc-a, svc-b) cannot be scheduled: {FULL}" in message


def test_condition_clears_only_after_it_was_false() -> None:
    assert schedulable_condition([running("a")], None) is None  # never said anything: stays quiet
    shown = set_condition([], "Schedulable", "False", "Unschedulable", FULL, now="t")[0]
    assert schedulable_condition([running("a")], shown) == (
        "True",
        "Scheduled",
        "every pod is scheduled",
    )
    cleared = set_condition([], "Schedulable", "True", "Scheduled", "x", now="t")[0]
    assert schedulable_condition([running("a")], cleared) is None


def test_strategies() -> None:
    assert rollout_strategy("Surge")["rollingUpdate"] == {"maxUnavailable": 0, "maxSurge": 1}
    assert rollout_strategy("ReplaceInPlace")["rollingUpdate"] == {
        "maxUnavailable": 1,
        "maxSurge": 0,
    }
    assert effective_strategy("Auto", None) == "Surge"
    assert effective_strategy("Auto", "ReplaceInPlace") == "ReplaceInPlace"
    assert effective_strategy("Surge", "ReplaceInPlace") == "Surge"
    assert effective_strategy("ReplaceInPlace", None) == "ReplaceInPlace"


def test_deployment_follows_the_spec_strategy_unless_told_what_auto_resolved_to(
    config: ServingConfig, settings: OperatorSettings
) -> None:
    for wanted, surge in (("Auto", 1), ("Surge", 1), ("ReplaceInPlace", 0)):
        isvc = isvc_from(demo_doc(rollout__strategy=wanted))
        dep = desired_deployment(isvc, config, settings)
        assert dep["spec"]["strategy"]["rollingUpdate"]["maxSurge"] == surge, wanted
    dep = desired_deployment(isvc_from(demo_doc()), config, settings, strategy="ReplaceInPlace")
    assert dep["spec"]["strategy"]["rollingUpdate"]["maxSurge"] == 0


def test_auto_gives_surging_up_only_for_a_stuck_surge_or_canary_pod() -> None:
    surge = pending("svc-new")
    assert surge_stuck([running("svc-old"), surge]) == surge
    # No pods of another template: a scale-up that does not fit; replacing in place frees nothing.
    assert surge_stuck([surge, running("svc-other", revision="new")]) is None
    assert surge_stuck([running("svc-old"), pending("svc-tune", "tuning")]) is None
    canary = pending("svc-canary-x", track="canary")
    assert surge_stuck([running("svc-old", revision="new"), canary]) == canary


def test_a_canary_in_place_takes_stable_slots_or_is_refused() -> None:
    assert canary_fits("Surge", 1, 1)
    assert canary_fits("ReplaceInPlace", 3, 1)
    assert not canary_fits("ReplaceInPlace", 1, 1)
    assert stable_replicas("ReplaceInPlace", 3, 1) == 2
    assert stable_replicas("ReplaceInPlace", 3, None) == 3
    assert stable_replicas("Surge", 3, 1) == 3
