"""The node agent's pure parts: the scheduler's filter and the kubelet's expansion rules."""

from __future__ import annotations

import sys
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from podspec import base_env, expand, rewrite_paths
from scheduling import choose_node, parse_quantity


def node(
    name: str, labels: dict[str, str] | None = None, gpus: int = 0, taints: list[Any] | None = None
) -> dict[str, Any]:
    cap = {"cpu": "4", "memory": "8Gi", "pods": "10"}
    if gpus:
        cap["nvidia.com/gpu"] = str(gpus)
    return {
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {"taints": taints or []},
        "status": {"allocatable": cap},
    }


def pod(
    gpus: int = 0, cpu: str = "", on: str = "", phase: str = "Running", **spec: Any
) -> dict[str, Any]:
    limits = {"nvidia.com/gpu": str(gpus)} if gpus else {}
    requests = {"cpu": cpu} if cpu else {}
    container = {"name": "c", "resources": {"limits": limits, "requests": requests}}
    return {
        "metadata": {"name": "p"},
        "spec": {"containers": [container], "nodeName": on, **spec},
        "status": {"phase": phase},
    }


H100 = {"nvidia.com/gpu.product": "NVIDIA-H100"}


@pytest.mark.parametrize(
    ("text", "value"),
    [("500m", "0.5"), ("2Gi", str(2 * 2**30)), ("1", "1"), ("1.5k", "1500"), ("1e3", "1000")],
)
def test_quantities_parse_like_the_api(text: str, value: str) -> None:
    assert parse_quantity(text) == Decimal(value)


def test_a_bad_quantity_names_the_value() -> None:
    with pytest.raises(ValueError, match="'12X'"):
        parse_quantity("12X")


def test_gpu_pod_goes_only_where_a_gpu_is_free() -> None:
    nodes = [node("cpu"), node("h100", H100, gpus=1), node("a100", gpus=2)]
    chosen, _ = choose_node(pod(gpus=1, nodeSelector=H100), nodes, [])
    assert chosen is not None and chosen["metadata"]["name"] == "h100"
    busy = [pod(gpus=1, on="h100")]
    chosen, why = choose_node(pod(gpus=1, nodeSelector=H100), nodes, busy)
    assert chosen is None
    assert (
        why
        == "0/3 nodes are available: 1 Insufficient nvidia.com/gpu, 2 node(s) didn't match node selector."
    )
    # A finished pod no longer holds its GPU.
    chosen, _ = choose_node(
        pod(gpus=1, nodeSelector=H100), nodes, [pod(gpus=1, on="h100", phase="Succeeded")]
    )
    assert chosen is not None and chosen["metadata"]["name"] == "h100"


def test_cpu_requests_are_counted_against_allocatable() -> None:
    nodes = [node("small")]
    assert choose_node(pod(cpu="3"), nodes, [pod(cpu="1500m", on="small")])[0] is None
    assert choose_node(pod(cpu="2500m"), nodes, [pod(cpu="1500m", on="small")])[0] is not None


def test_least_loaded_feasible_node_wins() -> None:
    nodes = [node("a"), node("b")]
    chosen, _ = choose_node(pod(), nodes, [pod(on="a")])
    assert chosen is not None and chosen["metadata"]["name"] == "b"


@pytest.mark.parametrize(
    ("expr", "fits"),
    [
        ({"key": "gpu.count", "operator": "Gt", "values": ["1"]}, True),
        ({"key": "gpu.count", "operator": "Lt", "values": ["2"]}, False),
        ({"key": "gpu.count", "operator": "In", "values": ["1", "2"]}, True),
        ({"key": "gpu.count", "operator": "NotIn", "values": ["2"]}, False),
        ({"key": "missing", "operator": "DoesNotExist"}, True),
        ({"key": "missing", "operator": "Exists"}, False),
    ],
)
def test_required_node_affinity_operators(expr: dict[str, Any], fits: bool) -> None:
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [expr]}]
            }
        }
    }
    chosen, _ = choose_node(pod(affinity=affinity), [node("n", {"gpu.count": "2"})], [])
    assert (chosen is not None) is fits


def test_affinity_terms_are_ored_and_an_empty_term_matches_nothing() -> None:
    terms = [{}, {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n"]}]}]
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}
        }
    }
    assert (
        choose_node(pod(affinity=affinity), [node("n"), node("m")], [])[0]["metadata"]["name"]
        == "n"
    )  # type: ignore[index]
    only_empty = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{}]}
        }
    }
    assert choose_node(pod(affinity=only_empty), [node("n")], [])[0] is None


def test_taints_need_a_matching_toleration() -> None:
    tainted = [node("t", taints=[{"key": "dedicated", "value": "ml", "effect": "NoSchedule"}])]
    assert "taint {dedicated: ml}" in choose_node(pod(), tainted, [])[1]
    for tol in (
        {"key": "dedicated", "operator": "Equal", "value": "ml"},
        {"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"},
        {"operator": "Exists"},
    ):
        assert choose_node(pod(tolerations=[tol]), tainted, [])[0] is not None, tol
    for tol in (
        {"key": "dedicated", "value": "other"},
        {"key": "dedicated", "operator": "Exists", "effect": "NoExecute"},
    ):
        assert choose_node(pod(tolerations=[tol]), tainted, [])[0] is None, tol
    soft = [node("s", taints=[{"key": "k", "effect": "PreferNoSchedule"}])]
    assert choose_node(pod(), soft, [])[0] is not None


def test_var_expansion_follows_kubernetes_rules() -> None:
    env = {"A": "1", "B": "two"}
    assert expand("$(A)-$(B)", env) == "1-two"
    assert expand("$$(A)", env) == "$(A)"  # escaped
    assert expand("$(MISSING) $A", env) == "$(MISSING) $A"  # unknown and shell syntax stay literal


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("/data", "/tmp/v"),
        ("/data/model.bin", "/tmp/v/model.bin"),
        ("--out=/data/x", "--out=/tmp/v/x"),
        ("a:/data/x,/data/y", "a:/tmp/v/x,/tmp/v/y"),
        ("/database", "/database"),  # another path that merely starts the same
        ("http://host/data/x", "http://host/data/x"),  # not a path of ours
        ("/srv/data", "/srv/data"),
    ],
)
def test_mount_paths_are_rewritten_on_path_boundaries(text: str, expected: str) -> None:
    assert rewrite_paths(text, [("/data", "/tmp/v")]) == expected


def test_longer_mount_wins() -> None:
    mapping = [("/data/models", "/m"), ("/data", "/d")]
    assert rewrite_paths("/data/models/x /data/y", mapping) == "/m/x /d/y"


def test_a_rewritten_path_is_not_rewritten_again() -> None:
    # The agent's pod directories live under /dev/shm; a pod that mounts /dev/shm (a shm volume)
    # must not see its termination log's local path rewritten a second time.
    local = "/dev/shm/agent/pods/p/tuner.termination-log"
    mapping = [("/dev/termination-log", local), ("/dev/shm", "/dev/shm/agent/pods/p/volumes/dshm")]
    assert rewrite_paths("--log /dev/termination-log", mapping) == f"--log {local}"
    assert rewrite_paths("/dev/shm/x", mapping) == "/dev/shm/agent/pods/p/volumes/dshm/x"


def test_host_paths_below_a_mount_are_not_rewritten() -> None:
    # The pod's interpreter is a host path; a mount at /usr must not hide it.
    mapping = [("/usr", "/tmp/v")]
    assert rewrite_paths("/usr/bin/env python", mapping) == "/usr/bin/env python"
    assert rewrite_paths("/usr/not-on-this-host/x", mapping) == "/tmp/v/not-on-this-host/x"
    assert rewrite_paths("--root=/usr", mapping) == "--root=/tmp/v"


def test_pods_find_the_virtualenv_cli_first_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """The agent's virtualenv is the image: a bare `infertune` in a pod's command resolves to it,
    whatever PATH `make cluster` was started with, and the API credentials stay out."""
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    monkeypatch.setenv("KUBECONFIG", "/secret/kubeconfig")
    pod = {"metadata": {"name": "p"}}
    env = base_env(pod, "127.0.0.9", "127.0.0.1", 6443)
    venv_bin = str(Path(sys.executable).parent)
    assert env["PATH"].split(":") == [venv_bin, "/usr/bin", "/bin"]
    assert "KUBECONFIG" not in env
    assert env["KUBERNETES_SERVICE_PORT"] == "6443"
