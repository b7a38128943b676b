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
    # The API server's client certificate towards kubelets (logs, exec, port-forward, proxy).
    kubelet_client_cert: Path | None = None
    kubelet_client_key: Path | None = None
    scheduler_token: str = ""
    proxy_token: str = ""


def _openssl(*args: str) -> None:
    proc = subprocess.run(["openssl", *args], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"openssl {' '.join(args[:2])} failed: {proc.stderr.strip()}")


def sign_cert(
    directory: Path, name: str, subject: str, *, usage: str, san: str = "", days: int = 30
) -> tuple[Path, Path]:
    """A key and a certificate signed by the cluster CA in ``directory``; ``usage`` is
    ``clientAuth`` or ``serverAuth``. Returns (cert, key)."""
    key, csr, cert, ext = (directory / f"{name}{s}" for s in (".key", ".csr", ".crt", ".ext"))
    _openssl("genrsa", "-out", str(key), "2048")
    _openssl("req", "-new", "-key", str(key), "-subj", subject, "-out", str(csr))
    ext.write_text(
        "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\n"
        f"extendedKeyUsage={usage}\n" + (f"subjectAltName={san}\n" if san else "")
    )
    _openssl(
        "x509", "-req", "-in", str(csr), "-CA", str(directory / "ca.crt"),
        "-CAkey", str(directory / "ca.key"), "-CAcreateserial", "-days", str(days),
        "-extfile", str(ext), "-out", str(cert),
    )  # fmt: skip
    key.chmod(0o600)
    return cert, key


def make_credentials(directory: Path, extra_ips: tuple[str, ...] = ()) -> Credentials:
    """Create CA, serving cert (SAN 127.0.0.1/localhost/kubernetes.default.svc, plus
    ``extra_ips``), SA keys, tokens, and the API server's kubelet client certificate."""
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
        "subjectAltName=IP:127.0.0.1,IP:10.0.0.1,"
        + "".join(f"IP:{ip}," for ip in extra_ips)
        + "DNS:localhost,DNS:kubernetes,"
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
    sched_token, proxy_token = secrets.token_hex(24), secrets.token_hex(24)
    token_file = directory / "tokens.csv"
    # Format: token,user,uid,"group1,group2". system:masters bypasses RBAC for the admin only;
    # the controller manager runs with its own bootstrap RBAC role like in a real cluster.
    token_file.write_text(
        f'{admin_token},infertune-admin,uid-admin,"system:masters"\n'
        f"{kcm_token},system:kube-controller-manager,uid-kcm\n"
        # Users the bootstrap RBAC roles are bound to (system:kube-scheduler, system:node-proxier).
        f"{sched_token},system:kube-scheduler,uid-scheduler\n"
        f"{proxy_token},system:kube-proxy,uid-proxy\n"
    )
    # kubeadm's name; a ClusterRoleBinding to system:kubelet-api-admin authorizes it at kubelets
    # that use webhook authorization (realnode.py creates it).
    kc_cert, kc_key = sign_cert(
        directory, "apiserver-kubelet-client", "/CN=kube-apiserver-kubelet-client",
        usage="clientAuth",
    )  # fmt: skip
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
        kubelet_client_cert=kc_cert,
        kubelet_client_key=kc_key,
        scheduler_token=sched_token,
        proxy_token=proxy_token,
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
