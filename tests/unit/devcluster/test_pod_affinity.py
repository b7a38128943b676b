"""The node agent's scheduler honours inter-pod affinity as kube-scheduler does: the parallel
tuning workers' required affinity to one GPU product and preferred spread over nodes."""

from __future__ import annotations

from typing import Any

from scheduling import choose_node


def node(name: str, product: str, gpus: int = 2) -> dict[str, Any]:
    labels = {"kubernetes.io/hostname": name, "nvidia.com/gpu.product": product}
    cap = {"cpu": "16", "memory": "64Gi", "pods": "110", "nvidia.com/gpu": str(gpus)}
    return {
        "metadata": {"name": name, "labels": labels},
        "spec": {},
        "status": {"allocatable": cap},
    }


RUN = {"infertune.dev/run": "abc", "infertune.dev/inferenceservice": "svc"}
SELECTOR = {"matchLabels": RUN}
AFFINITY = {
    "podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 100, "podAffinityTerm": {"labelSelector": SELECTOR, "topologyKey": "kubernetes.io/hostname"}}]},
    "podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": SELECTOR, "topologyKey": "nvidia.com/gpu.product"}]},
}  # fmt: skip


def worker(uid: str, on: str = "", labels: dict[str, str] | None = None) -> dict[str, Any]:
    container = {"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}
    return {
        "metadata": {"name": uid, "uid": uid, "namespace": "ns", "labels": labels or RUN},
        "spec": {"containers": [container], "nodeName": on, "affinity": AFFINITY},
        "status": {"phase": "Running"},
    }


def test_workers_spread_over_nodes_before_sharing_one() -> None:
    # l4-b already runs an unrelated pod, so "least loaded" alone would pick l4-a again.
    nodes = [node("l4-a", "L4"), node("l4-b", "L4")]
    busy = [worker("w0", on="l4-a"), worker("other", on="l4-b", labels={"app": "x"})]
    chosen, _ = choose_node(worker("w1"), nodes, busy)
    assert chosen is not None and chosen["metadata"]["name"] == "l4-b"
    # With every node holding one, a worker still fits beside another (its own GPU).
    chosen, _ = choose_node(worker("w2"), nodes, [*busy, worker("w1", on="l4-b")])
    assert chosen is not None


def test_workers_stay_on_the_first_workers_gpu_product() -> None:
    nodes = [
        node("h100", "H100", gpus=1),
        node("a100", "A100", gpus=1),
        node("a100-2", "A100", gpus=1),
    ]
    first, _ = choose_node(worker("w0"), nodes, [])  # no worker yet: any product
    assert first is not None and first["metadata"]["name"] == "a100"
    # a100's one GPU is taken: the next worker goes to the other A100, never to the H100.
    chosen, why = choose_node(worker("w1"), nodes, [worker("w0", on="a100")])
    assert chosen is not None and chosen["metadata"]["name"] == "a100-2"
    # The only free GPU is an H100: the second worker waits rather than mixing products.
    chosen, why = choose_node(worker("w1"), nodes[:2], [worker("w0", on="a100")])
    assert chosen is None and "didn't match pod affinity rules" in why, why


def test_required_anti_affinity_keeps_pods_apart() -> None:
    term = {"labelSelector": SELECTOR, "topologyKey": "kubernetes.io/hostname"}
    apart = worker("w1")
    apart["spec"]["affinity"] = {
        "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}
    }
    chosen, why = choose_node(apart, [node("l4-a", "L4")], [worker("w0", on="l4-a")])
    assert chosen is None and "anti-affinity" in why
