"""The chart grants the operator exactly the rules in infertune.operator.rbac, no more."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

from chartlib import OPTIONS, ROOT, by_kind, one, render

from infertune.operator import rbac


def _triples(rules: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
    return {
        (group, resource, verb)
        for rule in rules
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def test_generated_files_are_up_to_date() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "chart_rbac.py"), "--check"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr


def test_cluster_wide_role_equals_the_operators_rules(tmp_path: Path) -> None:
    manifests = render(tmp=tmp_path)
    role = one(manifests, "ClusterRole")
    assert _triples(role["rules"]) == _triples(rbac.policy_rules())
    binding = one(manifests, "ClusterRoleBinding")
    account = one(manifests, "ServiceAccount", "-operator")["metadata"]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account["name"], "namespace": account["namespace"]}
    ]


def test_namespaced_install_grants_the_same_rules_split_by_scope(tmp_path: Path) -> None:
    manifests = render(OPTIONS["watch-namespaces"][0], tmp=tmp_path)
    cluster = _triples(one(manifests, "ClusterRole")["rules"])
    for role in by_kind(manifests, "Role"):
        namespaced = _triples(role["rules"])
        # Together they are the operator's rules; the ClusterRole holds only cluster-scoped kinds.
        assert namespaced | cluster == _triples(rbac.policy_rules())
        assert not {r for _, r, _ in cluster} & {r for _, r, _ in namespaced}
        assert {r for _, r, _ in cluster} <= {
            "nodes",
            "namespaces",
            "customresourcedefinitions",
            "clusterkopfpeerings",
        }


def test_no_secret_access_and_no_wildcards(tmp_path: Path) -> None:
    """The storage URL reaches Jobs by Secret reference; the operator itself never reads Secrets."""
    for option in ("defaults", "watch-namespaces", "bundled-postgresql"):
        manifests = render(OPTIONS[option][0], tmp=tmp_path)
        for role in by_kind(manifests, "ClusterRole") + by_kind(manifests, "Role"):
            triples = _triples(role["rules"])
            assert not any("*" in t for t in triples), role["metadata"]["name"]
            assert not any(resource == "secrets" for _, resource, _ in triples)


def test_rbac_create_false_renders_no_rbac(tmp_path: Path) -> None:
    manifests = render(OPTIONS["existing-service-accounts"][0], tmp=tmp_path)
    for kind in ("ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "ServiceAccount"):
        assert not by_kind(manifests, kind), kind
    pod = one(manifests, "Deployment")["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "infertune-op"
