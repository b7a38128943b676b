"""A real node in the dev cluster: kubelet + containerd + runc + CNI, the real kube-scheduler and
kube-proxy, the project's fake-GPU device plugin, and images built here (scripts/images/build.sh,
cached). Pods run as containers: the kernel enforces their uid, read-only root and memory limit.

Needs root (containerd, mounts, iptables); a fresh machine installs the Debian packages
(setup_node.sh) and builds the images on first use (minutes, cached in ~/.cache/infertune).
The last test stops the cluster and proves nothing is left on the host.
"""

from __future__ import annotations

import json
import os
import ssl
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import devcluster
import pytest
import realnode

# The first image build on a fresh machine takes many minutes (see scripts/images/build.sh).
pytestmark = [pytest.mark.cluster, pytest.mark.timeout(3600)]
ROOT = Path(__file__).resolve().parents[2]
CRD = ROOT / "crds" / "inferenceservices.infertune.dev.yaml"
UID = 65532
# A tiny HTTP server that first reports what the container may do (uid, a write under /tmp, the
# GPUs the device plugin gave it); it serves /etc, so GET /hostname names the pod that answered.
PROBE = (
    "import errno, functools, http.server, os\n"
    "print('uid', os.getuid(), 'gid', os.getgid(), flush=True)\n"
    "try:\n"
    "    open('/tmp/probe', 'w').write('x'); print('write ok', flush=True)\n"
    "except OSError as e:\n"
    "    print('write failed', errno.errorcode[e.errno], flush=True)\n"
    "print('gpus', os.environ.get('NVIDIA_VISIBLE_DEVICES'), flush=True)\n"
    "handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory='/etc')\n"
    "http.server.ThreadingHTTPServer(('', 8080), handler).serve_forever()\n"
)


def build_images(*names: str) -> dict[str, str]:
    """Build (or reuse) images; returns {name: ref}. Minutes the first time on a fresh machine."""
    out = subprocess.run(
        ["bash", str(ROOT / "scripts" / "images" / "build.sh"), *names],
        capture_output=True, text=True, check=False, timeout=3600,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    return {line.split()[0]: line.split()[1] for line in out.stdout.splitlines() if line.strip()}


@pytest.fixture(scope="module")
def images() -> dict[str, str]:
    if realnode.missing_prerequisites():
        subprocess.run(["bash", str(ROOT / "scripts" / "devcluster" / "setup_node.sh")], check=True)
    return build_images("pause", "operator")


@pytest.fixture(scope="module")
def real(images: dict[str, str]) -> Iterator[devcluster.Cluster]:
    c = devcluster.Cluster(real_node=True)
    try:
        c.start()
        c.kubectl("apply", "-f", str(CRD))
        devcluster.wait_established(c.kubectl, "-f", str(CRD))
        c.start_controller_manager()
        c.start_real_node(gpus=2)
        yield c
    finally:
        c.stop()


@pytest.fixture
def ns(real: devcluster.Cluster) -> Iterator[str]:
    name = f"rn-{uuid.uuid4().hex[:6]}"
    real.create_namespace(name)
    yield name
    real.kubectl("delete", "namespace", name, "--wait=false", check=False)


def apply(c: devcluster.Cluster, ns: str, obj: dict[str, Any]) -> None:
    path = c.state_dir / f"obj-{uuid.uuid4().hex[:6]}.json"
    path.write_text(json.dumps(obj))
    c.kubectl("apply", "-n", ns, "-f", str(path))


def wait_for(what: str, fn: Callable[[], Any], timeout: float = 120.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = fn()
        if got:
            return got
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def pod(c: devcluster.Cluster, ns: str, name: str) -> dict[str, Any]:
    return c.get_json(f"/api/v1/namespaces/{ns}/pods/{name}") or {}


def probe_pod(name: str, image: str, *, read_only: bool, gpus: int = 0) -> dict[str, Any]:
    resources: dict[str, Any] = {"limits": {"memory": "128Mi"}}
    if gpus:
        resources["limits"]["nvidia.com/gpu"] = str(gpus)
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            # No nodeName: the real kube-scheduler places it (GPU label + extended resource).
            "nodeSelector": {"nvidia.com/gpu.product": realnode.GPU_PRODUCT} if gpus else {},
            "securityContext": {"runAsNonRoot": True, "runAsUser": UID, "runAsGroup": UID,
                                "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{
                "name": "probe", "image": image, "imagePullPolicy": "Never",
                "command": ["python3", "-c", PROBE], "ports": [{"containerPort": 8080}],
                "resources": resources,
                "securityContext": {"readOnlyRootFilesystem": read_only,
                                    "allowPrivilegeEscalation": False,
                                    "capabilities": {"drop": ["ALL"]}},
            }],
        },
    }  # fmt: skip


def logs(c: devcluster.Cluster, ns: str, name: str) -> str:
    return c.kubectl("logs", "-n", ns, name, check=False).stdout


def running(c: devcluster.Cluster, ns: str, name: str) -> bool:
    return pod(c, ns, name).get("status", {}).get("phase") == "Running"


def test_node_is_real_with_fake_gpus(real: devcluster.Cluster) -> None:
    node = real.get_json(f"/api/v1/nodes/{real.node.name}") or {}
    info = node["status"]["nodeInfo"]
    assert info["containerRuntimeVersion"].startswith("containerd://")
    assert info["kubeletVersion"] == "v1.20.2"
    assert node["status"]["allocatable"]["nvidia.com/gpu"] == "2"
    labels = node["metadata"]["labels"]
    assert labels["nvidia.com/gpu.product"] == realnode.GPU_PRODUCT
    assert labels["nvidia.com/gpu.count"] == "2"


def test_scheduled_pod_runs_as_declared_uid_with_read_only_root(
    real: devcluster.Cluster, ns: str, images: dict[str, str]
) -> None:
    apply(real, ns, probe_pod("ro", images["operator"], read_only=True, gpus=1))
    apply(real, ns, probe_pod("rw", images["operator"], read_only=False))
    for name in ("ro", "rw"):
        wait_for(
            f"pod {name} running",
            lambda n=name: running(real, ns, n) and "gpus" in logs(real, ns, n),
        )
    ro = pod(real, ns, "ro")
    assert ro["spec"]["nodeName"] == real.node.name
    events = real.kubectl("get", "events", "-n", ns, "-o", "json").stdout
    scheduled = [
        e for e in json.loads(events)["items"]
        if e["reason"] == "Scheduled" and e["involvedObject"]["name"] == "ro"
    ]  # fmt: skip
    # The 1.20 scheduler reports through events.k8s.io (reportingController), older ones in source.
    assert scheduled
    assert "default-scheduler" in (
        scheduled[0].get("reportingComponent"),
        scheduled[0].get("source", {}).get("component"),
    )
    out = logs(real, ns, "ro")
    assert f"uid {UID} gid {UID}" in out
    assert "write failed EROFS" in out  # the kernel refuses: read-only root filesystem
    assert "gpus FAKE-GPU-" in out  # the device plugin's Allocate reached the container
    # The same image and uid without readOnlyRootFilesystem can write there: the check can fail.
    assert "write ok" in logs(real, ns, "rw")
    # kubectl exec goes API server -> kubelet with the API server's client certificate.
    exec_id = real.kubectl("exec", "-n", ns, "ro", "--", "id", "-u").stdout.strip()
    assert exec_id == str(UID)


def test_too_many_gpus_unschedulable_by_the_real_scheduler(
    real: devcluster.Cluster, ns: str, images: dict[str, str]
) -> None:
    apply(real, ns, probe_pod("greedy", images["operator"], read_only=True, gpus=3))

    def unschedulable() -> str:
        conds = pod(real, ns, "greedy").get("status", {}).get("conditions", [])
        return next((c.get("message", "") for c in conds if c.get("reason") == "Unschedulable"), "")

    assert "Insufficient nvidia.com/gpu" in wait_for("Unschedulable", unschedulable, 60)


def test_service_traffic_reaches_pod_through_kube_proxy(
    real: devcluster.Cluster, ns: str, images: dict[str, str]
) -> None:
    apply(real, ns, probe_pod("web", images["operator"], read_only=True))
    apply(real, ns, {
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"},
        "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]},
    })  # fmt: skip
    wait_for("web running", lambda: running(real, ns, "web"))
    vip = (real.get_json(f"/api/v1/namespaces/{ns}/services/web") or {})["spec"]["clusterIP"]
    client = probe_pod("client", images["operator"], read_only=True)
    client["spec"]["restartPolicy"] = "Never"
    client["spec"]["containers"][0]["command"] = [
        "python3", "-c",
        "import time, urllib.request\n"
        "for _ in range(30):\n"
        "    try:\n"
        f"        print(urllib.request.urlopen('http://{vip}/hostname', timeout=5).read().decode()); break\n"
        "    except OSError as e:\n"
        "        print('retry', e, flush=True); time.sleep(1)\n"
        "else:\n"
        "    raise SystemExit(1)\n",
    ]  # fmt: skip
    apply(real, ns, client)
    phase = wait_for(
        "client done",
        lambda: (
            pod(real, ns, "client").get("status", {}).get("phase") in ("Succeeded", "Failed")
            and pod(real, ns, "client")["status"]["phase"]
        ),
    )
    assert phase == "Succeeded", logs(real, ns, "client")
    assert "web" in logs(real, ns, "client").split()  # the server pod's /etc/hostname


def test_kubelet_refuses_unauthenticated_and_unauthorized(
    real: devcluster.Cluster, ns: str
) -> None:
    url = f"https://{real.node.ip}:10250/pods"
    ctx = ssl.create_default_context(cafile=str(real.ca_cert))

    def status(token: str | None) -> int:
        req = urllib.request.Request(
            url, headers={"Authorization": f"Bearer {token}"} if token else {}
        )
        try:
            with urllib.request.urlopen(req, context=ctx, timeout=10) as r:
                return int(r.status)
        except urllib.error.HTTPError as e:
            return int(e.code)

    assert status(None) == 401  # anonymous auth is off
    sa = wait_for(
        "sa token",
        lambda: (real.get_json(f"/api/v1/namespaces/{ns}/serviceaccounts/default") or {}).get(
            "secrets"
        ),
    )
    secret = real.get_json(f"/api/v1/namespaces/{ns}/secrets/{sa[0]['name']}") or {}
    import base64

    token = base64.b64decode(secret["data"]["token"]).decode()
    assert status(token) == 403  # authenticated by TokenReview, refused by SubjectAccessReview
    assert status(real.admin_token) == 200


def test_memory_limit_is_enforced_by_the_kernel(
    real: devcluster.Cluster, ns: str, images: dict[str, str]
) -> None:
    hog = probe_pod("hog", images["operator"], read_only=True)
    hog["spec"]["restartPolicy"] = "Never"
    hog["spec"]["containers"][0]["resources"] = {"limits": {"memory": "48Mi"}}
    hog["spec"]["containers"][0]["command"] = [
        "python3", "-c", "b = bytearray(256 * 1024 * 1024); print('survived', flush=True)",
    ]  # fmt: skip
    apply(real, ns, hog)

    def terminated() -> dict[str, Any]:
        st = pod(real, ns, "hog").get("status", {}).get("containerStatuses") or [{}]
        return dict(st[0].get("state", {}).get("terminated") or {})

    state = wait_for("hog terminated", terminated)
    assert state["reason"] == "OOMKilled"
    assert state["exitCode"] == 137


def small_demo() -> dict[str, Any]:
    """examples/demo.yaml cut to two short trials (the tuner's CPU time on this machine)."""
    import yaml

    obj: dict[str, Any] = yaml.safe_load((ROOT / "examples" / "demo.yaml").read_text())
    spec = obj["spec"]
    spec["traffic"].update(
        numRequests=8,
        warmupRequests=1,
        rate=5,
        promptTokens={"distribution": "uniform", "min": 32, "max": 64},
    )
    spec["search"].update(
        quantizations=["fp32"],
        maxNumSeqs={"values": [2, 8]},
        maxNumBatchedTokens={"values": [128]},
        kvBlockSizes=[16],
    )
    spec["budget"].update(maxTrials=2, trialTimeout="120s")
    spec.pop("quality", None)
    spec["retune"] = {"checkInterval": "15s", "violationWindow": "30s", "cooldown": "10m"}
    return obj  # fmt: skip


# Slow for now: it rebuilds the tuner image (~13 min on 2 cores) whenever operator/ or tuner/
# changes, and it has not yet passed end to end under pytest. Its two blockers are fixed (no passwd
# entry for uid 65532 in the images; 'Bearer bearer' in-cluster login, k8s.connection_info); the
# same steps by hand (chart operator Ready as uid 65532, a 2-trial tuning Job Succeeded, trials in
# `kubectl logs`) worked on the real node.
@pytest.mark.slow
def test_chart_operator_and_tuning_job_run_as_containers(
    real: devcluster.Cluster, ns: str, images: dict[str, str], tmp_path: Path
) -> None:
    import yaml
    from chartlib import CHART, helm

    images = {**images, **build_images("tuner")}
    real.node.import_images()

    def image(ref: str) -> dict[str, str]:
        repo, tag = ref.rsplit(":", 1)
        return {"repository": repo, "tag": tag, "pullPolicy": "Never"}

    # The chart's defaults, plus the images built here (nothing can be pulled).
    values = {
        "operator": {"replicaCount": 1, "image": image(images["operator"]), "verbose": True},
        "tuner": {"image": image(images["tuner"])},
        "engines": {"builtin": {"image": {k: v for k, v in image(images["tuner"]).items() if k != "pullPolicy"}}},
    }  # fmt: skip
    (tmp_path / "values.yaml").write_text(yaml.safe_dump(values))
    release_ns = f"{ns}-system"
    real.kubectl("create", "namespace", release_ns)
    kube = ["--kubeconfig", str(real.kubeconfig)]
    helm("install", "it", str(CHART), "-n", release_ns, "-f", str(tmp_path / "values.yaml"), *kube)
    try:

        def operator_pod() -> dict[str, Any] | None:
            pods = json.loads(real.kubectl("get", "pods", "-n", release_ns, "-o", "json").stdout)[
                "items"
            ]
            ready = [p for p in pods if any(c["type"] == "Ready" and c["status"] == "True"
                                            for c in p["status"].get("conditions", []))]  # fmt: skip
            return ready[0] if ready else None

        op = wait_for("the operator pod Ready (a container from the chart)", operator_pod, 180)
        assert op["spec"]["nodeName"] == real.node.name
        op_id = real.kubectl("exec", "-n", release_ns, op["metadata"]["name"], "--", "id", "-u")
        assert op_id.stdout.strip() == str(UID)
        apply(real, ns, small_demo())

        def tuning_pod() -> dict[str, Any] | None:
            items = json.loads(
                real.kubectl("get", "pods", "-n", ns, "-l", "job-name", "-o", "json").stdout
            )["items"]
            return next((p for p in items if p["spec"].get("nodeName")), None)

        tp = wait_for("a tuning pod on the real node", tuning_pod, 120)
        assert tp["spec"]["nodeName"] == real.node.name
        container = tp["spec"]["containers"][0]
        assert container["image"] == images["tuner"]
        sc = {
            **(tp["spec"].get("securityContext") or {}),
            **(container.get("securityContext") or {}),
        }
        assert sc.get("runAsNonRoot") is True and sc.get("readOnlyRootFilesystem") is True

        def tuned() -> dict[str, Any] | None:
            obj = (
                real.get_json(
                    f"/apis/infertune.dev/v1alpha1/namespaces/{ns}/inferenceservices/tiny-demo"
                )
                or {}
            )
            run = (obj.get("status") or {}).get("tuning") or {}
            return obj if run.get("finishedAt") else None

        try:
            obj = wait_for("the tuning run to finish", tuned, 600)
        except AssertionError:
            log = real.kubectl("logs", "-n", release_ns, op["metadata"]["name"], check=False).stdout
            raise AssertionError(f"operator log:\n{log[-3000:]}") from None
        name = tp["metadata"]["name"]
        log = real.kubectl("logs", "-n", ns, name, check=False).stdout
        assert "trial" in log.lower(), log[-2000:]
        status = (real.get_json(f"/api/v1/namespaces/{ns}/pods/{name}") or {})["status"]
        assert status["phase"] == "Succeeded", status
        assert obj["status"]["tuning"].get("trialsCompleted", 0) >= 1, obj["status"]

        # A memory limit too small for the pod: the kernel kills it, the operator says so.
        starved = small_demo()
        starved["metadata"]["name"] = "starved"
        starved["spec"]["hardware"]["memory"] = "64Mi"
        apply(real, ns, starved)

        def oom_reported() -> dict[str, Any] | None:
            obj = (
                real.get_json(
                    f"/apis/infertune.dev/v1alpha1/namespaces/{ns}/inferenceservices/starved"
                )
                or {}
            )
            conds = (obj.get("status") or {}).get("conditions") or []
            return next(
                (c for c in conds if c["type"] == "MemoryFits" and c["reason"] == "OOMKilled"), None
            )

        try:
            cond = wait_for("MemoryFits=False/OOMKilled on the starved service", oom_reported, 240)
        except AssertionError:
            obj = (
                real.get_json(
                    f"/apis/infertune.dev/v1alpha1/namespaces/{ns}/inferenceservices/starved"
                )
                or {}
            )
            pods = real.kubectl("get", "pods", "-n", ns, "-o", "wide").stdout
            raise AssertionError(
                f"status: {json.dumps(obj.get('status'))[:2500]}\n{pods}"
            ) from None
        assert (
            cond["status"] == "False"
            and "OOMKilled" in cond["message"]
            and "64Mi" in cond["message"]
        )
        events = json.loads(real.kubectl("get", "events", "-n", ns, "-o", "json").stdout)["items"]
        assert any(e["reason"] == "OOMKilled" and e["type"] == "Warning" for e in events)
    finally:
        helm("uninstall", "it", "-n", release_ns, *kube, check=False)
        real.kubectl("delete", "namespace", release_ns, "--wait=false", check=False)


def test_stop_leaves_nothing_on_the_host(real: devcluster.Cluster) -> None:
    state = real.state_dir
    real.stop(keep_state=True)
    try:
        assert realnode.leftovers(state) == {
            "processes": [], "mounts": [], "links": [], "iptables": [], "cgroups": [], "files": [],
        }  # fmt: skip
        assert not any(os.scandir("/run/containerd")) if Path("/run/containerd").is_dir() else True
    finally:
        import shutil

        shutil.rmtree(state, ignore_errors=True)
