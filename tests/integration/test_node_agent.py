"""Controllers + the node agent: Deployments and Jobs really run, pods land only on nodes with
the GPU they ask for, processes get the kubelet's env/volume/probe/exit-code semantics."""

from __future__ import annotations

import base64
import json
import os
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from cluster_helpers import (
    PY,
    alive,
    phase_is,
    pod,
    wait_for,
)
from kubernetes import client

pytestmark = pytest.mark.cluster


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


def test_init_containers_run_first_and_a_failed_one_fails_a_never_pod(
    api: Any, namespace: str
) -> None:
    core = client.CoreV1Api(api)
    scratch = {"volumeMounts": [{"name": "s", "mountPath": "/work"}]}
    for name, init_code, phase in (("init-ok", 0, "Succeeded"), ("init-bad", 4, "Failed")):
        write = f"open('/work/from-init', 'w').write('seeded'); raise SystemExit({init_code})"
        read = "open('/dev/termination-log', 'w').write(open('/work/from-init').read())"
        spec = pod(name, [PY, "-c", read], **scratch, volumes=[{"name": "s", "emptyDir": {}}])
        spec["spec"]["initContainers"] = [
            {"name": "seed", "image": "local", "command": [PY, "-c", write], **scratch}
        ]
        core.create_namespaced_pod(namespace, spec)
        done = wait_for(phase_is(core, namespace, name, "Succeeded", "Failed"), f"{name} finished")
        assert done.status.phase == phase
        assert done.status.init_container_statuses[0].state.terminated.exit_code == init_code
        if init_code == 0:
            assert done.status.container_statuses[0].state.terminated.message == "seeded"
        else:  # the main container never ran
            assert done.status.container_statuses[0].state.terminated is None


def test_missing_config_map_holds_the_pod_until_it_exists(api: Any, namespace: str) -> None:
    core = client.CoreV1Api(api)
    env = [{"name": "MODE", "valueFrom": {"configMapKeyRef": {"name": "late", "key": "mode"}}}]
    script = "import os; open('/dev/termination-log', 'w').write(os.environ['MODE'])"
    core.create_namespaced_pod(namespace, pod("waits", [PY, "-c", script], env=env))
    waiting = wait_for(
        lambda: [
            s.state.waiting
            for s in core.read_namespaced_pod("waits", namespace).status.container_statuses or []
            if s.state.waiting and s.state.waiting.reason == "CreateContainerConfigError"
        ],
        "CreateContainerConfigError",
    )
    assert 'configmap "late" not found' in waiting[0].message
    assert core.read_namespaced_pod("waits", namespace).status.phase == "Pending"
    core.create_namespaced_config_map(
        namespace, {"metadata": {"name": "late"}, "data": {"mode": "now"}}
    )
    done = wait_for(phase_is(core, namespace, "waits", "Succeeded"), "waits succeeded")
    assert done.status.container_statuses[0].state.terminated.message == "now"


def test_a_missing_executable_is_a_start_error(api: Any, namespace: str) -> None:
    core = client.CoreV1Api(api)
    core.create_namespaced_pod(namespace, pod("nocmd", ["/nonexistent/infertune-binary"]))
    done = wait_for(phase_is(core, namespace, "nocmd", "Failed"), "nocmd failed")
    term = done.status.container_statuses[0].state.terminated
    assert (term.reason, term.exit_code) == ("StartError", 128)
    assert "No such file or directory" in term.message
