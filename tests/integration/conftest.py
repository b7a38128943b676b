"""Session fixtures for a real control plane (etcd + kube-apiserver + kube-controller-manager).

The cluster is built on first use (``scripts/devcluster/build.sh``, ~6 min once; cached in
~/.cache/infertune), started once per test session with the project's CRD applied before the
controller manager (so garbage collection knows the kind at once), and stopped at the end with
every process it started. Fake nodes (see ``NODES``) run pods as local processes.
"""

from __future__ import annotations

import contextlib
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import devcluster  # scripts/devcluster, on the path through pytest's pythonpath
import node_agent
import pytest
from operator_harness import OperatorProcess, running_operator

ROOT = Path(__file__).resolve().parents[2]

CRD = ROOT / "crds" / "inferenceservices.infertune.dev.yaml"
# Two GPU kinds (one with two GPUs), a tainted GPU node that only tolerating pods may use, and a
# CPU-only node: enough to tell every scheduling predicate apart.
NODES = [
    node_agent.gpu_node("gpu-h100-0", product="NVIDIA-H100-80GB-HBM3", gpus=1),
    node_agent.gpu_node("gpu-a100-0", product="NVIDIA-A100-SXM4-80GB", gpus=2),
    node_agent.FakeNode(
        name="gpu-t4-tainted-0",
        labels=node_agent.gpu_node("x", product="Tesla-T4").labels,
        capacity=node_agent.gpu_node("x", product="Tesla-T4").capacity,
        taints=[{"key": "dedicated", "value": "infertune", "effect": "NoSchedule"}],
    ),
    node_agent.cpu_node("cpu-0"),
]


@pytest.fixture(scope="session")
def cluster(request: pytest.FixtureRequest) -> Iterator[devcluster.Cluster]:
    # The first build takes minutes: show its progress instead of letting pytest capture it.
    capture = request.config.pluginmanager.getplugin("capturemanager")
    with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
        devcluster.build(log=lambda msg: print(msg, file=sys.stderr, flush=True))
    c = devcluster.Cluster()
    try:
        c.start()
        c.kubectl("apply", "-f", str(CRD))
        devcluster.wait_established(c.kubectl, "-f", str(CRD))
        c.start_controller_manager()
        c.start_node_agent(NODES, restart_backoff=(0.5, 5.0), max_grace=5.0)
        yield c
    finally:
        c.stop()


@pytest.fixture(scope="session")
def kubeconfig(cluster: devcluster.Cluster) -> Path:
    return cluster.kubeconfig


@pytest.fixture(scope="session")
def api(cluster: devcluster.Cluster) -> Iterator[Any]:
    """An admin ``kubernetes.client.ApiClient``."""
    client = cluster.api_client()
    yield client
    client.close()


@pytest.fixture(scope="session")
def agent(cluster: devcluster.Cluster) -> node_agent.NodeAgent:
    assert cluster.agent is not None
    return cluster.agent  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def operator(
    cluster: devcluster.Cluster,
    api: Any,
    tmp_path_factory: pytest.TempPathFactory,
    request: pytest.FixtureRequest,
) -> Iterator[OperatorProcess]:
    """The operator under the chart's ServiceAccount, one per test module (a module needing
    another kind defines its own). Hostile or not, no spec may make it reach beyond its RBAC
    rules: checked on exit."""
    work = tmp_path_factory.mktemp(f"operator-{request.module.__name__}")
    with running_operator(cluster, api, work) as op:
        yield op


@pytest.fixture
def namespace(cluster: devcluster.Cluster) -> Iterator[str]:
    """A fresh namespace per test, deleted afterwards (without waiting)."""
    name = f"t-{uuid.uuid4().hex[:8]}"
    cluster.create_namespace(name)
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture
def gate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Tuning pods of fault_fake_cli.py (they inherit this process's environment) wait until
    `gate/release` exists: "mid-tuning" lasts as long as a fault test needs."""
    path = tmp_path / "gate"
    path.mkdir()
    monkeypatch.setenv("INFERTUNE_FAULT_GATE", str(path))
    return path
