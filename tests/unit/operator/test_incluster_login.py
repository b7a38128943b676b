"""kopf's login from in-cluster credentials: the token reaches kopf without a scheme prefix."""

from __future__ import annotations

from pathlib import Path

from kubernetes import client as k8s_client
from kubernetes.config import incluster_config

from infertune.operator.k8s import connection_info


def test_incluster_token_is_passed_to_kopf_without_the_loaders_bearer_prefix(
    tmp_path: Path,
) -> None:
    token, ca = tmp_path / "token", tmp_path / "ca.crt"
    token.write_text("eyJhbGciOi.payload.sig\n")
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    cfg = k8s_client.Configuration()
    # The kubernetes client's own in-cluster loader (it stores "bearer <token>", lower case).
    incluster_config.InClusterConfigLoader(
        token_filename=str(token), cert_filename=str(ca),
        environ={"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "443"},
    ).load_and_set(cfg)  # fmt: skip
    info = connection_info(k8s_client.ApiClient(cfg))
    assert info.scheme == "Bearer"
    assert info.token == "eyJhbGciOi.payload.sig"
