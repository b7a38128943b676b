"""The dev control plane behaves like a real cluster where operators break: schema, status
subresource, resourceVersion conflicts, owner-reference garbage collection, RBAC, clean stop."""

from __future__ import annotations

import base64
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from cluster_helpers import (
    CRD,
    GROUP,
    PLURAL,
    PY,
    ROOT,
    VERSION,
    alive,
    isvc,
    phase_is,
    pod,
    wait_for,
)
from kubernetes import client
from kubernetes.client.rest import ApiException
from procs import kubectl_path

pytestmark = pytest.mark.cluster


# ---------------------------------------------------------------- API machinery


def test_crd_and_every_example_apply_with_kubectl(cluster: Any, namespace: str) -> None:
    reapply = cluster.kubectl("apply", "-f", str(CRD))
    assert "inferenceservices.infertune.dev" in reapply.stdout
    crd = cluster.get_json(
        "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/inferenceservices.infertune.dev"
    )
    established = {c["type"]: c["status"] for c in crd["status"]["conditions"]}
    assert established["Established"] == "True"
    examples = sorted((ROOT / "examples").glob("*.yaml"))
    assert examples, "examples/*.yaml missing"
    names = []
    for path in examples:
        cluster.kubectl("apply", "-n", namespace, "-f", str(path))
        names += [d["metadata"]["name"] for d in yaml.safe_load_all(path.read_text()) if d]
    listed = cluster.kubectl(
        "get", "inferenceservices", "-n", namespace, "-o", "name"
    ).stdout.split()
    assert sorted(listed) == sorted(f"inferenceservice.infertune.dev/{n}" for n in names)


def test_api_server_rejects_a_manifest_that_violates_the_schema(
    cluster: Any, namespace: str, tmp_path: Path
) -> None:
    bad = isvc("bad-slo")
    bad["spec"]["slo"]["ttft"]["percentile"] = "p42"  # not in the enum
    del bad["spec"]["model"]  # required
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(bad))
    # --validate=false: the verdict must come from the API server's structural schema, not kubectl.
    out = cluster.kubectl(
        "apply", "--validate=false", "-n", namespace, "-f", str(path), check=False
    )
    assert out.returncode != 0
    assert "spec.slo.ttft.percentile" in out.stderr and "p42" in out.stderr
    assert "spec.model" in out.stderr and "Required" in out.stderr
    assert (
        cluster.kubectl(
            "get", "inferenceservice", "bad-slo", "-n", namespace, check=False
        ).returncode
        != 0
    )


def test_status_subresource_ignores_spec_and_main_resource_ignores_status(
    api: Any, namespace: str
) -> None:
    co = client.CustomObjectsApi(api)
    co.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, isvc("status-demo"))
    condition = {
        "type": "Ready",
        "status": "False",
        "reason": "Tuning",
        "lastTransitionTime": "2026-01-01T00:00:00Z",
    }
    patch = {
        "spec": {"slo": {"ttft": {"max": "999ms"}}},
        "status": {"observedGeneration": 1, "conditions": [condition]},
    }
    co.patch_namespaced_custom_object_status(
        GROUP, VERSION, namespace, PLURAL, "status-demo", patch
    )
    obj = co.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "status-demo")
    assert obj["spec"]["slo"]["ttft"]["max"] == "300ms"  # spec via /status is ignored
    assert obj["status"]["conditions"][0]["reason"] == "Tuning"
    assert obj["metadata"]["generation"] == 1
    co.patch_namespaced_custom_object(
        GROUP,
        VERSION,
        namespace,
        PLURAL,
        "status-demo",
        {"spec": {"slo": {"ttft": {"max": "250ms"}}}, "status": {"observedGeneration": 7}},
    )
    obj = co.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "status-demo")
    assert obj["spec"]["slo"]["ttft"]["max"] == "250ms"
    assert obj["metadata"]["generation"] == 2  # spec changes bump generation ...
    assert (
        obj["status"]["observedGeneration"] == 1
    )  # ... and status via the main resource is ignored
    stale = dict(obj, metadata={**obj["metadata"], "resourceVersion": "1"})
    with pytest.raises(ApiException) as conflict:
        co.replace_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "status-demo", stale)
    assert conflict.value.status == 409


# ---------------------------------------------------------------- garbage collection and RBAC


def test_owner_reference_garbage_collection_removes_children(api: Any, namespace: str) -> None:
    co, core, apps = client.CustomObjectsApi(api), client.CoreV1Api(api), client.AppsV1Api(api)
    owner = co.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, isvc("owner"))
    ref = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "InferenceService", "name": "owner",
           "uid": owner["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}  # fmt: skip
    core.create_namespaced_config_map(
        namespace, {"metadata": {"name": "child", "ownerReferences": [ref]}, "data": {}}
    )
    labels = {"app": "child"}
    apps.create_namespaced_deployment(namespace, {
        "metadata": {"name": "child", "ownerReferences": [ref]},
        "spec": {"replicas": 1, "selector": {"matchLabels": labels}, "template": {"metadata": {"labels": labels},
                 "spec": {"containers": [{"name": "c", "image": "local", "command": [PY, "-c", "import time; time.sleep(600)"]}]}}},
    })  # fmt: skip
    wait_for(
        lambda: core.list_namespaced_pod(namespace, label_selector="app=child").items,
        "the grandchild pod",
    )
    co.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "owner")
    wait_for(
        lambda: (
            not core.list_namespaced_config_map(
                namespace, field_selector="metadata.name=child"
            ).items
        ),
        "ConfigMap collected",
    )
    wait_for(lambda: not apps.list_namespaced_replica_set(namespace).items, "ReplicaSet collected")
    wait_for(
        lambda: not core.list_namespaced_pod(namespace, label_selector="app=child").items,
        "Pod collected",
    )


def test_service_account_with_a_narrow_role_is_denied_the_rest(
    cluster: Any, api: Any, namespace: str
) -> None:
    core, rbac = client.CoreV1Api(api), client.RbacAuthorizationV1Api(api)
    core.create_namespaced_service_account(namespace, {"metadata": {"name": "reader"}})
    rbac.create_namespaced_role(namespace, {"metadata": {"name": "pod-reader"},
                                            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}]})  # fmt: skip
    rbac.create_namespaced_role_binding(namespace, {
        "metadata": {"name": "reader"}, "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "pod-reader"},
        "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": namespace}],
    })  # fmt: skip
    secret_name = wait_for(
        lambda: (core.read_namespaced_service_account("reader", namespace).secrets or [None])[0],
        "SA token",
    ).name
    token = base64.b64decode(
        core.read_namespaced_secret(secret_name, namespace).data["token"]
    ).decode()
    narrow = cluster.api_client(token=token)
    try:
        ncore, napps = client.CoreV1Api(narrow), client.AppsV1Api(narrow)
        deployment = {"metadata": {"name": "x"}, "spec": {"selector": {"matchLabels": {"a": "b"}}, "template": {
            "metadata": {"labels": {"a": "b"}}, "spec": {"containers": [{"name": "c", "image": "local"}]}}}}  # fmt: skip
        ncore.list_namespaced_pod(namespace)  # granted
        denied = [
            lambda: ncore.list_namespaced_secret(namespace),
            lambda: ncore.list_namespaced_pod("default"),
            lambda: ncore.delete_namespaced_pod("x", namespace),
            lambda: napps.create_namespaced_deployment(namespace, deployment),
            lambda: client.CustomObjectsApi(narrow).list_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL
            ),
        ]
        for call in denied:
            with pytest.raises(ApiException) as e:
                call()
            assert e.value.status == 403, e.value.body
            assert f"system:serviceaccount:{namespace}:reader" in e.value.body
    finally:
        narrow.close()
    can_i = cluster.kubectl(
        "auth", "can-i", "list", "secrets", "-n", namespace, token=token, check=False
    )
    assert can_i.stdout.strip() == "no"


def test_stop_leaves_no_process_behind(tmp_path: Path) -> None:
    import devcluster
    import node_agent

    c = devcluster.Cluster()
    c.start()
    try:
        c.start_controller_manager()
        c.start_node_agent([node_agent.cpu_node("solo")])
        (tmp_path / "p.yaml").write_text(
            yaml.safe_dump(pod("sleeper", [PY, "-c", "import time; time.sleep(600)"]))
        )
        c.kubectl("apply", "-n", "default", "-f", str(tmp_path / "p.yaml"))
        core = client.CoreV1Api(c.api_client())
        running = wait_for(phase_is(core, "default", "sleeper", "Running"), "sleeper running")
        pids = [p.pid for p in c.procs.values()] + [
            int(running.status.container_statuses[0].container_id.removeprefix("local://"))
        ]
    finally:
        state = c.state_dir
        c.stop()
    for p in pids:
        wait_for(lambda p=p: not alive(p), f"process {p} gone", timeout=10)
    assert not state.exists()
    assert subprocess.run(["pgrep", "-f", str(state)], capture_output=True).returncode == 1


def test_cli_up_env_down_round_trip(tmp_path: Path) -> None:
    script = ROOT / "scripts" / "devcluster" / "devcluster.py"
    env = {**os.environ, "INFERTUNE_DEVCLUSTER_CURRENT": str(tmp_path / "current")}

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [PY, str(script), *args], env=env, capture_output=True, text=True, timeout=300
        )

    up = cli("up", "--crd", str(CRD))
    assert up.returncode == 0, up.stderr
    state = Path((tmp_path / "current").read_text())
    try:
        exported = cli("env").stdout.strip()
        assert exported == f"export KUBECONFIG={state / 'kubeconfig'}"
        kubeconfig = exported.split("=", 1)[1]
        kubectl = [kubectl_path(), f"--kubeconfig={kubeconfig}"]
        nodes = wait_for(
            lambda: subprocess.run(
                [*kubectl, "get", "nodes", "-o", "name"], capture_output=True, text=True
            ).stdout.split(),
            "nodes registered by the detached agent",
        )
        assert "node/gpu-h100-0" in nodes
        crds = subprocess.run(
            [*kubectl, "get", "crd", "-o", "name"], capture_output=True, text=True
        ).stdout
        assert "inferenceservices.infertune.dev" in crds
        assert cli("up").returncode == 1  # one detached instance at a time
        pids = json.loads((state / "pids.json").read_text())["pids"]
    finally:
        down = cli("down")
    assert down.returncode == 0, down.stderr
    assert not state.exists()
    for pid in pids.values():
        wait_for(lambda pid=pid: not alive(int(pid)), f"process {pid} gone", timeout=10)
    assert cli("env").returncode == 1
