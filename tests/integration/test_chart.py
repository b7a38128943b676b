"""The Helm chart against the real control plane: every rendered manifest passes the API server's
server-side dry run; `helm install` runs the operator from the chart's own Deployment spec under
the chart's ServiceAccount (RBAC on), it reconciles an example, and `helm uninstall` leaves only
what the user created.

The node agent runs a pod's command as a local process, so the install points the operator's
command at this checkout's virtualenv and hands it a kubeconfig holding the chart ServiceAccount's
token (mounted from a Secret; a local process cannot see the kubelet's token mount).
"""

from __future__ import annotations

import base64
import json
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from chartlib import CHART, OPTIONS, helm, split_manifests, template_text  # tests/unit/chart
from devcluster import wait_established  # scripts/devcluster

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.cluster
INFERTUNE = ROOT / ".venv" / "bin" / "infertune"
CUSTOM_KINDS_ABSENT_HERE = {
    "ServiceMonitor",
    "PodMonitor",
}  # no Prometheus Operator in the test cluster


def _wait(what: str, check: Callable[[], Any], timeout: float = 90.0, every: float = 0.5) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what} (last: {last!r})")


def _get(cluster: Any, *args: str) -> dict[str, Any]:
    return json.loads(cluster.kubectl("get", *args, "-o", "json").stdout)  # type: ignore[no-any-return]


def _server_version(cluster: Any) -> str:
    info = cluster.get_json("/version")
    return str(info["gitVersion"]).lstrip("v").split("+")[0].split("-")[0]


def _kube_env(cluster: Any) -> list[str]:
    return ["--kubeconfig", str(cluster.kubeconfig)]


def _apply_chart_crds(cluster: Any) -> None:
    for crd in sorted((CHART / "crds").glob("*.yaml")):
        cluster.kubectl("apply", "-f", str(crd))
        wait_established(cluster.kubectl, "-f", str(crd))


@pytest.mark.parametrize("option", sorted(OPTIONS))
def test_server_side_dry_run_accepts_every_manifest(
    cluster: Any, option: str, tmp_path: Path
) -> None:
    _apply_chart_crds(cluster)
    values, apis = OPTIONS[option]
    release_ns = f"chart-{uuid.uuid4().hex[:6]}"
    text = template_text(
        values,
        tmp=tmp_path,
        api_versions=apis,
        kube_version=_server_version(cluster),
        namespace=release_ns,
        include_crds=False,
    )
    manifests = [m for m in split_manifests(text) if m["kind"] not in CUSTOM_KINDS_ABSENT_HERE]
    namespaces = {release_ns} | {m["metadata"].get("namespace", release_ns) for m in manifests}
    for ns in sorted(namespaces):
        cluster.kubectl("create", "namespace", ns, check=False)
    try:
        for m in manifests:
            path = tmp_path / "manifest.yaml"
            path.write_text(yaml.safe_dump(m))
            proc = cluster.kubectl("apply", "--dry-run=server", "-f", str(path), check=False)
            assert proc.returncode == 0, (
                f"{option}: {m['kind']}/{m['metadata']['name']} rejected: {proc.stderr}"
            )
    finally:
        for ns in sorted(namespaces):
            cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)


def _sa_kubeconfig(cluster: Any, namespace: str, account: str) -> str:
    """A kubeconfig that authenticates as the ServiceAccount (its token Secret, Kubernetes 1.20)."""

    def token() -> str | None:
        sa = _get(cluster, "serviceaccount", account, "-n", namespace)
        for ref in sa.get("secrets") or []:
            secret = _get(cluster, "secret", ref["name"], "-n", namespace)
            if secret.get("data", {}).get("token"):
                return base64.b64decode(secret["data"]["token"]).decode()
        return None

    bearer = _wait(f"a token for {namespace}/{account}", token)
    ca = base64.b64encode(Path(cluster.ca_cert).read_bytes()).decode()
    return yaml.safe_dump(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "c",
                    "cluster": {"server": cluster.server, "certificate-authority-data": ca},
                }
            ],
            "users": [{"name": account, "user": {"token": bearer}}],
            "contexts": [{"name": "c", "context": {"cluster": "c", "user": account}}],
            "current-context": "c",
        }
    )


def _inventory(cluster: Any, namespace: str) -> set[str]:
    kinds = "deployments,replicasets,statefulsets,pods,services,serviceaccounts,secrets,configmaps,roles,rolebindings,poddisruptionbudgets,jobs,kopfpeerings"
    items = _get(cluster, kinds, "-n", namespace)["items"]
    return {f"{i['kind']}/{i['metadata']['name']}" for i in items}


def _cluster_inventory(cluster: Any, release: str) -> set[str]:
    kinds = "clusterroles,clusterrolebindings,clusterkopfpeerings"
    items = _get(cluster, kinds, "-l", f"app.kubernetes.io/instance={release}")["items"]
    return {f"{i['kind']}/{i['metadata']['name']}" for i in items}


def test_install_reconcile_uninstall(cluster: Any, namespace: str, tmp_path: Path) -> None:
    from devcluster import free_port

    _apply_chart_crds(cluster)
    release = f"it{uuid.uuid4().hex[:5]}"
    release_ns = f"{release}-system"
    cluster.kubectl("create", "namespace", release_ns)
    before = _inventory(cluster, release_ns)
    values = {
        "operator": {
            # Start with no replica: the operator's kubeconfig needs the chart's account first.
            "replicaCount": 0,
            "command": [str(INFERTUNE), "operator"],
            "infertuneCommand": str(INFERTUNE),
            "verbose": True,
            # Free ports: several operators may run on this machine's loopback at once.
            "metricsPort": free_port(),
            "healthPort": free_port(),
            "extraEnv": [{"name": "KUBECONFIG", "value": "/var/run/infertune-auth/kubeconfig"}],
            "extraVolumes": [{"name": "auth", "secret": {"secretName": "operator-kubeconfig"}}],
            "extraVolumeMounts": [
                {"name": "auth", "mountPath": "/var/run/infertune-auth", "readOnly": True}
            ],
        }
    }
    values_file = tmp_path / "values.yaml"
    values_file.write_text(yaml.safe_dump(values))
    kube = _kube_env(cluster)
    helm("install", release, str(CHART), "-n", release_ns, "-f", str(values_file), *kube)
    uninstalled = False
    try:
        account = f"{release}-infertune-operator"
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(_sa_kubeconfig(cluster, release_ns, account))
        cluster.kubectl(
            "create", "secret", "generic", "operator-kubeconfig", "-n", release_ns,
            f"--from-file=kubeconfig={kubeconfig}",
        )  # fmt: skip
        user_created = {"Secret/operator-kubeconfig"}

        # The chart's account is bound to the operator's rules and no more.
        who = f"system:serviceaccount:{release_ns}:{account}"
        can = cluster.kubectl(
            "auth", "can-i", "create", "jobs", "-n", namespace, "--as", who, check=False
        )
        assert can.stdout.strip() == "yes", can.stdout + can.stderr
        cannot = cluster.kubectl(
            "auth", "can-i", "get", "secrets", "-n", namespace, "--as", who, check=False
        )
        assert cannot.stdout.strip() == "no", cannot.stdout + cannot.stderr

        helm(
            "upgrade", release, str(CHART), "-n", release_ns, "-f", str(values_file),
            "--set", "operator.replicaCount=1", *kube,
        )  # fmt: skip

        def operator_ready() -> bool:
            dep = _get(cluster, "deployment", f"{release}-infertune-operator", "-n", release_ns)
            return bool(dep.get("status", {}).get("readyReplicas") == 1)

        _wait("the operator pod to be Ready (kopf liveness endpoint)", operator_ready, timeout=120)

        # Reconcile an example: the operator validates it, writes status and starts tuning.
        cluster.kubectl("apply", "-n", namespace, "-f", str(ROOT / "examples" / "demo.yaml"))

        def reconciled() -> dict[str, Any] | None:
            isvc = _get(cluster, "inferenceservice", "tiny-demo", "-n", namespace)
            conditions = isvc.get("status", {}).get("conditions") or []
            return isvc if conditions else None

        isvc = _wait("the operator to write the InferenceService's status", reconciled, timeout=120)
        jobs = _get(cluster, "jobs", "-n", namespace)["items"]
        owned = [
            j for j in jobs
            if any(o.get("uid") == isvc["metadata"]["uid"] for o in j["metadata"].get("ownerReferences", []))
        ]  # fmt: skip
        assert owned, f"no tuning Job owned by the InferenceService; status: {isvc.get('status')}"

        helm("uninstall", release, "-n", release_ns, "--wait", "--timeout", "120s", *kube)
        uninstalled = True

        def only_user_objects_left() -> bool:
            left = _inventory(cluster, release_ns) - before - user_created
            # The ServiceAccount's token Secret goes with its ServiceAccount (token controller).
            return not left and not _cluster_inventory(cluster, release)

        _wait("helm uninstall to remove what the chart created", only_user_objects_left, timeout=90)
        # What the user created stays: their InferenceService (and its own children).
        assert _get(cluster, "inferenceservice", "tiny-demo", "-n", namespace)["metadata"]["name"]
    finally:
        if not uninstalled:
            helm("uninstall", release, "-n", release_ns, *kube, check=False)
        cluster.kubectl("delete", "namespace", release_ns, "--wait=false", check=False)
