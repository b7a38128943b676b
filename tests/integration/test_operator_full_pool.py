"""A full GPU pool on the real API server: a tuning or serving pod the scheduler cannot place is
reported on the InferenceService (Schedulable=False and a Warning event, both with the scheduler's
own message), and a new pod template rolls out with no spare GPU, replacing pods in place (asked
for, or chosen by Auto after its surge pod could not be placed).

The session's fake nodes: gpu-h100-0 has one GPU, gpu-a100-0 two; specs pin one of them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from operator_harness import OperatorProcess, wait_for
from test_operator_flow import LABEL, apply, condition, demo, isvc, wait_phase

pytestmark = pytest.mark.cluster
H100, A100 = "NVIDIA-H100-80GB-HBM3", "NVIDIA-A100-SXM4-80GB"


def _doc(name: str, product: str, gpus: int, replicas: int, **rollout: Any) -> dict[str, Any]:
    return demo(
        name,
        hardware={"gpuProducts": [product], "gpusPerReplica": gpus, "cpu": "1", "memory": "2Gi"},
        rollout={"replicas": replicas, **rollout},
        retune={"enabled": False},
    )


def _pods(api: Any, namespace: str, selector: str) -> list[Any]:
    return list(client.CoreV1Api(api).list_namespaced_pod(namespace, label_selector=selector).items)


def _scheduler_message(pod: Any) -> str | None:
    cond = next((c for c in pod.status.conditions or [] if c.type == "PodScheduled"), None)
    return cond.message if cond is not None and cond.status == "False" else None


def _unschedulable_pod(api: Any, namespace: str, selector: str) -> tuple[str, str]:
    def stuck() -> tuple[str, str] | None:
        for pod in _pods(api, namespace, selector):
            message = _scheduler_message(pod)
            if message and not pod.spec.node_name:
                return pod.metadata.name, message
        return None

    found: tuple[str, str] = wait_for(stuck, f"unschedulable pod ({selector})", timeout=90)
    return found


def _reported(api: Any, namespace: str, name: str, op: OperatorProcess, message: str) -> None:
    """Schedulable=False and a Warning event on the InferenceService, both quoting `message`."""

    def shown() -> dict[str, Any] | None:
        cond = condition(isvc(api, namespace, name), "Schedulable")
        return cond if cond.get("status") == "False" and message in cond["message"] else None

    try:
        cond = wait_for(shown, f"{name} Schedulable=False", timeout=60, every=1.0)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{isvc(api, namespace, name).get('status')}\n{op.log()[-3000:]}") from None  # fmt: skip
    assert cond["reason"] == "Unschedulable"

    def event() -> list[Any]:
        events = client.CoreV1Api(api).list_namespaced_event(
            namespace, field_selector=f"involvedObject.name={name}"
        )
        return [
            e
            for e in events.items
            if e.type == "Warning" and e.reason == "Unschedulable" and message in e.message
        ]

    wait_for(event, f"{name} Unschedulable event", timeout=30)


def _release(api: Any, namespace: str, name: str) -> None:
    """Delete the object and wait for its pods to go, so the next test finds the GPUs free."""
    client.CustomObjectsApi(api).delete_namespaced_custom_object(
        "infertune.dev", "v1alpha1", namespace, "inferenceservices", name
    )
    wait_for(
        lambda: not _pods(api, namespace, f"{LABEL}={name}"), f"{name}'s pods gone", timeout=90
    )


def test_unschedulable_tuning_pod_is_reported_with_the_schedulers_message(
    cluster: Any, api: Any, namespace: str, operator: OperatorProcess, tmp_path: Path
) -> None:
    apply(cluster, namespace, _doc("too-big", H100, gpus=2, replicas=1), tmp_path)
    pod, message = _unschedulable_pod(
        api, namespace, f"{LABEL}=too-big,app.kubernetes.io/component=tuning"
    )
    assert "Insufficient nvidia.com/gpu" in message
    _reported(api, namespace, "too-big", operator, message)
    cond = condition(isvc(api, namespace, "too-big"), "Schedulable")
    assert "tuning pod(s)" in cond["message"] and pod in cond["message"]
    _release(api, namespace, "too-big")


def test_unschedulable_serving_pod_is_reported_and_cleared_when_it_fits(
    cluster: Any, api: Any, namespace: str, operator: OperatorProcess, tmp_path: Path
) -> None:
    # Two replicas of one GPU each on the one-GPU node: the tuning pod fits, one serving pod not.
    apply(cluster, namespace, _doc("one-short", H100, gpus=1, replicas=2), tmp_path)
    serving = f"{LABEL}=one-short,app.kubernetes.io/component=serving"
    _, message = _unschedulable_pod(api, namespace, serving)
    assert message.startswith("0/4 nodes are available:") and "1 Insufficient nvidia.com/gpu" in message  # fmt: skip
    _reported(api, namespace, "one-short", operator, message)
    assert "serving pod(s)" in condition(isvc(api, namespace, "one-short"), "Schedulable")["message"]  # fmt: skip

    # Down to one replica: every pod placed, the condition says so.
    doc = _doc("one-short", H100, gpus=1, replicas=1)
    apply(cluster, namespace, doc, tmp_path)
    wait_for(
        lambda: condition(isvc(api, namespace, "one-short"), "Schedulable").get("status") == "True",
        "Schedulable=True",
        timeout=60,
    )
    _release(api, namespace, "one-short")


def _rolled(api: Any, namespace: str, name: str, memory: str, replicas: int) -> bool:
    dep = client.AppsV1Api(api).read_namespaced_deployment(name, namespace)
    st = dep.status
    return (
        dep.spec.template.spec.containers[0].resources.requests["memory"] == memory
        and (st.observed_generation or 0) >= dep.metadata.generation
        and st.updated_replicas == replicas
        and st.available_replicas == replicas
        and st.replicas == replicas
    )


def test_a_new_pod_template_rolls_out_in_place_with_no_spare_gpu(
    cluster: Any, api: Any, namespace: str, operator: OperatorProcess, tmp_path: Path
) -> None:
    # Every GPU of each node serves: no room for a surge pod. One asks for ReplaceInPlace, the
    # other leaves the strategy to Auto, which has to find out.
    cases = {
        "in-place": (H100, 1, {"strategy": "ReplaceInPlace"}),
        "auto": (A100, 2, {}),
    }
    for name, (product, replicas, rollout) in cases.items():
        apply(cluster, namespace, _doc(name, product, 1, replicas, **rollout), tmp_path)
    for name in cases:
        wait_phase(api, namespace, name, ("Serving", "Degraded"), operator)
    dep = client.AppsV1Api(api).read_namespaced_deployment("in-place", namespace)
    assert (dep.spec.strategy.rolling_update.max_surge, dep.spec.strategy.rolling_update.max_unavailable) == (0, 1)  # fmt: skip

    # A pod template change (more memory): each Deployment rolls at once.
    for name, (product, replicas, rollout) in cases.items():
        doc = _doc(name, product, 1, replicas, **rollout)
        doc["spec"]["hardware"]["memory"] = "3Gi"
        apply(cluster, namespace, doc, tmp_path)
    for name, (_, replicas, _) in cases.items():
        try:
            wait_for(
                lambda n=name, r=replicas: _rolled(api, namespace, n, "3Gi", r),  # type: ignore[misc]
                f"{name} rolled out",
                timeout=180,
                every=1.0,
            )
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{isvc(api, namespace, name).get('status')}\n{operator.log()[-3000:]}") from None  # fmt: skip
    auto = isvc(api, namespace, "auto")["status"]
    assert auto["rolloutStrategy"] == "ReplaceInPlace"
    assert "ReplaceInPlace" in [h["event"] for h in auto["history"]]

    # Auto's surge pod was reported as it waited; once replaced in place every serving pod is
    # placed. (More memory is a hardware change, so a retune's tuning pod now waits for a GPU the
    # serving pods hold: that one stays reported.)
    def serving_placed() -> bool:
        cond = condition(isvc(api, namespace, "auto"), "Schedulable")
        return cond.get("status") == "True" or "serving pod" not in cond.get("message", "")

    try:
        wait_for(serving_placed, "auto's serving pods all placed", timeout=60)
    except AssertionError as exc:
        pods = [(p.metadata.name, p.spec.node_name, p.status.phase) for p in _pods(api, namespace, f"{LABEL}=auto")]  # fmt: skip
        raise AssertionError(f"{exc}\n{isvc(api, namespace, 'auto').get('status')}\n{pods}\n{operator.log()[-4000:]}") from None  # fmt: skip
    for name in cases:
        _release(api, namespace, name)
