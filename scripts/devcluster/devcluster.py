"""A real, local Kubernetes control plane for tests, benchmarks and the demo.

etcd + kube-apiserver (TLS, token auth, RBAC) + kube-controller-manager, built by ``build.sh`` from
Debian's ``kubernetes`` source package; no scheduler or kubelet: ``node_agent.NodeAgent`` plays
both for fake GPU nodes. Every instance picks free ports and keeps its state under
``/dev/shm/infertune-devcluster-*`` so several test runs can share the machine.

CLI::

    python scripts/devcluster/devcluster.py up [--nodes default]   # detached, prints env
    eval "$(python scripts/devcluster/devcluster.py env)"          # KUBECONFIG for kubectl
    python scripts/devcluster/devcluster.py down
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from pki import Credentials, kubeconfig_text, make_credentials
from procs import (
    CACHE_BIN,
    HERE,
    STATE_PREFIX,
    STATE_ROOT,
    build,
    build_node,
    die_with_parent,
    free_port,
    kubectl_path,
    reap_stale,
    stop_group,
    stop_recorded,
)

# The `up` CLI records its detached instance here so that `env` and `down` find it.
CURRENT_FILE = Path(
    os.environ.get("INFERTUNE_DEVCLUSTER_CURRENT")
    or Path(tempfile.gettempdir()) / "infertune-devcluster-current"
)
SERVICE_CIDR = "10.0.0.0/24"
ADMISSION_PLUGINS = (
    # Those a real cluster enables that make sense without a scheduler or kubelet.
    "NamespaceLifecycle,LimitRanger,ServiceAccount,DefaultTolerationSeconds,"
    "DefaultStorageClass,StorageObjectInUseProtection,PersistentVolumeClaimResize,Priority,"
    "RuntimeClass,CertificateApproval,CertificateSigning,CertificateSubjectRestriction,"
    "MutatingAdmissionWebhook,ValidatingAdmissionWebhook,ResourceQuota"
)


def wait_established(kubectl: Callable[..., object], *target: str, timeout: float = 60.0) -> None:
    """``kubectl wait --for=condition=Established TARGET``, retried while kubectl 1.20 fails at
    once (instead of waiting) on a just-created CRD that has no ``status.conditions`` yet.

    ``kubectl`` is a wrapper that raises RuntimeError with kubectl's stderr on failure.
    """
    deadline = time.monotonic() + timeout
    while True:
        try:
            kubectl("wait", "--for=condition=Established", "--timeout=60s", *target)
            return
        except RuntimeError as exc:
            if "accessor error" not in str(exc) or time.monotonic() > deadline:
                raise
        time.sleep(0.5)


class Cluster:
    """One control plane instance. ``start()`` brings up etcd + apiserver; the controller manager
    comes with ``start_controller_manager()`` (after the CRDs exist, so garbage collection knows
    them at once) and fake nodes with ``start_node_agent()``. ``stop()`` leaves no process behind.
    """

    def __init__(
        self, state_dir: Path | None = None, *, detached: bool = False, real_node: bool = False
    ) -> None:
        self.state_dir = state_dir or Path(tempfile.mkdtemp(prefix=STATE_PREFIX, dir=STATE_ROOT))
        self.detached = detached  # detached: children outlive this Python process (`up` CLI)
        # A real kubelet/containerd node (realnode.py): the API server then also listens on the
        # node's address, which pods reach through the `kubernetes` Service.
        self.real_node = real_node
        self.node: Any = None  # realnode.RealNode once started
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self._logs: list[IO[bytes]] = []
        self.api_port = 0
        self.creds: Credentials | None = None
        self.agent: Any = None  # node_agent.NodeAgent when running in-process
        self.timings: dict[str, float] = {}

    # ------------------------------------------------------------------ properties
    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.api_port}"

    @property
    def kubeconfig(self) -> Path:
        return self.state_dir / "kubeconfig"

    @property
    def admin_token(self) -> str:
        if self.creds is None:
            raise RuntimeError("cluster not started")
        return self.creds.admin_token

    @property
    def ca_cert(self) -> Path:
        if self.creds is None:
            raise RuntimeError("cluster not started")
        return self.creds.ca_cert

    def env(self) -> dict[str, str]:
        return {"KUBECONFIG": str(self.kubeconfig)}

    # ------------------------------------------------------------------ lifecycle
    def _spawn(self, name: str, argv: Sequence[str]) -> subprocess.Popen[bytes]:
        log = open(self.state_dir / f"{name}.log", "ab")  # noqa: SIM115 - closed in stop()
        self._logs.append(log)
        proc = subprocess.Popen(
            list(argv),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            # PDEATHSIG fires when the forking *thread* exits, so only the main thread may use it.
            preexec_fn=die_with_parent
            if not self.detached and threading.current_thread() is threading.main_thread()
            else None,
        )
        self.procs[name] = proc
        self._record_pids()
        return proc

    def _record_pids(self) -> None:
        pids = {name: p.pid for name, p in self.procs.items()}
        (self.state_dir / "pids.json").write_text(json.dumps({"owner": os.getpid(), "pids": pids}))

    def log_tail(self, name: str, lines: int = 30) -> str:
        path = self.state_dir / f"{name}.log"
        text = path.read_text(errors="replace") if path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def start(self, *, build_missing: bool = True, timeout: float = 90.0) -> None:
        """Start etcd and kube-apiserver; returns once /readyz is ok and the kubeconfig is written."""
        if build_missing:
            build()
            if self.real_node:
                build_node()
        for b in ("etcd", "kube-apiserver", "kube-controller-manager"):
            if not (CACHE_BIN / b).exists():
                raise FileNotFoundError(f"{CACHE_BIN / b} missing; run scripts/devcluster/build.sh")
        reap_stale()
        t0 = time.monotonic()
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.node_ip = ""
        if self.real_node:
            import realnode

            self.node_ip = realnode.node_ip()
        self.creds = make_credentials(
            self.state_dir / "pki", extra_ips=(self.node_ip,) if self.node_ip else ()
        )
        self._start_etcd(timeout)
        self.timings["etcd_s"] = time.monotonic() - t0
        for attempt in range(3):  # a free port can be taken between probing and binding
            self.api_port = free_port()
            if self._start_apiserver(timeout):
                break
            self._kill("kube-apiserver")
            if attempt == 2:
                raise RuntimeError(
                    f"kube-apiserver did not become ready:\n{self.log_tail('kube-apiserver')}"
                )
        self.kubeconfig.write_text(
            kubeconfig_text(self.server, self.ca_cert, self.admin_token, "admin")
        )
        self.timings["apiserver_s"] = time.monotonic() - t0
        (self.state_dir / "info.json").write_text(
            json.dumps({"server": self.server, "kubeconfig": str(self.kubeconfig)})
        )

    def _start_etcd(self, timeout: float) -> None:
        for _attempt in range(3):
            client, peer = free_port(), free_port()
            data = self.state_dir / "etcd-data"
            shutil.rmtree(data, ignore_errors=True)
            self._spawn(
                "etcd",
                [
                    str(CACHE_BIN / "etcd"), "--name=devcluster", f"--data-dir={data}",
                    f"--listen-client-urls=http://127.0.0.1:{client}",
                    f"--advertise-client-urls=http://127.0.0.1:{client}",
                    f"--listen-peer-urls=http://127.0.0.1:{peer}",
                    f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
                    f"--initial-cluster=devcluster=http://127.0.0.1:{peer}",
                    "--log-level=warn", "--logger=zap",
                ],
            )  # fmt: skip
            self.etcd_url = f"http://127.0.0.1:{client}"
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline and self.procs["etcd"].poll() is None:
                health = f"{self.etcd_url}/health"
                with contextlib.suppress(OSError), urllib.request.urlopen(health, timeout=1) as r:  # noqa: S310 - our own http URL
                    if json.loads(r.read()).get("health") == "true":
                        return
                time.sleep(0.05)
            self._kill("etcd")
        raise RuntimeError(f"etcd did not become healthy:\n{self.log_tail('etcd')}")

    def _start_apiserver(self, timeout: float) -> bool:
        assert self.creds is not None
        c = self.creds
        assert c.kubelet_client_cert is not None and c.kubelet_client_key is not None
        if self.node_ip:
            # Pods reach the API server at the node's address (the `kubernetes` Service's
            # endpoint, kept by the lease reconciler); kubelets are authorized by the Node
            # authorizer and limited by NodeRestriction, as on a kubeadm cluster.
            network = [
                "--bind-address=0.0.0.0", f"--advertise-address={self.node_ip}",
                "--authorization-mode=Node,RBAC",
                f"--enable-admission-plugins={ADMISSION_PLUGINS},NodeRestriction",
            ]  # fmt: skip
        else:
            network = [
                "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
                "--authorization-mode=RBAC", f"--enable-admission-plugins={ADMISSION_PLUGINS}",
                # The default lease reconciler would publish 127.0.0.1 in the `kubernetes`
                # Endpoints, which validation rejects (loopback); no in-cluster routing exists.
                "--endpoint-reconciler-type=none",
            ]  # fmt: skip
        self._spawn(
            "kube-apiserver",
            [
                str(CACHE_BIN / "kube-apiserver"),
                f"--etcd-servers={self.etcd_url}",
                *network,
                f"--secure-port={self.api_port}", "--insecure-port=0",
                f"--tls-cert-file={c.server_cert}", f"--tls-private-key-file={c.server_key}",
                f"--client-ca-file={c.ca_cert}", f"--token-auth-file={c.token_file}",
                "--anonymous-auth=false",
                # The API server's own identity at kubelets (logs, exec, port-forward).
                f"--kubelet-client-certificate={c.kubelet_client_cert}",
                f"--kubelet-client-key={c.kubelet_client_key}",
                f"--kubelet-certificate-authority={c.ca_cert}",
                "--kubelet-preferred-address-types=InternalIP,Hostname",
                f"--service-account-key-file={c.sa_pub}",
                f"--service-account-signing-key-file={c.sa_key}",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                f"--cert-dir={self.state_dir / 'pki'}", "--allow-privileged=true",
                "--profiling=false", "--v=1",
            ],
        )  # fmt: skip
        ctx = ssl.create_default_context(cafile=str(c.ca_cert))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.procs["kube-apiserver"].poll() is not None:
                return False
            req = urllib.request.Request(  # noqa: S310 - our own https URL
                f"{self.server}/readyz", headers={"Authorization": f"Bearer {c.admin_token}"}
            )
            with (
                contextlib.suppress(OSError, urllib.error.HTTPError),
                urllib.request.urlopen(req, context=ctx, timeout=2) as r,  # noqa: S310
            ):
                if r.status == 200:
                    return True
            time.sleep(0.1)
        return False

    def stop_apiserver(self, *, graceful: bool = False) -> None:
        """Stop kube-apiserver alone (etcd keeps every object): clients see refused connections
        and broken watches until ``start_apiserver()``. Not graceful by default: a crash."""
        proc = self.procs.get("kube-apiserver")
        if proc is not None and proc.poll() is None and not graceful:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        self._kill("kube-apiserver")

    def start_apiserver(self, timeout: float = 90.0) -> None:
        """Bring kube-apiserver back on the same port and credentials (kubeconfigs stay valid)."""
        proc = self.procs.get("kube-apiserver")
        if proc is not None and proc.poll() is None:
            return
        deadline = time.monotonic() + timeout
        while not self._start_apiserver(max(1.0, deadline - time.monotonic())):
            self._kill("kube-apiserver")  # e.g. the port still held for a moment after a crash
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"kube-apiserver did not come back:\n{self.log_tail('kube-apiserver')}"
                )
            time.sleep(0.5)

    def start_controller_manager(self, *, wait: bool = True, timeout: float = 60.0) -> None:
        """Start kube-controller-manager; with ``wait``, until the `default` ServiceAccount has a token."""
        assert self.creds is not None
        t0 = time.monotonic()
        kcm_kubeconfig = self.state_dir / "kcm.kubeconfig"
        kcm_kubeconfig.write_text(
            kubeconfig_text(self.server, self.ca_cert, self.creds.controller_manager_token, "kcm")
        )
        self._spawn(
            "kube-controller-manager",
            [
                str(CACHE_BIN / "kube-controller-manager"),
                f"--kubeconfig={kcm_kubeconfig}",
                # No serving ports at all: several instances may run side by side.
                "--secure-port=0", "--port=0", "--leader-elect=false",
                "--use-service-account-credentials=true",
                f"--service-account-private-key-file={self.creds.sa_key}",
                f"--root-ca-file={self.creds.ca_cert}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                # Fake nodes renew their Lease; tolerate a busy 2-core test machine.
                "--node-monitor-grace-period=60s",
                "--controllers=*,-nodeipam,-cloud-node-lifecycle,-route,-service",
                "--v=1",
            ],
        )  # fmt: skip
        if wait:
            self._wait_default_sa_token(timeout)
        self.timings["controller_manager_s"] = time.monotonic() - t0

    def create_namespace(self, name: str, timeout: float = 30.0) -> None:
        """Create a namespace and wait until pods can be created in it.

        Until the tokens controller has given the namespace's `default` ServiceAccount a token,
        the ServiceAccount admission plugin rejects every pod (a race real clusters have too).
        """
        self.kubectl("create", "namespace", name)
        self._wait_default_sa_token(timeout, name)

    def _wait_default_sa_token(self, timeout: float, namespace: str = "default") -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            proc = self.procs["kube-controller-manager"]
            if proc.poll() is not None:
                raise RuntimeError(
                    f"kube-controller-manager exited:\n{self.log_tail('kube-controller-manager')}"
                )
            sa = self.get_json(f"/api/v1/namespaces/{namespace}/serviceaccounts/default")
            if sa and sa.get("secrets"):
                return
            time.sleep(0.2)
        raise TimeoutError(
            f"ServiceAccount {namespace}/default got no token secret in {timeout}s: is the tokens controller running?"
        )

    def start_node_agent(self, nodes: Sequence[Any] | None = None, **options: Any) -> Any:
        """Register fake nodes and run the kubelet stand-in (a thread here; a process when detached)."""
        import node_agent

        specs = list(nodes) if nodes is not None else node_agent.default_nodes()
        if self.detached:
            (self.state_dir / "nodes.json").write_text(json.dumps([n.to_json() for n in specs]))
            self._spawn(
                "node-agent",
                [sys.executable, str(HERE / "node_agent.py"), "--kubeconfig", str(self.kubeconfig),
                 "--nodes", str(self.state_dir / "nodes.json"), "--state-dir", str(self.state_dir)],
            )  # fmt: skip
            return None
        self.agent = node_agent.NodeAgent(
            self.kubeconfig, specs, state_dir=self.state_dir, **options
        )
        self.agent.start()
        return self.agent

    def start_real_node(self, *, gpus: int = 2) -> Any:
        """containerd + kubelet + kube-scheduler + kube-proxy + fake-GPU device plugin on this
        machine (realnode.py); the built images are imported first. Needs root."""
        import realnode

        if not self.real_node:
            raise RuntimeError(
                "Cluster(real_node=True) is needed: the API server must listen on the node's address"
            )
        self.node = realnode.RealNode(self, gpus=gpus)
        try:
            self.node.start()
        except BaseException:
            self.node.stop()
            self.node = None
            raise
        return self.node

    def up(self, crds: Sequence[Path] = (), nodes: Sequence[Any] | None = None) -> None:
        """Everything: control plane, CRDs (applied and Established), controller manager, nodes."""
        t0 = time.monotonic()
        self.start()
        for crd in crds:
            self.kubectl("apply", "-f", str(crd))
        if crds:
            wait_established(self.kubectl, "crd", "--all")
        self.start_controller_manager()
        self.start_node_agent(nodes)
        self.timings["total_s"] = time.monotonic() - t0

    def _kill(self, name: str, grace: float = 5.0) -> None:
        stop_group(self.procs.pop(name, None), grace)

    def stop(self, *, keep_state: bool = False) -> None:
        """Stop pods, nodes agent, controller manager, apiserver, etcd (in that order)."""
        if self.agent is not None:
            self.agent.stop()
            self.agent = None
        if self.node is not None:
            self.node.stop()
            self.node = None
        for name in ("node-agent", "kube-controller-manager", "kube-apiserver", "etcd"):
            self._kill(name)
        for log in self._logs:
            log.close()
        self._logs.clear()
        if not keep_state:
            shutil.rmtree(self.state_dir, ignore_errors=True)

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ helpers
    def kubectl(
        self, *args: str, check: bool = True, token: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        argv = [kubectl_path(), f"--kubeconfig={self.kubeconfig}", *args]
        if token is not None:
            argv.insert(2, f"--token={token}")
        proc = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=120)
        if check and proc.returncode != 0:
            raise RuntimeError(
                f"kubectl {' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip()}"
            )
        return proc

    def get_json(self, path: str) -> dict[str, Any] | None:
        """GET an API path as admin; None on 404."""
        ctx = ssl.create_default_context(cafile=str(self.ca_cert))
        req = urllib.request.Request(  # noqa: S310 - our own https URL
            self.server + path, headers={"Authorization": f"Bearer {self.admin_token}"}
        )
        try:
            with urllib.request.urlopen(req, context=ctx, timeout=5) as r:  # noqa: S310
                body: dict[str, Any] = json.loads(r.read())
                return body
        except urllib.error.HTTPError as e:
            if e.code == 404:
                return None
            raise

    def api_client(self, token: str | None = None) -> Any:
        """A kubernetes.client.ApiClient for the admin (or for ``token``)."""
        from kubernetes import client

        cfg = client.Configuration()
        cfg.host = self.server
        cfg.ssl_ca_cert = str(self.ca_cert)
        cfg.api_key = {"authorization": token or self.admin_token}
        cfg.api_key_prefix = {"authorization": "Bearer"}
        return client.ApiClient(cfg)

    def rss_bytes(self) -> dict[str, int]:
        """Resident memory of each control-plane process (VmRSS from /proc)."""
        out: dict[str, int] = {}
        for name, proc in self.procs.items():
            with contextlib.suppress(OSError):
                for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines():
                    if line.startswith("VmRSS:"):
                        out[name] = int(line.split()[1]) * 1024
        return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up", help="start a detached control plane with fake GPU nodes")
    up.add_argument(
        "--crd",
        action="append",
        default=[],
        help="CRD file(s) to apply before the controller manager",
    )
    up.add_argument("--no-nodes", action="store_true", help="do not start the node agent")
    up.add_argument(
        "--real-node",
        action="store_true",
        help="a real kubelet/containerd node with fake GPUs (and kube-scheduler, kube-proxy) "
        "instead of the node agent; needs root, setup_node.sh and `build.sh node`",
    )
    sub.add_parser("env", help="print `export KUBECONFIG=...` for the running instance")
    sub.add_parser("down", help="stop the instance started by `up`")
    sub.add_parser("build", help="build missing binaries")
    args = parser.parse_args(argv)
    if args.cmd == "build":
        build()
        return 0
    if args.cmd == "up":
        if CURRENT_FILE.exists() and Path(CURRENT_FILE.read_text().strip()).exists():
            print(
                f"already up: {CURRENT_FILE.read_text().strip()} (run `down` first)",
                file=sys.stderr,
            )
            return 1
        cluster = Cluster(detached=True, real_node=args.real_node)
        try:
            cluster.start()
            for crd in args.crd:
                cluster.kubectl("apply", "-f", crd)
                wait_established(cluster.kubectl, "-f", crd)
            cluster.start_controller_manager()
            if args.real_node:
                cluster.start_real_node()
            elif not args.no_nodes:
                cluster.start_node_agent()
        except BaseException:
            cluster.stop()  # a failed `up` leaves nothing running
            raise
        data = json.loads((cluster.state_dir / "pids.json").read_text())
        data["detached"] = True
        (cluster.state_dir / "pids.json").write_text(json.dumps(data))
        CURRENT_FILE.write_text(str(cluster.state_dir))
        print(f"export KUBECONFIG={cluster.kubeconfig}")
        return 0
    state = Path(CURRENT_FILE.read_text().strip()) if CURRENT_FILE.exists() else None
    if state is None or not state.exists():
        print("no devcluster is up (start one with `up`)", file=sys.stderr)
        return 1
    if args.cmd == "env":
        print(f"export KUBECONFIG={state / 'kubeconfig'}")
        return 0
    if (state / "realnode").exists():
        import realnode

        realnode.delete_node_pods(state)
        realnode.teardown(state)
    stop_recorded(state)
    CURRENT_FILE.unlink(missing_ok=True)
    print(f"stopped {state}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
