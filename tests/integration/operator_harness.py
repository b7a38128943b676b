"""Run the operator as its own process under the RBAC rules of infertune.operator.rbac (a
ServiceAccount token, no admin rights), for the integration tests and the operator benchmark."""

from __future__ import annotations

import base64
import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import cluster_helpers
from kubernetes import client
from kubernetes.client.rest import ApiException
from pki import kubeconfig_text  # scripts/devcluster

from infertune.operator.rbac import cluster_role, cluster_role_binding

ROOT = Path(__file__).resolve().parents[2]

GROUP, VERSION, PLURAL = "infertune.dev", "v1alpha1", "inferenceservices"
SYSTEM_NS = "infertune-system"
SA = "infertune-operator"
FAKE_CLI = Path(__file__).resolve().parent / "operator_fake_cli.py"
REAL_CLI = str(Path(sys.executable).with_name("infertune"))  # the console script of this venv
T = TypeVar("T")


def wait_for(
    fn: Callable[[], T | None], what: str, timeout: float = 120.0, every: float = 0.25
) -> T:
    """The operator's flows take longer than a bare API round trip: a longer default timeout."""
    return cluster_helpers.wait_for(fn, what, timeout=timeout, every=every)


def operator_kubeconfig(cluster: Any, api: Any, directory: Path) -> Path:
    """A ServiceAccount bound to exactly rbac.RULES; returns a kubeconfig with its token."""
    core, rbac = client.CoreV1Api(api), client.RbacAuthorizationV1Api(api)
    with contextlib.suppress(ApiException, RuntimeError):  # exists: a second operator in a session
        cluster.create_namespace(SYSTEM_NS)
    with contextlib.suppress(ApiException):
        core.create_namespaced_service_account(SYSTEM_NS, {"metadata": {"name": SA}})
    for create, body in (
        (rbac.create_cluster_role, cluster_role(SA)),
        (rbac.create_cluster_role_binding, cluster_role_binding(SA, SA, SYSTEM_NS)),
    ):
        try:
            create(body)
        except ApiException as e:
            if e.status != 409:
                raise
    secret = wait_for(
        lambda: (core.read_namespaced_service_account(SA, SYSTEM_NS).secrets or [None])[0],
        "SA token",
    )
    token = base64.b64decode(
        core.read_namespaced_secret(secret.name, SYSTEM_NS).data["token"]
    ).decode()
    path = directory / "operator.kubeconfig"
    path.write_text(kubeconfig_text(cluster.server, cluster.ca_cert, token, SA))
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class OperatorProcess:
    """`infertune operator` in a subprocess with the SA's kubeconfig; pods run FAKE_CLI."""

    def __init__(
        self,
        kubeconfig: Path,
        log: Path,
        args: Sequence[str] = ("--all-namespaces",),
        command: str = f"{sys.executable} {FAKE_CLI}",
    ) -> None:
        self.kubeconfig, self.log_path, self.args = kubeconfig, log, list(args)
        self.command = command  # how pods run the `infertune` CLI
        self.metrics_port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> OperatorProcess:
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig)}
        env.pop("KUBERNETES_SERVICE_HOST", None)
        argv = [
            sys.executable, "-c", "import sys; from infertune.cli import main; sys.exit(main())",
            "operator",
            "--metrics-port", str(self.metrics_port), "--monitor-tick", "2", "--drift-min-requests", "5",
            "--infertune-command", self.command, *self.args,
        ]  # fmt: skip
        self._log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            argv, stdout=self._log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        wait_for(self._metrics_up, "operator /metrics", timeout=60)
        return self

    def _metrics_up(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(
                f"operator exited with {self.proc.returncode}:\n{self.log()[-4000:]}"
            )
        try:
            self.metrics()
        except OSError:
            return False
        return True

    def metrics(self) -> str:
        with urllib.request.urlopen(
            f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5
        ) as r:
            return str(r.read().decode())

    def metric(self, name: str, **labels: str) -> float:
        total = 0.0
        for line in self.metrics().splitlines():
            if not line.startswith(name + "{") and not line.startswith(name + " "):
                continue
            if all(f'{k}="{v}"' in line for k, v in labels.items()):
                total += float(line.rsplit(" ", 1)[1])
        return total

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def rbac_denials(self) -> list[str]:
        """Log lines where the API server refused the operator (403): it runs with exactly
        rbac.RULES, so any such line is a right the chart does not grant. A namespace being
        deleted also answers 403 ("being terminated"): that one is not an RBAC gap."""
        return [
            line
            for line in self.log().splitlines()
            if ("Forbidden" in line or "forbidden by RBAC" in line)
            and "being terminated" not in line
        ]

    def rss_bytes(self) -> int:
        assert self.proc is not None
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        return 0

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self._log.close()
        self.proc = None


@contextlib.contextmanager
def explained(op: OperatorProcess, api: Any, namespace: str) -> Iterator[None]:
    """A timed-out wait also shows what the operator saw: its log after the last start, each
    object's conditions and tuning run, and the Jobs (a flaky wait is otherwise undiagnosable)."""
    try:
        yield
    except AssertionError as failure:
        lines = [ln for ln in op.log().splitlines() if "DEBUG" not in ln][-60:]
        objects = client.CustomObjectsApi(api).list_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL
        )["items"]
        state = [
            f"{o['metadata']['name']}: tuning={(o.get('status') or {}).get('tuning')} "
            f"conditions={[(c['type'], c['status'], c.get('reason')) for c in (o.get('status') or {}).get('conditions', [])]}"
            for o in objects
        ]
        jobs = [
            f"{j.metadata.name}: {[(c.type, c.status) for c in (j.status.conditions or [])]} "
            f"active={j.status.active} succeeded={j.status.succeeded}"
            for j in client.BatchV1Api(api).list_namespaced_job(namespace).items
        ]
        detail = "\n".join(["objects:", *state, "jobs:", *jobs, "operator log (tail):", *lines])
        raise AssertionError(f"{failure}\n{detail}") from None


@contextlib.contextmanager
def running_operator(cluster: Any, api: Any, work: Path) -> Iterator[OperatorProcess]:
    """The operator under the chart's ServiceAccount; stopped on exit, and checked never to have
    been denied by RBAC (what it reached for is within its rules, whatever the specs held)."""
    op = OperatorProcess(operator_kubeconfig(cluster, api, work), work / "operator.log").start()
    try:
        yield op
    finally:
        op.stop()
    denied = op.rbac_denials()
    assert not denied, "\n".join(denied[-20:])


def drive_requests(
    url: str,
    body: bytes,
    stop: threading.Event,
    sent: list[int],
    errors: list[str],
    *,
    pause: float = 0.0,
    error_pause: float = 0.5,
) -> None:
    """One client posting `body` to `url` back to back until `stop` (a thread's target): counts
    the answered requests in `sent` and keeps the errors, so a test can say what its load saw."""
    while not stop.is_set():
        req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                r.read()
            sent.append(1)
        except Exception as exc:
            errors.append(repr(exc)[:200])
            stop.wait(error_pause)
            continue
        if pause:
            stop.wait(pause)
