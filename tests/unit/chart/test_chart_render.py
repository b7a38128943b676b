"""`helm lint` / `helm template` for the defaults and every documented option, and what the
rendered manifests promise: strict schema validity, hardened pods, least-privilege accounts, and
operator flags the real `infertune operator` parser accepts."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
from chartlib import (
    CHART,
    NAMESPACE,
    OFFLINE_KUBE_VERSION,
    OPTIONS,
    ROOT,
    by_kind,
    helm,
    one,
    render,
)

# Custom resources kubernetes-validate has no schema for: kopf's peering objects (their CRD keeps
# unknown fields) and the Prometheus Operator's monitors. Everything else must validate strictly.
CUSTOM_KINDS = {"ClusterKopfPeering", "KopfPeering", "ServiceMonitor", "PodMonitor"}
POD_OWNERS = {"Deployment", "StatefulSet", "DaemonSet", "Job"}


def _values_file(tmp_path: Path, values: dict[str, Any]) -> Path:
    import yaml

    path = tmp_path / "lint-values.yaml"
    path.write_text(yaml.safe_dump(values))
    return path


@pytest.mark.parametrize("option", sorted(OPTIONS))
def test_helm_lint_passes(option: str, tmp_path: Path) -> None:
    values, _ = OPTIONS[option]
    proc = helm("lint", "--strict", str(CHART), "-f", str(_values_file(tmp_path, values)))
    assert "0 chart(s) failed" in proc.stdout, proc.stdout


@pytest.mark.parametrize("option", sorted(OPTIONS))
def test_every_manifest_validates_strictly(option: str, tmp_path: Path) -> None:
    values, apis = OPTIONS[option]
    manifests = render(values, tmp=tmp_path, api_versions=apis)
    unvalidated = set()
    for m in manifests:
        if m["kind"] in CUSTOM_KINDS:
            unvalidated.add(m["kind"])
            continue
        where = f"{m['kind']}/{m['metadata']['name']}"
        try:
            kubernetes_validate.validate(m, OFFLINE_KUBE_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(
                f"{option}: {where} is invalid for Kubernetes {OFFLINE_KUBE_VERSION}: {exc}"
            )
    assert unvalidated <= CUSTOM_KINDS


def _pod_specs(manifests: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    return [
        (f"{m['kind']}/{m['metadata']['name']}", m["spec"]["template"]["spec"])
        for m in manifests
        if m["kind"] in POD_OWNERS
    ]


@pytest.mark.parametrize("option", sorted(OPTIONS))
def test_every_pod_is_hardened(option: str, tmp_path: Path) -> None:
    values, apis = OPTIONS[option]
    pods = _pod_specs(render(values, tmp=tmp_path, api_versions=apis))
    assert pods, "the chart renders at least the operator Deployment"
    for where, pod in pods:
        psc = pod["securityContext"]
        assert psc["runAsNonRoot"] is True, where
        assert psc["runAsUser"] > 0, where
        assert psc["seccompProfile"] == {"type": "RuntimeDefault"}, where
        for c in pod["containers"]:
            sc = c["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False, (where, c["name"])
            assert sc["readOnlyRootFilesystem"] is True, (where, c["name"])
            assert sc["capabilities"]["drop"] == ["ALL"], (where, c["name"])
            assert "add" not in sc["capabilities"], (where, c["name"])
            assert c["resources"]["requests"] and c["resources"]["limits"]["memory"], where
            assert c["readinessProbe"] and c["livenessProbe"], (where, c["name"])
            image = c["image"]
            assert not image.endswith(":latest") and (
                ":" in image.rsplit("/", 1)[-1] or "@" in image
            )


def test_operator_deployment_defaults(tmp_path: Path) -> None:
    manifests = render(tmp=tmp_path)
    dep = one(manifests, "Deployment", "-operator")
    pod = dep["spec"]["template"]["spec"]
    assert dep["spec"]["replicas"] == 2
    assert (
        pod["serviceAccountName"]
        == one(manifests, "ServiceAccount", "-operator")["metadata"]["name"]
    )
    container = pod["containers"][0]
    assert container["command"] == ["infertune", "operator"]
    assert "--all-namespaces" in container["args"]
    peering = one(manifests, "ClusterKopfPeering")
    assert f"--peering={peering['metadata']['name']}" in container["args"]
    # The read-only root filesystem needs a writable /tmp.
    assert {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"]
    pdb = one(manifests, "PodDisruptionBudget")
    assert pdb["spec"]["minAvailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"] == dep["spec"]["selector"]["matchLabels"]
    svc = one(manifests, "Service", "-operator-metrics")
    assert svc["spec"]["selector"] == dep["spec"]["template"]["metadata"]["labels"]


def _operator_settings(manifests: list[dict[str, Any]]) -> Any:
    from infertune.operator.settings import parse_settings

    container = one(manifests, "Deployment", "-operator")["spec"]["template"]["spec"]["containers"][
        0
    ]
    settings, _ = parse_settings(container["args"])
    return settings


def test_operator_flags_are_accepted_by_the_operator(tmp_path: Path) -> None:
    """The chart's args go through the operator's real argument parser and mean what values say."""
    manifests = render(tmp=tmp_path)
    settings = _operator_settings(manifests)
    assert settings.all_namespaces and not settings.namespaces
    assert settings.tuner_image == "infertune/tuner-full:0.1.0"
    assert settings.image_for("builtin") == "infertune/engine:0.1.0"
    assert settings.image_for("vllm") == "infertune/tuner-full:0.1.0"
    assert settings.image_for("sglang") == "infertune/tuner-full:0.1.0"
    assert settings.image_for("llamacpp") == "infertune/tuner:0.1.0"
    # Cluster-wide, Jobs use each namespace's default account (no token mounted, no rights).
    assert settings.tuning_service_account is None
    assert settings.storage_secret is None and settings.prometheus_url is None
    assert settings.metrics_port == 8080 and settings.health_port == 8081


def test_options_reach_the_operator(tmp_path: Path) -> None:
    ext = _operator_settings(render(OPTIONS["external-storage"][0], tmp=tmp_path))
    assert ext.storage_secret_ref == ("studies-db", "dsn")
    prom = _operator_settings(render(*OPTIONS["prometheus-and-monitors"][:1], tmp=tmp_path))
    assert prom.prometheus_url == "http://prometheus-operated.monitoring.svc:9090"
    local = _operator_settings(render(OPTIONS["local-process-cluster"][0], tmp=tmp_path))
    assert local.infertune_command == ("/opt/venv/bin/infertune",)
    ns = _operator_settings(render(OPTIONS["watch-namespaces"][0], tmp=tmp_path))
    assert ns.namespaces == ("team-a", "team-b") and not ns.all_namespaces
    assert ns.tuning_service_account == "it-infertune-tuner"
    reg = _operator_settings(render(OPTIONS["private-registry-and-digests"][0], tmp=tmp_path))
    assert (
        reg.image_for("vllm")
        == "registry.example.internal:5000/mirror/infertune/tuner-full:v0.10.2"
    )
    assert (
        reg.tuner_image == "registry.example.internal:5000/mirror/infertune/tuner-full:0.1.0-cuda"
    )


def test_tuner_account_has_no_rights_and_no_token(tmp_path: Path) -> None:
    manifests = render(OPTIONS["watch-namespaces"][0], tmp=tmp_path)
    tuners = [
        m for m in by_kind(manifests, "ServiceAccount") if m["metadata"]["name"].endswith("-tuner")
    ]
    # Jobs run in the InferenceService's namespace: the account exists in each watched one.
    assert sorted(m["metadata"]["namespace"] for m in tuners) == sorted(
        [NAMESPACE, "team-a", "team-b"]
    )
    assert all(m["automountServiceAccountToken"] is False for m in tuners)
    bound = {
        s["name"]
        for m in by_kind(manifests, "RoleBinding") + by_kind(manifests, "ClusterRoleBinding")
        for s in m["subjects"]
    }
    assert tuners[0]["metadata"]["name"] not in bound


def test_watch_namespaces_scopes_rbac_and_peering(tmp_path: Path) -> None:
    manifests = render(OPTIONS["watch-namespaces"][0], tmp=tmp_path)
    roles = by_kind(manifests, "Role")
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["team-a", "team-b"]
    cluster_role = one(manifests, "ClusterRole")
    cluster_resources = {res for rule in cluster_role["rules"] for res in rule["resources"]}
    namespaced_resources = {res for rule in roles[0]["rules"] for res in rule["resources"]}
    assert "inferenceservices" in namespaced_resources
    assert "inferenceservices" not in cluster_resources
    assert "nodes" in cluster_resources  # GPU product labels are read from Nodes (cluster-scoped)
    peerings = by_kind(manifests, "KopfPeering")
    assert sorted(p["metadata"]["namespace"] for p in peerings) == ["team-a", "team-b"]
    assert not by_kind(manifests, "ClusterKopfPeering")


def test_bundled_postgresql(tmp_path: Path) -> None:
    manifests = render(OPTIONS["bundled-postgresql"][0], tmp=tmp_path)
    sts = one(manifests, "StatefulSet", "-postgresql")
    pod = sts["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsUser"] == 999
    image = pod["containers"][0]["image"]
    assert image.startswith("postgres:") and image != "postgres:latest"
    claim = sts["spec"]["volumeClaimTemplates"][0]["spec"]
    assert claim["resources"]["requests"]["storage"] == "5Gi"
    assert claim["storageClassName"] == "fast"
    secrets = [
        m for m in by_kind(manifests, "Secret") if m["metadata"]["name"].endswith("-postgresql")
    ]
    assert sorted(s["metadata"]["namespace"] for s in secrets) == sorted([NAMESPACE, "team-a"])
    urls = {base64.b64decode(s["data"]["url"]).decode() for s in secrets}
    assert len(urls) == 1, "every namespace gets the same URL"
    url = urls.pop()
    password = base64.b64decode(secrets[0]["data"]["password"]).decode()
    assert len(password) == 32
    assert url == (
        f"postgresql+psycopg2://infertune:{password}@"
        f"{sts['metadata']['name']}.{NAMESPACE}.svc:5432/infertune"
    )
    settings = _operator_settings(manifests)
    assert settings.storage_secret_ref == (secrets[0]["metadata"]["name"], "url")


def test_postgresql_claim_retention_follows_kubernetes_version(tmp_path: Path) -> None:
    values = {"storage": {"type": "postgresql"}}
    new = one(render(values, tmp=tmp_path, kube_version="1.30.0"), "StatefulSet")
    assert new["spec"]["persistentVolumeClaimRetentionPolicy"]["whenDeleted"] == "Delete"
    old = one(render(values, tmp=tmp_path, kube_version="1.20.2"), "StatefulSet")
    assert "persistentVolumeClaimRetentionPolicy" not in old["spec"]


def test_pdb_api_follows_kubernetes_version(tmp_path: Path) -> None:
    assert (
        one(render(tmp=tmp_path, kube_version="1.20.2"), "PodDisruptionBudget")["apiVersion"]
        == "policy/v1beta1"
    )
    assert (
        one(render(tmp=tmp_path, kube_version="1.21.0"), "PodDisruptionBudget")["apiVersion"]
        == "policy/v1"
    )


def test_monitors_only_when_the_prometheus_operator_is_there(tmp_path: Path) -> None:
    values, apis = OPTIONS["prometheus-and-monitors"]
    with_crds = render(values, tmp=tmp_path, api_versions=apis)
    sm = one(with_crds, "ServiceMonitor")
    assert sm["metadata"]["labels"]["release"] == "kube-prometheus"
    assert sm["spec"]["endpoints"][0]["port"] == "metrics"
    pm = one(with_crds, "PodMonitor")
    # Serving pods are labelled by the operator's builders.
    from infertune.operator.builders.common import LABEL_COMPONENT, LABEL_MANAGED, MANAGED_BY

    assert pm["spec"]["selector"]["matchLabels"] == {
        LABEL_MANAGED: MANAGED_BY,
        LABEL_COMPONENT: "serving",
    }
    without = render(values, tmp=tmp_path)
    assert not by_kind(without, "ServiceMonitor") and not by_kind(without, "PodMonitor")


def test_chart_crd_is_the_generated_one() -> None:
    chart_crd = CHART / "crds" / "inferenceservices.infertune.dev.yaml"
    assert (
        chart_crd.read_bytes()
        == (ROOT / "crds" / "inferenceservices.infertune.dev.yaml").read_bytes()
    )


def test_crds_are_rendered_for_install(tmp_path: Path) -> None:
    names = {
        m["metadata"]["name"] for m in by_kind(render(tmp=tmp_path), "CustomResourceDefinition")
    }
    assert names == {
        "inferenceservices.infertune.dev",
        "clusterkopfpeerings.kopf.dev",
        "kopfpeerings.kopf.dev",
    }
