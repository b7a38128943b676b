"""What `make demo` runs the story on: a local control plane (or `$KUBECONFIG`), a real Prometheus
fed by file-based discovery of the serving pods, the CRD and `infertune operator` as a subprocess
under the chart's RBAC rules. `Stack.close()` stops every process it started (Ctrl-C included).
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DEVCLUSTER = ROOT / "scripts" / "devcluster"
sys.path.insert(0, str(DEVCLUSTER))

from kubernetes import client, config  # noqa: E402
from kubernetes.client.rest import ApiException  # noqa: E402
from procs import stop_group  # noqa: E402

from infertune.operator.rbac import cluster_role, cluster_role_binding  # noqa: E402

BIN = Path(sys.executable).parent
INFERTUNE = str(BIN / "infertune")
CRD = ROOT / "crds" / "inferenceservices.infertune.dev.yaml"
SYSTEM_NS = "infertune-system"
OPERATOR_SA = "infertune-operator"
SERVING_PORT = 8000
GROUP, VERSION, PLURAL = "infertune.dev", "v1alpha1", "inferenceservices"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until(fn: Callable[[], Any], what: str, timeout: float, every: float = 1.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(ApiException):
            value = fn()
            if value:
                return value
        time.sleep(every)
    raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")


class PodTargets(threading.Thread):
    """Rewrites Prometheus' file_sd targets (pod IP:port + namespace/pod labels) as pods change:
    pod IPs are 127.x.y.z loopback addresses that come and go with every rollout."""

    def __init__(self, core: client.CoreV1Api, namespace: str, path: Path) -> None:
        super().__init__(name="demo-pod-targets", daemon=True)
        self.core, self.namespace, self.path = core, namespace, path
        self.stopped = threading.Event()
        self.write([])

    def write(self, groups: list[dict[str, Any]]) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(groups, sort_keys=True))
        tmp.replace(self.path)  # atomic: Prometheus never reads half a file

    def groups(self) -> list[dict[str, Any]]:
        out = []
        for pod in self.core.list_namespaced_pod(self.namespace).items:
            ann = pod.metadata.annotations or {}
            if ann.get("prometheus.io/scrape") != "true" or not pod.status.pod_ip:
                continue
            if pod.status.phase != "Running" or pod.metadata.deletion_timestamp:
                continue
            port = ann.get("prometheus.io/port", str(SERVING_PORT))
            out.append(
                {
                    "targets": [f"{pod.status.pod_ip}:{port}"],
                    "labels": {"namespace": self.namespace, "pod": pod.metadata.name},
                }
            )
        return sorted(out, key=lambda g: g["labels"]["pod"])

    def run(self) -> None:
        last: list[dict[str, Any]] = []
        while not self.stopped.wait(1.0):
            try:
                current = self.groups()
            except Exception:  # noqa: S112 - the API may be going away at teardown
                continue
            if current != last:
                self.write(current)
                last = current


class Stack:
    """The control plane (local or existing), Prometheus, the CRD and the operator."""

    def __init__(
        self, namespace: str, out: Path, *, existing: bool, say: Callable[[str], None]
    ) -> None:
        self.namespace, self.out, self.existing, self.say = namespace, out, existing, say
        self.cluster: Any = None
        self.prometheus: Any = None
        self.targets: PodTargets | None = None
        self.operator: subprocess.Popen[bytes] | None = None
        self.kubeconfig: Path | None = None
        self.api: client.ApiClient | None = None
        self.pids: dict[str, int] = {}
        self.forwards: list[subprocess.Popen[bytes]] = []

    # ------------------------------------------------------------------ start
    def start_cluster(self) -> None:
        import devcluster
        import node_agent

        if self.existing:
            env = os.environ.get("KUBECONFIG")
            if not env:
                raise SystemExit("CLUSTER=existing needs KUBECONFIG pointing at the cluster")
            self.kubeconfig = Path(env.split(os.pathsep)[0])
            self.say(f"using the cluster of $KUBECONFIG ({self.kubeconfig})")
        else:
            t0 = time.monotonic()
            devcluster.build(log=lambda msg: self.say(f"build: {msg}"))
            self.cluster = devcluster.Cluster()
            self.cluster.start()
            self.kubeconfig = self.cluster.kubeconfig
        self.api = config.new_client_from_config(config_file=str(self.kubeconfig))
        self.kubectl("apply", "-f", str(CRD))
        devcluster.wait_established(self.kubectl, "-f", str(CRD))
        if self.cluster is not None:
            self.cluster.start_controller_manager()
            nodes = node_agent.default_nodes()  # the same as `make cluster`'s
            self.cluster.start_node_agent(nodes, max_grace=5.0)
            self.pids.update({n: p.pid for n, p in self.cluster.procs.items()})
            self.say(
                f"etcd + kube-apiserver (TLS, RBAC) + controller-manager at {self.cluster.server} "
                f"in {time.monotonic() - t0:.0f}s; fake nodes: "
                + ", ".join(
                    f"{n.name} ({n.labels.get('nvidia.com/gpu.product', 'cpu')})" for n in nodes
                )
            )
        if self.cluster is not None:
            self.cluster.create_namespace(self.namespace)  # waits until pods may be created there
        else:
            self._create_namespace_on_existing()

    def _create_namespace_on_existing(self) -> None:
        """The demo namespace, after any earlier one of that name has finished terminating (the
        Job controller may not create pods in a Terminating namespace)."""
        core = client.CoreV1Api(self.api)

        def gone_or_active() -> bool:
            try:
                ns = core.read_namespace(self.namespace)
            except ApiException as e:
                if e.status == 404:
                    return True
                raise
            return bool(ns.status.phase != "Terminating")

        if not gone_or_active():
            self.say(
                f"namespace {self.namespace} is still terminating from an earlier run: waiting"
            )
            try:
                wait_until(gone_or_active, f"namespace {self.namespace} to finish terminating", 120)
            except TimeoutError:
                conditions = core.read_namespace(self.namespace).status.conditions or []
                why = "; ".join(c.message for c in conditions if c.status == "True")
                raise SystemExit(
                    f"namespace {self.namespace} is stuck terminating ({why}); "
                    f"use --namespace NAME, or clear what holds it"
                ) from None
        with contextlib.suppress(ApiException):  # 409: it exists and is active
            core.create_namespace({"metadata": {"name": self.namespace}})

    def start_prometheus(self) -> str | None:
        if self.existing:
            url = os.environ.get("INFERTUNE_PROMETHEUS_URL")
            self.say(
                f"Prometheus: {url}" if url else
                "no INFERTUNE_PROMETHEUS_URL: the operator scrapes the pods itself (its fallback)"
            )  # fmt: skip
            return url
        from services import Prometheus

        prom = Prometheus([], scrape_interval="2s")
        sd = prom.dir / "serving-pods.json"
        prom.scrape_configs = [
            {
                "job_name": "infertune-serving",
                "metrics_path": "/metrics",
                "file_sd_configs": [{"files": [str(sd)], "refresh_interval": "2s"}],
            }
        ]
        assert self.api is not None
        self.targets = PodTargets(client.CoreV1Api(self.api), self.namespace, sd)
        self.prometheus = prom.start()
        self.targets.start()
        assert prom.proc is not None
        self.pids["prometheus"] = prom.proc.pid
        self.say(f"Prometheus at {prom.url}, scraping serving pods found via {sd.name} (file_sd)")
        return str(prom.url)

    def operator_kubeconfig(self) -> Path:
        """A ServiceAccount bound to exactly the chart's rules; the operator gets only its token."""
        assert self.api is not None and self.cluster is not None
        from pki import kubeconfig_text

        core, rbac = client.CoreV1Api(self.api), client.RbacAuthorizationV1Api(self.api)
        with contextlib.suppress(RuntimeError):
            self.cluster.create_namespace(SYSTEM_NS)
        for create, args in (
            (core.create_namespaced_service_account, (SYSTEM_NS, {"metadata": {"name": OPERATOR_SA}})),
            (rbac.create_cluster_role, (cluster_role(OPERATOR_SA),)),
            (rbac.create_cluster_role_binding, (cluster_role_binding(OPERATOR_SA, OPERATOR_SA, SYSTEM_NS),)),
        ):  # fmt: skip
            try:
                create(*args)
            except ApiException as e:
                if e.status != 409:
                    raise
        secret = wait_until(
            lambda: (core.read_namespaced_service_account(OPERATOR_SA, SYSTEM_NS).secrets or [None])[0],
            "the operator's ServiceAccount token", 60, 0.3,
        )  # fmt: skip
        token = base64.b64decode(
            core.read_namespaced_secret(secret.name, SYSTEM_NS).data["token"]
        ).decode()
        path = self.out / "operator.kubeconfig"
        path.write_text(
            kubeconfig_text(self.cluster.server, self.cluster.ca_cert, token, OPERATOR_SA)
        )
        return path

    def start_operator(self, prometheus_url: str | None) -> None:
        kubeconfig = self.kubeconfig if self.existing else self.operator_kubeconfig()
        metrics_port = free_port()
        argv = [
            INFERTUNE, "operator", "--namespace", self.namespace,
            "--metrics-port", str(metrics_port), "--monitor-tick", "2",
            # The SmolLM2 demo's shifted load is 0.2 req/s: a 30 s window holds ~6 requests, so the
            # default of 20 would never let TrafficDrift be judged (the retune then hung on luck).
            "--drift-min-requests", "5",
        ]  # fmt: skip
        if prometheus_url:
            argv += ["--prometheus-url", prometheus_url]
        if not self.existing:
            # Pods are processes on this machine: they run the CLI of this virtualenv.
            argv += ["--infertune-command", INFERTUNE]
        env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
        env.pop("KUBERNETES_SERVICE_HOST", None)
        log = (self.out / "operator.log").open("ab")
        self.operator = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        log.close()
        self.pids["operator"] = self.operator.pid

        def up() -> bool:
            assert self.operator is not None
            if self.operator.poll() is not None:
                raise RuntimeError(
                    f"the operator exited ({self.operator.returncode}); see {self.out / 'operator.log'}"
                )
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=2):
                    return True
            except OSError:
                return False

        wait_until(up, "the operator's /metrics", 90, 0.5)
        who = (
            "your credentials"
            if self.existing
            else f"ServiceAccount {SYSTEM_NS}/{OPERATOR_SA} (chart RBAC)"
        )
        self.say(
            f"infertune operator (pid {self.operator.pid}) watching namespace {self.namespace} as {who}; "
            f"log: {self.out / 'operator.log'}"
        )

    # ------------------------------------------------------------------ helpers
    def kubectl(self, *args: str) -> str:
        from procs import kubectl_path

        kubectl = kubectl_path() if not self.existing else os.environ.get("KUBECTL", "kubectl")
        proc = subprocess.run(
            [kubectl, f"--kubeconfig={self.kubeconfig}", *args],
            capture_output=True, text=True, check=False, timeout=120,
        )  # fmt: skip
        if proc.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)}: {proc.stderr.strip()}")
        return proc.stdout

    def url_for(self, pod: Any) -> str:
        """Where the load generator reaches a serving pod: its IP where this machine routes the pod
        network (always for the local cluster, whose pods are loopback processes; on an existing
        cluster when run from a node or a bastion on it), else through `kubectl port-forward`."""
        direct = f"http://{pod.status.pod_ip}:{SERVING_PORT}"
        if not self.existing:
            return direct
        with (
            contextlib.suppress(OSError),
            socket.create_connection((pod.status.pod_ip, SERVING_PORT), 2),
        ):
            return direct
        port = free_port()
        forward = subprocess.Popen(
            [os.environ.get("KUBECTL", "kubectl"), f"--kubeconfig={self.kubeconfig}", "-n", self.namespace,
             "port-forward", f"pod/{pod.metadata.name}", f"{port}:{SERVING_PORT}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
        self.forwards.append(forward)

        def listening() -> bool:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
                return True
            return False

        wait_until(listening, f"port-forward to {pod.metadata.name}", 30, 0.5)
        return f"http://127.0.0.1:{port}"

    def pod_log(self, pod: str, container: str) -> str:
        """The pod's log: the node agent's file locally (no kubelet), the API on a real cluster."""
        if self.cluster is not None:
            files = sorted(
                (self.cluster.state_dir / "pods").glob(f"{self.namespace}_{pod}_*/{container}.log")
            )
            return files[-1].read_text(errors="replace") if files else ""
        assert self.api is not None
        try:
            return str(
                client.CoreV1Api(self.api).read_namespaced_pod_log(
                    pod, self.namespace, container=container
                )
            )
        except ApiException:
            return ""

    def pod_dir(self, pod: str) -> Path | None:
        if self.cluster is None:
            return None
        found = sorted((self.cluster.state_dir / "pods").glob(f"{self.namespace}_{pod}_*"))
        return found[-1] if found else None

    # ------------------------------------------------------------------ stop
    def _isvcs(self) -> list[dict[str, Any]]:
        custom = client.CustomObjectsApi(self.api)
        items = custom.list_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL)
        return list(items["items"])

    def _delete_namespace_on_existing(self) -> None:
        """Delete the demo namespace while the operator still runs: it must release its finalizer
        on the InferenceServices, or the namespace stays Terminating on it for good."""
        with contextlib.suppress(ApiException):  # 404: already gone
            client.CoreV1Api(self.api).delete_namespace(self.namespace)
        if self.operator is None or self.operator.poll() is not None:
            return
        with contextlib.suppress(TimeoutError):
            wait_until(lambda: not self._isvcs(), "the operator to finalize the demo", 60, 0.5)

    def _release_leftover_finalizers(self) -> None:
        """InferenceServices still held by the operator's finalizer once it is stopped (it died,
        or took too long): drop the finalizer so the namespace can go. Its children are owned
        by the InferenceService, so the garbage collector removes them."""
        custom = client.CustomObjectsApi(self.api)
        for isvc in self._isvcs():
            name = isvc["metadata"]["name"]
            self.say(f"releasing the operator's finalizer on {self.namespace}/{name}")
            custom.patch_namespaced_custom_object(
                GROUP, VERSION, self.namespace, PLURAL, name, {"metadata": {"finalizers": None}}
            )

    def close(self) -> None:
        """Everything this stack started, newest first; safe to call twice."""
        if self.targets is not None:
            self.targets.stopped.set()
        for forward in self.forwards:
            stop_group(forward, grace=2)
        if self.existing and self.api is not None:
            with contextlib.suppress(Exception):
                self._delete_namespace_on_existing()
        stop_group(self.operator, grace=15)
        self.operator = None
        if self.existing and self.api is not None:
            with contextlib.suppress(Exception):
                self._release_leftover_finalizers()
        if self.prometheus is not None:
            self.prometheus.stop()
            self.prometheus = None
        if self.cluster is not None:
            self.cluster.stop()
            self.cluster = None
        if self.api is not None:
            self.api.close()
            self.api = None
