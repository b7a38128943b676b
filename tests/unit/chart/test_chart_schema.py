"""Bad values are refused before anything reaches the cluster, with the key and the fix named."""

from __future__ import annotations

import pytest
from chartlib import CHART, helm

# (--set overrides, substrings the error must contain)
BAD_VALUES: list[tuple[list[str], list[str]]] = [
    (["storage.type=mysql"], ["/storage/type", "'sqlite', 'external', 'postgresql'"]),
    (["storage.type=external"], ["storage.type=external needs storage.url.secretName"]),
    (["storage.url.secretName=db"], ["storage.url.secretName is set but storage.type=sqlite"]),
    # The URL carries a password: a plain string is refused, a Secret reference is asked for.
    (["storage.url=postgresql://u:p@db/studies"], ["/storage/url", "want object"]),
    (["operator.replicaCount=two"], ["/operator/replicaCount", "want integer"]),
    (["operator.replicaCount=9"], ["/operator/replicaCount", "maximum"]),
    (
        ["operator.replicaCount=2", "operator.peering.enabled=false"],
        ["operator.replicaCount=2 needs operator.peering.enabled=true"],
    ),
    (["operator.image.tag=latest"], ["operator.image.tag=latest is not allowed", "pin a version"]),
    (["engines.sglang.image.tag=latest"], ["engines.sglang.image.tag=latest is not allowed"]),
    (["operator.image.digest=sha256:abc"], ["/operator/image/digest", "does not match pattern"]),
    (["engines.tgi.image.repository=tgi"], ["/engines", "additional properties 'tgi' not allowed"]),
    (["operator.watchNamespaces[0]=Team_A"], ["/operator/watchNamespaces/0", "'Team_A'"]),
    (["prometheus.url=prometheus:9090"], ["/prometheus/url", "'prometheus:9090'"]),
    (["operator.metricsPort=70000"], ["/operator/metricsPort", "maximum"]),
    (
        ["operator.resources.requests.memory=lots"],
        ["/operator/resources/requests/memory", "'lots'"],
    ),
    (["podSecurityContext.runAsNonRoot=false"], ["/podSecurityContext/runAsNonRoot"]),
    (
        ["securityContext.allowPrivilegeEscalation=true"],
        ["/securityContext/allowPrivilegeEscalation"],
    ),
    (["operator.extraArgs[0]=verbose"], ["/operator/extraArgs/0", "'verbose'"]),
    (["operator.replicas=3"], ["/operator", "additional properties 'replicas' not allowed"]),
    (
        ["storage.postgresql.persistence.size=2GB"],
        ["/storage/postgresql/persistence/size", "'2GB'"],
    ),
    (["metrics.serviceMonitor.interval=often"], ["/metrics/serviceMonitor/interval", "'often'"]),
]


@pytest.mark.parametrize(
    ("overrides", "expected"), BAD_VALUES, ids=[" ".join(o) for o, _ in BAD_VALUES]
)
def test_bad_values_are_rejected_with_a_clear_message(
    overrides: list[str], expected: list[str]
) -> None:
    args = ["template", "bad", str(CHART)]
    for item in overrides:
        args += ["--set", item]
    proc = helm(*args, check=False)
    assert proc.returncode != 0, f"{overrides} rendered without error"
    for text in expected:
        assert text in proc.stderr, f"{overrides}: {text!r} not in:\n{proc.stderr}"


def test_lint_reports_schema_errors_too() -> None:
    proc = helm("lint", str(CHART), "--set", "storage.type=mysql", check=False)
    assert proc.returncode != 0
    assert "/storage/type" in proc.stdout + proc.stderr


@pytest.mark.parametrize(
    "overrides",
    [
        ["operator.replicaCount=1", "operator.peering.enabled=false"],
        ["operator.replicaCount=0"],
        ["storage.type=external", "storage.url.secretName=db"],
        ["operator.image.digest=sha256:" + "0" * 64],
        ["engines.vllm.image.tag=v0.9.2"],
    ],
)
def test_good_values_pass(overrides: list[str]) -> None:
    args = ["template", "good", str(CHART)]
    for item in overrides:
        args += ["--set", item]
    assert helm(*args, check=False).returncode == 0
