"""The operator's RBAC rules and its command-line settings."""

from __future__ import annotations

import pytest

from infertune.operator.rbac import RULES, cluster_role, peering_crds
from infertune.operator.settings import OperatorSettings, parse_settings

VERBS = {"get", "list", "watch", "create", "update", "patch", "delete", "deletecollection"}


def test_every_rule_says_why_and_uses_real_verbs() -> None:
    for groups, resources, verbs, why in RULES:
        assert groups and resources and len(why) > 20
        assert set(verbs) <= VERBS
    role = cluster_role()
    assert role["kind"] == "ClusterRole" and len(role["rules"]) == len(RULES)


def test_no_rights_on_secrets_or_pod_creation() -> None:
    for _groups, resources, verbs, _why in RULES:
        assert (
            "secrets" not in resources
        )  # the Job references the storage Secret; the kubelet reads it
        if "pods" in resources:
            assert set(verbs) <= {"get", "list", "watch"}


def test_peering_crds_are_structural() -> None:
    for crd in peering_crds():
        version = crd["spec"]["versions"][0]
        assert version["schema"]["openAPIV3Schema"]["type"] == "object"


def test_flags_parse_into_settings() -> None:
    settings, _ = parse_settings([
        "-n", "a", "-n", "b", "--prometheus-url", "http://prom:9090", "--peering", "infertune",
        "--engine-image", "vllm=vllm/vllm-openai:v0.9.0", "--storage-secret", "db",
        "--infertune-command", "/venv/bin/python -m infertune.cli",
    ])  # fmt: skip
    assert settings.namespaces == ("a", "b") and settings.peering == "infertune"
    assert settings.image_for("vllm") == "vllm/vllm-openai:v0.9.0"
    assert settings.storage_secret_ref == ("db", "url")
    assert settings.infertune_command == ("/venv/bin/python", "-m", "infertune.cli")


def test_bad_flags_name_the_flag() -> None:
    with pytest.raises(SystemExit):
        parse_settings(["--engine-image", "vllm"])
    with pytest.raises(ValueError, match="--storage-secret"):
        OperatorSettings(storage_secret="a:b:c")
