"""Two operator replicas with kopf peering (as the chart runs them): exactly one handles
InferenceServices; when it dies without a goodbye (SIGKILL), the standby takes over once the dead
peer's keep-alive expires, and handles what was applied meanwhile."""

from __future__ import annotations

import contextlib
import os
import signal
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException
from operator_harness import OperatorProcess, operator_kubeconfig, wait_for
from test_operator_flow import apply, demo, jobs

from infertune.operator.rbac import peering_crds

# Slow: kopf's peering lifetime makes a takeover take 60-120 s, and it flaked once under load.
pytestmark = [pytest.mark.cluster, pytest.mark.slow]


def _peering(cluster: Any, api: Any) -> str:
    ext = client.ApiextensionsV1Api(api)
    for crd in peering_crds():
        with contextlib.suppress(ApiException):  # 409: another test installed them
            ext.create_custom_resource_definition(crd)
    for crd in peering_crds():
        # (kubectl 1.20's `wait` fails while a new CRD has no status yet: poll instead)
        wait_for(
            lambda c=crd: "True" in cluster.kubectl(
                "get", "crd", c["metadata"]["name"], "-o",
                "jsonpath={.status.conditions[?(@.type=='Established')].status}", check=False,
            ).stdout or None,
            f"{crd['metadata']['name']} established", timeout=60,
        )  # fmt: skip
    name = f"peering-{uuid.uuid4().hex[:6]}"
    client.CustomObjectsApi(api).create_cluster_custom_object(
        "kopf.dev",
        "v1",
        "clusterkopfpeerings",
        {"apiVersion": "kopf.dev/v1", "kind": "ClusterKopfPeering", "metadata": {"name": name}},
    )
    return name


def _paused(op: OperatorProcess) -> bool:
    """By the last peering line kopf logged. The operator's peering is mandatory, so kopf starts
    paused and says nothing when a peer with a higher priority is already there: a replica that
    never logged "Resuming" is paused (only one that was active first logs "Pausing ...")."""
    paused = True
    for line in op.log().splitlines():
        if "Resuming operations after the pause" in line:
            paused = False
        elif "Pausing operations in favour of" in line or "Pausing all operators" in line:
            paused = True
    return paused


def _settled(ops: list[OperatorProcess], peers: Any) -> list[bool] | None:
    """Which replicas are paused, once both keep-alives are in the peering record and exactly
    one replica is active for 5 s running (kopf reacts to a new peer within a second or two;
    before the second replica has read the record it is paused whatever its priority)."""
    if len(peers() or {}) < len(ops):
        return None
    first = [_paused(op) for op in ops]
    if sum(first) != len(ops) - 1:
        return None
    time.sleep(5)
    return first if [_paused(op) for op in ops] == first else None


def test_the_standby_replica_takes_over_when_the_active_one_dies(
    cluster: Any, api: Any, namespace: str, tmp_path: Path
) -> None:
    peering = _peering(cluster, api)
    kubeconfig = operator_kubeconfig(cluster, api, tmp_path)
    args = ("--all-namespaces", "--peering", peering)
    ops = [
        OperatorProcess(kubeconfig, tmp_path / f"op{i}.log", args=args).start() for i in range(2)
    ]
    try:
        # Each picks a random priority: the lower one pauses in favour of the other.
        def peers() -> Any:
            record = client.CustomObjectsApi(api).get_cluster_custom_object(
                "kopf.dev", "v1", "clusterkopfpeerings", peering
            )
            return record.get("status")

        try:
            paused = wait_for(lambda: _settled(ops, peers), "one replica paused", timeout=120)
        except AssertionError as exc:
            # Which replicas wrote a keep-alive, with what priority and when, tells a replica
            # that never reached its peering loop from two that could not agree.
            logs = "\n".join(f"--- op{i}\n{op.log()[-3000:]}" for i, op in enumerate(ops))
            raise AssertionError(f"{exc}\npeers: {peers()}\n{logs}") from None
        standby = ops[paused.index(True)]
        active = ops[paused.index(False)]

        apply(cluster, namespace, demo("peer-a"), tmp_path)
        wait_for(lambda: jobs(api, namespace, "peer-a"), "Job from the active replica", timeout=60)
        assert active.metric("infertune_operator_reconciles_total") >= 1
        assert standby.metric("infertune_operator_reconciles_total") == 0

        assert active.proc is not None
        os.killpg(active.proc.pid, signal.SIGKILL)  # no clean exit: its peering record stays
        active.proc.wait()
        apply(cluster, namespace, demo("peer-b"), tmp_path)
        # kopf's peering lifetime is 60 s: the dead peer's record expires, the standby resumes.
        wait_for(
            lambda: jobs(api, namespace, "peer-b"),
            "Job from the standby after takeover",
            timeout=150,
            every=1.0,
        )
        assert "Resuming operations after the pause" in standby.log(), standby.log()[-2000:]
        assert standby.metric("infertune_operator_reconciles_total") >= 1
        assert not standby.rbac_denials(), standby.log()[-2000:]
    finally:
        for op in ops:
            op.stop()
        with contextlib.suppress(ApiException):
            client.CustomObjectsApi(api).delete_cluster_custom_object(
                "kopf.dev", "v1", "clusterkopfpeerings", peering
            )
