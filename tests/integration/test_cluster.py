"""The dev control plane behaves like a real cluster where operators break: schema, status
subresource, controllers, scheduling onto GPU nodes, pod processes, garbage collection, RBAC."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

pytestmark = pytest.mark.cluster

ROOT = Path(__file__).resolve().parents[2]
CRD = ROOT / "crds" / "inferenceservices.infertune.dev.yaml"
GROUP, VERSION, PLURAL = "infertune.dev", "v1alpha1", "inferenceservices"
PY = sys.executable
T = TypeVar("T")


def wait_for(fn: Callable[[], T | None], what: str, timeout: float = 60.0) -> T:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = fn()
        except ApiException as e:
            if e.status != 404:
                raise
            last = None  # not there yet
        if last:
            return last  # type: ignore[no-any-return]
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}; last value: {last!r}")


def alive(pid: int) -> bool:
    """True while the process exists and is not a zombie waiting for init to reap it."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def pod(name: str, command: list[str], **spec: Any) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "main", "image": "local", "command": command}
    for key in ("env", "readinessProbe", "livenessProbe", "resources", "volumeMounts", "ports"):
        if key in spec:
            container[key] = spec.pop(key)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "containers": [container],
            "restartPolicy": spec.pop("restartPolicy", "Never"),
            **spec,
        },
    }


def isvc(name: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "InferenceService",
        "metadata": {"name": name},
        "spec": {
            "model": {"uri": "pvc://models/tiny"},
            "slo": {"ttft": {"max": "300ms", "percentile": "p95"}},
        },
    }


def phase_is(core: client.CoreV1Api, ns: str, name: str, *phases: str) -> Callable[[], Any]:
    def check() -> Any:
        p = core.read_namespaced_pod(name, ns)
        return p if p.status.phase in phases else None

    return check


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


# ---------------------------------------------------------------- controllers + node agent


def test_deployment_gets_replicaset_and_ready_pods_serving_on_their_own_ip(
    cluster: Any, api: Any, namespace: str
) -> None:
    server = [PY, "-m", "http.server", "--bind", "$(POD_IP)", "8080"]
    container = {
        "name": "web", "image": "local", "command": server, "ports": [{"name": "http", "containerPort": 8080}],
        "env": [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}],
        "readinessProbe": {"httpGet": {"path": "/", "port": "http"}, "periodSeconds": 1},
    }  # fmt: skip
    labels = {"app": "web"}
    dep = {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
        "spec": {"replicas": 2, "selector": {"matchLabels": labels},
                 "template": {"metadata": {"labels": labels}, "spec": {"containers": [container]}}},
    }  # fmt: skip
    apps, core = client.AppsV1Api(api), client.CoreV1Api(api)
    apps.create_namespaced_deployment(namespace, dep)
    rs = wait_for(lambda: apps.list_namespaced_replica_set(namespace).items, "a ReplicaSet")
    assert rs[0].metadata.owner_references[0].name == "web"
    wait_for(
        lambda: apps.read_namespaced_deployment("web", namespace).status.available_replicas == 2,
        "2 available replicas",
    )
    pods = core.list_namespaced_pod(namespace, label_selector="app=web").items
    ips = {p.status.pod_ip for p in pods}
    assert len(ips) == 2 and all(ip.startswith("127.") for ip in ips)
    for ip in ips:
        with urllib.request.urlopen(f"http://{ip}:8080/", timeout=5) as r:
            assert r.status == 200
    core.create_namespaced_service(
        namespace,
        {"metadata": {"name": "web"}, "spec": {"selector": labels, "ports": [{"port": 8080}]}},
    )
    # EndpointSlices carry the pod IPs (Endpoints cannot: validation rejects loopback addresses).
    path = f"/apis/discovery.k8s.io/v1beta1/namespaces/{namespace}/endpointslices?labelSelector=kubernetes.io/service-name=web"
    slices = wait_for(
        lambda: [s for s in cluster.get_json(path)["items"] if len(s.get("endpoints") or []) == 2],
        "endpoint slice",
    )
    assert {e["addresses"][0] for e in slices[0]["endpoints"]} == ips
    assert all(e["conditions"]["ready"] for e in slices[0]["endpoints"])


def test_gpu_pods_land_only_on_nodes_that_have_the_gpu(api: Any, namespace: str) -> None:
    core = client.CoreV1Api(api)
    sleep = [PY, "-c", "import time; time.sleep(600)"]
    gpu = {"limits": {"nvidia.com/gpu": "1"}}
    h100 = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    core.create_namespaced_pod(namespace, pod("on-h100", sleep, resources=gpu, nodeSelector=h100))
    bound = wait_for(phase_is(core, namespace, "on-h100", "Running"), "on-h100 running")
    assert bound.spec.node_name == "gpu-h100-0"
    # The only H100 GPU is taken: a second H100 pod must wait with the scheduler's reason.
    core.create_namespaced_pod(
        namespace, pod("second-h100", sleep, resources=gpu, nodeSelector=h100)
    )
    cond = wait_for(
        lambda: [
            c
            for c in core.read_namespaced_pod("second-h100", namespace).status.conditions or []
            if c.reason == "Unschedulable"
        ],
        "Unschedulable condition",
    )
    assert "Insufficient nvidia.com/gpu" in cond[0].message
    assert core.read_namespaced_pod("second-h100", namespace).spec.node_name is None
    # Affinity NotIn H100 + a GPU: the A100 node (the T4 is tainted, the CPU node has no GPU).
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "nvidia.com/gpu.product", "operator": "NotIn", "values": ["NVIDIA-H100-80GB-HBM3"]},
                              {"key": "nvidia.com/gpu.present", "operator": "Exists"}]}]}}}  # fmt: skip
    core.create_namespaced_pod(namespace, pod("not-h100", sleep, resources=gpu, affinity=affinity))
    assert (
        wait_for(phase_is(core, namespace, "not-h100", "Running"), "not-h100").spec.node_name
        == "gpu-a100-0"
    )
    toleration = [
        {"key": "dedicated", "operator": "Equal", "value": "infertune", "effect": "NoSchedule"}
    ]
    t4 = {"nvidia.com/gpu.product": "Tesla-T4"}
    core.create_namespaced_pod(
        namespace, pod("t4-intolerant", sleep, resources=gpu, nodeSelector=t4)
    )
    core.create_namespaced_pod(
        namespace, pod("t4-tolerant", sleep, resources=gpu, nodeSelector=t4, tolerations=toleration)
    )
    assert (
        wait_for(phase_is(core, namespace, "t4-tolerant", "Running"), "t4-tolerant").spec.node_name
        == "gpu-t4-tainted-0"
    )
    cond = wait_for(
        lambda: [
            c
            for c in core.read_namespaced_pod("t4-intolerant", namespace).status.conditions or []
            if c.reason == "Unschedulable"
        ],
        "t4-intolerant Unschedulable",
    )
    assert "taint {dedicated: infertune}" in cond[0].message
    # Free the H100: the waiting pod is bound to it.
    core.delete_namespaced_pod("on-h100", namespace)
    assert (
        wait_for(phase_is(core, namespace, "second-h100", "Running"), "second-h100").spec.node_name
        == "gpu-h100-0"
    )


def test_pod_process_gets_env_config_and_reports_exit_codes(api: Any, namespace: str) -> None:
    core = client.CoreV1Api(api)
    core.create_namespaced_config_map(
        namespace,
        {"metadata": {"name": "cfg"}, "data": {"mode": "fast", "tuning.yaml": "trials: 3\n"}},
    )
    core.create_namespaced_secret(
        namespace,
        {"metadata": {"name": "sec"}, "data": {"token": base64.b64encode(b"s3cret").decode()}},
    )
    script = (
        "import json, os, sys; "
        "cfg = open(sys.argv[1]).read().strip(); "
        "out = {k: os.environ[k] for k in ('NAME', 'NS', 'IP', 'POD_IP', 'MODE', 'TOKEN', 'GREETING')}; "
        "out['cfg'] = cfg; out['arg'] = sys.argv[2]; "
        "open('/dev/termination-log', 'w').write(json.dumps(out)); sys.exit(int(os.environ['CODE']))"
    )
    env = [
        {"name": "NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "MODE", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "mode"}}},
        {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "sec", "key": "token"}}},
        {"name": "GREETING", "value": "hello-$(NAME)-$$(NOT)"},
    ]
    for name, code, phase in (("ok", "0", "Succeeded"), ("bad", "3", "Failed")):
        spec = pod(
            name, [PY, "-c", script, "/etc/infertune/tuning.yaml", "$(MODE)"],
            env=[*env, {"name": "CODE", "value": code}],
            volumeMounts=[{"name": "cfg", "mountPath": "/etc/infertune"}],
            volumes=[{"name": "cfg", "configMap": {"name": "cfg"}}],
        )  # fmt: skip
        core.create_namespaced_pod(namespace, spec)
        done = wait_for(phase_is(core, namespace, name, "Succeeded", "Failed"), f"{name} finished")
        assert done.status.phase == phase
        term = done.status.container_statuses[0].state.terminated
        assert term.exit_code == int(code)
        seen = json.loads(term.message)
        assert seen == {
            "NAME": name, "NS": namespace, "IP": done.status.pod_ip, "POD_IP": done.status.pod_ip, "MODE": "fast",
            "TOKEN": "s3cret", "GREETING": f"hello-{name}-$(NOT)", "cfg": "trials: 3", "arg": "fast",
        }  # fmt: skip


def test_restart_policy_on_failure_restarts_until_success(api: Any, namespace: str) -> None:
    core = client.CoreV1Api(api)
    # Fails on the first run, succeeds on the second: the emptyDir survives container restarts.
    script = "import os, sys; f = '/scratch/ran'; first = not os.path.exists(f); open(f, 'w').close(); sys.exit(1 if first else 0)"
    spec = pod(
        "flaky", [PY, "-c", script], restartPolicy="OnFailure",
        volumeMounts=[{"name": "scratch", "mountPath": "/scratch"}], volumes=[{"name": "scratch", "emptyDir": {}}],
    )  # fmt: skip
    core.create_namespaced_pod(namespace, spec)
    done = wait_for(phase_is(core, namespace, "flaky", "Succeeded", "Failed"), "flaky finished")
    status = done.status.container_statuses[0]
    assert done.status.phase == "Succeeded"
    assert status.restart_count == 1
    assert status.last_state.terminated.exit_code == 1


def test_readiness_follows_the_probe_and_delete_kills_the_process_group(
    api: Any, namespace: str
) -> None:
    core = client.CoreV1Api(api)
    # The child `sleep` shares the process group: deleting the pod must kill it too.
    script = "touch ready; sleep 600 & echo $! > child.pid; while test -f ready; do sleep 0.2; done; sleep 600"
    probe = {
        "exec": {"command": ["test", "-f", "ready"]},
        "periodSeconds": 1,
        "failureThreshold": 1,
    }
    core.create_namespaced_pod(namespace, pod("probed", ["sh", "-c", script], readinessProbe=probe))
    ready = wait_for(
        lambda: (
            (p := core.read_namespaced_pod("probed", namespace)).status.container_statuses
            and p.status.container_statuses[0].ready
            and p
        ),
        "probed Ready",
    )
    assert {c.type: c.status for c in ready.status.conditions}["Ready"] == "True"
    pid = int(ready.status.container_statuses[0].container_id.removeprefix("local://"))
    os.killpg(pid, 0)  # the process group is alive
    workdir = Path(os.readlink(f"/proc/{pid}/cwd"))
    child = int((workdir / "child.pid").read_text())
    (workdir / "ready").unlink()  # the probe now fails
    wait_for(
        lambda: (
            not core.read_namespaced_pod("probed", namespace).status.container_statuses[0].ready
        ),
        "probed not Ready",
    )
    assert core.read_namespaced_pod("probed", namespace).status.phase == "Running"
    core.delete_namespaced_pod("probed", namespace)  # graceful: deletionTimestamp first
    wait_for(
        lambda: (
            not core.list_namespaced_pod(namespace, field_selector="metadata.name=probed").items
        ),
        "pod gone",
    )
    for p in (pid, child):
        wait_for(lambda p=p: not alive(p), f"process {p} gone", timeout=10)


def test_jobs_complete_and_fail_from_pod_exit_codes(api: Any, namespace: str) -> None:
    batch = client.BatchV1Api(api)
    for name, code in (("job-ok", 0), ("job-fail", 2)):
        job = {
            "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
            "spec": {"backoffLimit": 0, "template": {"spec": {"restartPolicy": "Never", "containers": [
                {"name": "main", "image": "local", "command": [PY, "-c", f"import sys; sys.exit({code})"]}]}}},
        }  # fmt: skip
        batch.create_namespaced_job(namespace, job)
    ok = wait_for(
        lambda: (j := batch.read_namespaced_job("job-ok", namespace)).status.succeeded and j,
        "job-ok succeeded",
    )
    assert {c.type for c in ok.status.conditions} == {"Complete"}
    failed = wait_for(
        lambda: [
            c
            for c in batch.read_namespaced_job("job-fail", namespace).status.conditions or []
            if c.type == "Failed"
        ],
        "job-fail Failed",
    )
    assert failed[0].reason == "BackoffLimitExceeded"


def test_relabelled_node_attracts_pods_for_its_new_gpu(
    agent: Any, api: Any, namespace: str
) -> None:
    core = client.CoreV1Api(api)
    agent.relabel("gpu-a100-0", {"nvidia.com/gpu.product": "NVIDIA-H200"})
    try:
        assert (
            core.read_node("gpu-a100-0").metadata.labels["nvidia.com/gpu.product"] == "NVIDIA-H200"
        )
        h200 = {"nvidia.com/gpu.product": "NVIDIA-H200"}
        core.create_namespaced_pod(namespace, pod("on-h200", ["true"], nodeSelector=h200))
        assert (
            wait_for(phase_is(core, namespace, "on-h200", "Succeeded"), "on-h200").spec.node_name
            == "gpu-a100-0"
        )
    finally:
        agent.relabel("gpu-a100-0", {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"})


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
    sys.path.insert(0, str(ROOT / "scripts" / "devcluster"))
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
