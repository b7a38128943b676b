"""Certificates and credentials for one dev control plane, made with the openssl CLI.

Each cluster instance gets its own CA, API server serving certificate, service-account signing
key pair and static bearer tokens (``--token-auth-file``), so concurrent instances never share
trust material.
"""

from __future__ import annotations

import secrets
import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Credentials:
    ca_cert: Path
    server_cert: Path
    server_key: Path
    sa_key: Path
    sa_pub: Path
    token_file: Path
    admin_token: str
    controller_manager_token: str


def _openssl(*args: str) -> None:
    proc = subprocess.run(["openssl", *args], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"openssl {' '.join(args[:2])} failed: {proc.stderr.strip()}")


def make_credentials(directory: Path) -> Credentials:
    """Create CA, serving cert (SAN 127.0.0.1/localhost/kubernetes.default.svc), SA keys, tokens."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_key, ca_cert = directory / "ca.key", directory / "ca.crt"
    key, csr, cert = (
        directory / "apiserver.key",
        directory / "apiserver.csr",
        directory / "apiserver.crt",
    )
    sa_key, sa_pub = directory / "sa.key", directory / "sa.pub"
    ext = directory / "apiserver.ext"
    _openssl("genrsa", "-out", str(ca_key), "2048")
    _openssl(
        "req", "-x509", "-new", "-nodes", "-key", str(ca_key), "-subj", "/CN=infertune-devcluster-ca",
        "-days", "30", "-out", str(ca_cert),
    )  # fmt: skip
    _openssl("genrsa", "-out", str(key), "2048")
    _openssl("req", "-new", "-key", str(key), "-subj", "/CN=kube-apiserver", "-out", str(csr))
    # Clients (kubectl, the python client, in-pod code) reach the server by IP or by service name.
    ext.write_text(
        "basicConstraints=CA:FALSE\n"
        "keyUsage=digitalSignature,keyEncipherment\n"
        "extendedKeyUsage=serverAuth\n"
        "subjectAltName=IP:127.0.0.1,IP:10.0.0.1,DNS:localhost,DNS:kubernetes,"
        "DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local\n"
    )
    _openssl(
        "x509", "-req", "-in", str(csr), "-CA", str(ca_cert), "-CAkey", str(ca_key),
        "-CAcreateserial", "-days", "30", "-extfile", str(ext), "-out", str(cert),
    )  # fmt: skip
    _openssl("genrsa", "-out", str(sa_key), "2048")
    _openssl("rsa", "-in", str(sa_key), "-pubout", "-out", str(sa_pub))
    admin_token = secrets.token_hex(24)
    kcm_token = secrets.token_hex(24)
    token_file = directory / "tokens.csv"
    # Format: token,user,uid,"group1,group2". system:masters bypasses RBAC for the admin only;
    # the controller manager runs with its own bootstrap RBAC role like in a real cluster.
    token_file.write_text(
        f'{admin_token},infertune-admin,uid-admin,"system:masters"\n'
        f"{kcm_token},system:kube-controller-manager,uid-kcm\n"
    )
    for secret in (ca_key, key, sa_key, token_file):
        secret.chmod(0o600)
    return Credentials(
        ca_cert=ca_cert,
        server_cert=cert,
        server_key=key,
        sa_key=sa_key,
        sa_pub=sa_pub,
        token_file=token_file,
        admin_token=admin_token,
        controller_manager_token=kcm_token,
    )


def kubeconfig_text(server: str, ca_cert: Path, token: str, user: str) -> str:
    """A kubeconfig with one cluster, one token user and a current context named ``devcluster``."""
    return (
        "apiVersion: v1\nkind: Config\n"
        f"clusters:\n- name: devcluster\n  cluster:\n    server: {server}\n"
        f"    certificate-authority: {ca_cert}\n"
        f"users:\n- name: {user}\n  user:\n    token: {token}\n"
        f"contexts:\n- name: devcluster\n  context:\n    cluster: devcluster\n    user: {user}\n"
        "    namespace: default\n"
        "current-context: devcluster\n"
    )
