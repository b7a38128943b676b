"""A real node for the dev cluster: containerd + runc + CNI bridge + kubelet, kube-scheduler,
kube-proxy and a fake-GPU device plugin, all on this machine.

The kubelet, kube-scheduler and kube-proxy come from the same Debian source tree as the control
plane (``build.sh node``); containerd, runc and the CNI plugins from Debian packages
(``setup_node.sh``). Pods run as real runc containers from images imported into containerd's
``k8s.io`` namespace (``scripts/images/build.sh``; nothing is pulled). Security: the API server
reaches the kubelet with its own client certificate; the kubelet authenticates with x509 + webhook
(TokenReview) and authorizes with webhook (SubjectAccessReview), anonymous requests refused. The
kubelet itself is authorized by the Node authorizer + NodeRestriction.

One real node per machine (it owns ports 10250/10248 and the host's iptables). ``stop()`` and
``teardown()`` leave no process, mount, bridge, cgroup, iptables chain or sysctl change behind.
Requires root (containerd, mounts, iptables). Used through ``Cluster(real_node=True)``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from fakegpu_plugin import SOCKET_NAME
from pki import sign_cert
from procs import CACHE_BIN, HERE, pid_alive

CACHE = CACHE_BIN.parent
# Image content and snapshots persist across clusters, so images are imported once.
CONTAINERD_ROOT = CACHE / "realnode" / "containerd"
IMAGES = CACHE / "images"
# Which cluster owns the machine's real node (only one at a time).
MARKER = Path("/run/infertune-realnode.json")
POD_CIDR = "10.88.0.0/16"
BRIDGE = "itune0"
SYSCTLS = (
    # The kubelet (--protect-kernel-defaults=false) and the bridge setup change these.
    "vm.overcommit_memory", "vm.panic_on_oom", "kernel.panic", "kernel.panic_on_oops",
    "net.ipv4.ip_forward", "net.bridge.bridge-nf-call-iptables",
)  # fmt: skip
# The kubelet 1.20 serves device-plugin registration here whatever its --root-dir (a constant).
DEVICE_PLUGINS = Path("/var/lib/kubelet/device-plugins")
GPU_PRODUCT = "NVIDIA-H100-80GB-HBM3"
GPU_MEMORY_MIB = 81559


def node_ip() -> str:
    """The IPv4 address of the default route's interface (pods reach the API server there)."""
    out = subprocess.run(
        ["ip", "-4", "-o", "route", "show", "default"], capture_output=True, text=True, check=False
    ).stdout.split()
    dev = out[out.index("dev") + 1] if "dev" in out else None
    addrs = subprocess.run(
        ["ip", "-4", "-o", "addr", "show", *(["dev", dev] if dev else [])],
        capture_output=True, text=True, check=False,
    ).stdout.splitlines()  # fmt: skip
    for line in addrs:
        ip = line.split()[3].split("/")[0]
        if not ip.startswith("127."):
            return ip
    raise RuntimeError("no non-loopback IPv4 address: a real node needs one")


def missing_prerequisites() -> list[str]:
    """What this machine lacks for a real node (empty when it can run one)."""
    missing = [
        b for b in ("kubelet", "kube-scheduler", "kube-proxy") if not (CACHE_BIN / b).exists()
    ]
    missing += [
        t for t in ("containerd", "runc", "ctr", "iptables", "buildah") if not shutil.which(t)
    ]
    if not Path("/usr/lib/cni/bridge").exists():
        missing.append("/usr/lib/cni/bridge (containernetworking-plugins)")
    if os.geteuid() != 0:
        missing.append("root")
    return missing


def _run(*argv: str, check: bool = False, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, check=check, timeout=timeout)


def gpu_labels(gpus: int) -> dict[str, str]:
    """GPU feature discovery's labels, the names operator/placement.py reads."""
    return {
        "nvidia.com/gpu.product": GPU_PRODUCT,
        "nvidia.com/gpu.count": str(gpus),
        "nvidia.com/gpu.memory": str(GPU_MEMORY_MIB),
        "nvidia.com/gpu.present": "true",
    }


class RealNode:
    """The node's processes, spawned through the cluster (so `down` and crashes see their pids)."""

    def __init__(self, cluster: Any, *, gpus: int = 2) -> None:
        self.cluster = cluster
        self.gpus = gpus
        self.name = socket.gethostname()
        self.ip = node_ip()
        self.dir = cluster.state_dir / "realnode"
        self.sock = self.dir / "containerd.sock"

    # ------------------------------------------------------------------ start
    def start(self, timeout: float = 120.0) -> None:
        missing = missing_prerequisites()
        if missing:
            raise RuntimeError(
                "a real node needs: " + ", ".join(missing)
                + " (run scripts/devcluster/setup_node.sh and scripts/devcluster/build.sh node)"
            )  # fmt: skip
        claim(self.cluster.state_dir, detached=self.cluster.detached)
        t0 = time.monotonic()
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "sysctl.orig").write_text(
            "".join(f"{k}={_run('sysctl', '-n', k).stdout.strip()}\n" for k in SYSCTLS
                    if _run("sysctl", "-n", k).returncode == 0)
        )  # fmt: skip
        _run("sysctl", "-qw", "net.ipv4.ip_forward=1")
        # Pod -> Service VIP -> pod on the same bridge needs bridged traffic to see iptables.
        _run("sysctl", "-qw", "net.bridge.bridge-nf-call-iptables=1")
        self._start_containerd()
        self.import_images()
        self.cluster.timings["containerd_s"] = time.monotonic() - t0
        self._rbac()
        self._start_kubelet()
        self._spawn_py("fakegpu-plugin", [str(HERE / "fakegpu_plugin.py"),
                       "--plugin-dir", str(DEVICE_PLUGINS),
                       "--count", str(self.gpus)])  # fmt: skip
        self._start_scheduler()
        self._start_proxy()
        self._wait_ready(timeout)
        self.cluster.timings["real_node_s"] = time.monotonic() - t0

    def _spawn_py(self, name: str, argv: list[str]) -> None:
        self.cluster._spawn(name, [sys.executable, *argv])

    def _start_containerd(self) -> None:
        CONTAINERD_ROOT.mkdir(parents=True, exist_ok=True)
        cni_conf = self.dir / "cni"
        cni_conf.mkdir(exist_ok=True)
        (cni_conf / "10-infertune.conflist").write_text(json.dumps({
            "cniVersion": "0.4.0", "name": "infertune",
            "plugins": [
                {"type": "bridge", "bridge": BRIDGE, "isGateway": True, "ipMasq": True,
                 "hairpinMode": True,
                 "ipam": {"type": "host-local", "ranges": [[{"subnet": POD_CIDR}]],
                          "routes": [{"dst": "0.0.0.0/0"}], "dataDir": str(self.dir / "cni-ipam")}},
                {"type": "portmap", "capabilities": {"portMappings": True}},
            ],
        }))  # fmt: skip
        pause = (IMAGES / "pause.ref").read_text().strip()
        (self.dir / "containerd.toml").write_text(f"""version = 2
root = "{CONTAINERD_ROOT}"
state = "{self.dir / "containerd-state"}"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs"]
[grpc]
  address = "{self.sock}"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{pause}"
  # root here may lack CAP_SYS_RESOURCE: a negative oom_score_adj for the sandbox kills runc init.
  restrict_oom_score_adj = true
  disable_tcp_service = true
  stream_server_address = "127.0.0.1"
  tolerate_missing_hugetlb_controller = true
  disable_hugetlb_controller = true
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{cni_conf}"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
""")
        self.cluster._spawn(
            "containerd",
            ["nice", "-n", "5", "containerd", "--config", str(self.dir / "containerd.toml")],
        )
        deadline = time.monotonic() + 30
        while not self.sock.exists():
            if time.monotonic() > deadline or self.cluster.procs["containerd"].poll() is not None:
                raise RuntimeError(
                    f"containerd did not start:\n{self.cluster.log_tail('containerd')}"
                )
            time.sleep(0.1)

    def ctr(self, *args: str, check: bool = True, timeout: float = 600) -> str:
        proc = _run("ctr", "--address", str(self.sock), "-n", "k8s.io", *args, timeout=timeout)
        if check and proc.returncode != 0:
            raise RuntimeError(f"ctr {' '.join(args)}: {proc.stderr.strip()}")
        return proc.stdout

    def import_images(self) -> list[str]:
        """Import every built image archive containerd does not hold yet; returns the refs."""
        have = set(self.ctr("images", "ls", "-q").split())
        refs = []
        for ref_file in sorted(IMAGES.glob("*.ref")):
            ref = ref_file.read_text().strip()
            refs.append(ref)
            if ref in have:
                continue
            archive = IMAGES / f"{ref_file.stem}-{ref.rsplit(':', 1)[1]}.oci.tar"
            if archive.exists():
                self.ctr("images", "import", str(archive))
        return refs

    def _rbac(self) -> None:
        # The API server's kubelet client (logs/exec/port-forward) at webhook-authorizing kubelets.
        self.cluster.kubectl(
            "create", "clusterrolebinding", "kube-apiserver-kubelet-client",
            "--clusterrole=system:kubelet-api-admin", "--user=kube-apiserver-kubelet-client",
        )  # fmt: skip

    def _start_kubelet(self) -> None:
        c = self.cluster.creds
        pki = c.ca_cert.parent
        kdir = self.dir / "kubelet"
        (kdir / "pki").mkdir(parents=True, exist_ok=True)
        node_cert, node_key = sign_cert(
            pki, "kubelet-node", f"/O=system:nodes/CN=system:node:{self.name}", usage="clientAuth"
        )
        serve_cert, serve_key = sign_cert(
            pki, "kubelet-serving", f"/CN={self.name}", usage="serverAuth",
            san=f"DNS:{self.name},IP:127.0.0.1,IP:{self.ip}",
        )  # fmt: skip
        kubeconfig = self.dir / "kubelet.kubeconfig"
        kubeconfig.write_text(
            "apiVersion: v1\nkind: Config\n"
            f"clusters:\n- name: devcluster\n  cluster:\n    server: {self.cluster.server}\n"
            f"    certificate-authority: {c.ca_cert}\n"
            f"users:\n- name: node\n  user:\n    client-certificate: {node_cert}\n"
            f"    client-key: {node_key}\n"
            "contexts:\n- name: node\n  context: {cluster: devcluster, user: node}\n"
            "current-context: node\n"
        )
        config = self.dir / "kubelet.yaml"
        config.write_text(json.dumps({
            "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
            "cgroupDriver": "cgroupfs", "failSwapOn": False,
            # No anonymous access: client certs (x509) or bearer tokens checked by TokenReview,
            # every request authorized by SubjectAccessReview.
            "authentication": {"anonymous": {"enabled": False},
                               "webhook": {"enabled": True, "cacheTTL": "10s"},
                               "x509": {"clientCAFile": str(c.ca_cert)}},
            "authorization": {"mode": "Webhook",
                              "webhook": {"cacheAuthorizedTTL": "10s", "cacheUnauthorizedTTL": "5s"}},
            "tlsCertFile": str(serve_cert), "tlsPrivateKeyFile": str(serve_key),
            "readOnlyPort": 0, "healthzBindAddress": "127.0.0.1",
            "clusterDomain": "cluster.local", "resolvConf": "/etc/resolv.conf",
            "imageGCHighThresholdPercent": 98, "imageGCLowThresholdPercent": 95,
            "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%",
                             "imagefs.available": "1%"},
            "serializeImagePulls": False, "maxPods": 40,
            "nodeStatusReportFrequency": "10s",
        }))  # fmt: skip
        labels = ",".join(f"{k}={v}" for k, v in gpu_labels(self.gpus).items())
        self.cluster._spawn("kubelet", [
            "nice", "-n", "5", str(CACHE_BIN / "kubelet"), f"--config={config}",
            f"--kubeconfig={kubeconfig}", f"--root-dir={kdir}", f"--cert-dir={kdir / 'pki'}",
            "--container-runtime=remote", f"--container-runtime-endpoint=unix://{self.sock}",
            f"--node-ip={self.ip}", f"--node-labels={labels}", "--v=1",
        ])  # fmt: skip

    def _token_kubeconfig(self, name: str, token: str) -> Path:
        from pki import kubeconfig_text

        path = self.dir / f"{name}.kubeconfig"
        path.write_text(kubeconfig_text(self.cluster.server, self.cluster.ca_cert, token, name))
        return path

    def _start_scheduler(self) -> None:
        kc = self._token_kubeconfig("kube-scheduler", self.cluster.creds.scheduler_token)
        self.cluster._spawn("kube-scheduler", [
            str(CACHE_BIN / "kube-scheduler"), f"--kubeconfig={kc}", "--leader-elect=false",
            "--port=0", "--secure-port=0", "--v=1",
        ])  # fmt: skip

    def _start_proxy(self) -> None:
        kc = self._token_kubeconfig("kube-proxy", self.cluster.creds.proxy_token)
        config = self.dir / "kube-proxy.yaml"
        config.write_text(json.dumps({
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1", "kind": "KubeProxyConfiguration",
            "clientConnection": {"kubeconfig": str(kc)}, "mode": "iptables",
            "clusterCIDR": POD_CIDR, "hostnameOverride": self.name,
            "healthzBindAddress": "127.0.0.1:10256", "metricsBindAddress": "127.0.0.1:10249",
            # Leave the host's conntrack table sizes and timeouts alone.
            "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s",
                          "tcpCloseWaitTimeout": "0s"},
        }))  # fmt: skip
        self.cluster._spawn(
            "kube-proxy", [str(CACHE_BIN / "kube-proxy"), f"--config={config}", "--v=1"]
        )

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for name in ("containerd", "kubelet", "kube-scheduler", "kube-proxy", "fakegpu-plugin"):
                if self.cluster.procs[name].poll() is not None:
                    raise RuntimeError(f"{name} exited:\n{self.cluster.log_tail(name)}")
            node = self.cluster.get_json(f"/api/v1/nodes/{self.name}")
            if node:
                ready = any(
                    c["type"] == "Ready" and c["status"] == "True"
                    for c in node.get("status", {}).get("conditions", [])
                )
                gpus = node["status"].get("allocatable", {}).get("nvidia.com/gpu", "0")
                if ready and gpus == str(self.gpus):
                    return
            time.sleep(0.5)
        node = self.cluster.get_json(f"/api/v1/nodes/{self.name}") or {}
        raise TimeoutError(
            f"node {self.name} not Ready with {self.gpus} GPUs in {timeout}s: "
            f"{json.dumps(node.get('status', {}).get('conditions'))} "
            f"allocatable {node.get('status', {}).get('allocatable')}\n"
            f"device plugin: {self.cluster.log_tail('fakegpu-plugin', 5)}\n"
            + self.cluster.log_tail("kubelet")
        )

    # ------------------------------------------------------------------ stop
    def stop(self) -> None:
        """Delete the node's pods (their containers stop), then tear everything down."""
        delete_node_pods(self.cluster.state_dir)
        with contextlib.suppress(Exception):
            self.cluster.kubectl("delete", "node", self.name, "--wait=false")
        for name in ("kube-proxy", "kube-scheduler", "fakegpu-plugin", "kubelet"):
            self.cluster._kill(name)
        teardown(self.cluster.state_dir, containerd=self.cluster.procs.pop("containerd", None))


def delete_node_pods(state_dir: Path) -> None:
    """Delete every pod (grace 1 s) through the cluster's admin kubeconfig, so the kubelet stops
    their containers and the CNI plugin releases their addresses and NAT rules."""
    from procs import kubectl_path

    _run(kubectl_path(), f"--kubeconfig={state_dir / 'kubeconfig'}", "delete", "pods",
         "--all-namespaces", "--all", "--grace-period=1", "--wait=true", "--timeout=60s",
         timeout=90)  # fmt: skip


def claim(state_dir: Path, *, detached: bool) -> None:
    """Record that ``state_dir``'s cluster owns the machine's real node; refuse a second one and
    tear down what a crashed owner left."""
    if MARKER.exists():
        with contextlib.suppress(OSError, ValueError):
            info = json.loads(MARKER.read_text())
            other = Path(info["state_dir"])
            alive = other.exists() and (info.get("detached") or pid_alive(int(info["owner"])))
            if alive and other != state_dir:
                raise RuntimeError(f"a real node already runs on this machine (cluster {other})")
            teardown(other)
    MARKER.write_text(
        json.dumps({"state_dir": str(state_dir), "owner": os.getpid(), "detached": detached})
    )


def _stop_pid(pid: int, grace: float = 10.0) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def teardown(state_dir: Path, containerd: Any = None) -> None:
    """Undo everything a real node did on the host; safe to run twice or after a crash.

    Order: node processes, CRI containers (their shims), containerd, mounts under the state dir,
    network namespaces, bridge, kube-proxy's iptables chains, cgroups, sysctls.
    """
    d = state_dir / "realnode"
    pids: dict[str, int] = {}
    with contextlib.suppress(OSError, ValueError):
        pids = json.loads((state_dir / "pids.json").read_text()).get("pids", {})
    for name in ("kube-proxy", "kube-scheduler", "fakegpu-plugin", "kubelet"):
        if name in pids:
            _stop_pid(int(pids[name]))
    sock = d / "containerd.sock"
    if sock.exists():
        ctr = ["ctr", "--address", str(sock), "-n", "k8s.io"]
        for task in _run(*ctr, "tasks", "ls", "-q").stdout.split():
            _run(*ctr, "tasks", "kill", "-s", "KILL", task)
        time.sleep(0.5)
        for task in _run(*ctr, "tasks", "ls", "-q").stdout.split():
            _run(*ctr, "tasks", "rm", "-f", task)
        for cont in _run(*ctr, "containers", "ls", "-q").stdout.split():
            _run(*ctr, "containers", "rm", cont)
    if containerd is not None:
        from procs import stop_group

        stop_group(containerd, 10.0)
    elif "containerd" in pids:
        _stop_pid(int(pids["containerd"]))
    # Shims whose containerd is gone (a crash): their command line names the state's socket.
    for proc in Path("/proc").glob("[0-9]*"):
        if proc.name in (str(os.getpid()), str(os.getppid())):
            continue  # the caller itself (its command line may name the state dir)
        with contextlib.suppress(OSError):
            cmd = proc.joinpath("cmdline").read_bytes()
            if b"containerd-shim" in cmd and str(sock).encode() in cmd:
                _stop_pid(int(proc.name), 2.0)
    for mount in sorted(mounts_under(d, CONTAINERD_ROOT), reverse=True):
        _run("umount", "-l", mount)
    for ns in Path("/run/netns").glob("cni-*") if Path("/run/netns").is_dir() else ():
        _run("umount", str(ns))
        ns.unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        Path("/run/netns").rmdir()
    _run("ip", "link", "del", BRIDGE)
    if (CACHE_BIN / "kube-proxy").exists():
        _run(str(CACHE_BIN / "kube-proxy"), "--cleanup")
    _cleanup_iptables()
    for hierarchy in Path("/sys/fs/cgroup").glob("*"):
        top = hierarchy / "kubepods"
        if top.is_dir():
            for sub in sorted(
                (p for p in top.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)
            ):
                with contextlib.suppress(OSError):
                    sub.rmdir()
            with contextlib.suppress(OSError):
                top.rmdir()
    # The device-plugin directory (fixed path): our files, then the directories if left empty.
    for name in ("kubelet.sock", "DEPRECATION", "kubelet_internal_checkpoint", SOCKET_NAME):
        (DEVICE_PLUGINS / name).unlink(missing_ok=True)
    for empty in (DEVICE_PLUGINS, DEVICE_PLUGINS.parent):
        with contextlib.suppress(OSError):
            empty.rmdir()
    if Path("/run/containerd").is_dir():
        _run("find", "/run/containerd", "-depth", "-type", "d", "-empty", "-delete")
    orig = d / "sysctl.orig"
    if orig.exists():
        _run("sysctl", "-q", "-p", str(orig))
        orig.unlink()
    with contextlib.suppress(OSError, ValueError):
        if json.loads(MARKER.read_text())["state_dir"] == str(state_dir):
            MARKER.unlink()


IPTABLES_TABLES = ("nat", "filter", "mangle")


def _cleanup_iptables() -> None:
    """Chains the kubelet (KUBE-MARK-*, KUBE-FIREWALL, canaries), kube-proxy and the bridge
    plugin's ipMasq (CNI-*) leave once the node is gone: the jumps to them, then the chains."""
    for table in IPTABLES_TABLES:
        rules = _run("iptables", "-t", table, "-S").stdout.splitlines()
        for rule in rules:
            parts = shlex.split(rule)
            if (
                parts[:1] == ["-A"]
                and not parts[1].startswith(("KUBE-", "CNI-"))
                and ("KUBE-" in rule or "CNI-" in rule)
            ):
                _run("iptables", "-t", table, "-D", *parts[1:])
        chains = [
            r.split()[1]
            for r in rules
            if r.startswith("-N ") and r.split()[1].startswith(("KUBE-", "CNI-"))
        ]
        for chain in chains:
            _run("iptables", "-t", table, "-F", chain)
        for chain in chains:
            _run("iptables", "-t", table, "-X", chain)


def mounts_under(*roots: Path) -> list[str]:
    """Mount points below any of ``roots`` (from /proc/self/mountinfo)."""
    prefixes = tuple(str(r) + "/" for r in roots) + tuple(str(r) for r in roots)
    out = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].replace("\\040", " ")
        if point.startswith(prefixes):
            out.append(point)
    return out


NODE_PROGRAMS = ("kubelet", "kube-scheduler", "kube-proxy", "containerd")


def leftovers(state_dir: Path) -> dict[str, list[str]]:
    """What a real node could leave on the host: for tests that prove ``stop()`` leaves nothing."""
    procs = []
    for proc in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError):
            cmd = (
                proc.joinpath("cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            )
            argv0 = Path(cmd.split(" ", 1)[0]).name
            if str(state_dir) in cmd or "containerd-shim" in cmd or argv0 in NODE_PROGRAMS:
                procs.append(f"{proc.name} {cmd.strip()}")
    links = _run("ip", "-o", "link", "show", BRIDGE).stdout.strip()
    chains = [
        f"{table}: {r}"
        for table in IPTABLES_TABLES
        for r in _run("iptables", "-t", table, "-S").stdout.splitlines()
        if "KUBE-" in r or "CNI-" in r
    ]
    cgroups = [str(p) for p in Path("/sys/fs/cgroup").glob("*/kubepods")]
    return {
        "processes": procs,
        "mounts": mounts_under(state_dir, CONTAINERD_ROOT),
        "links": [links] if links else [],
        "iptables": chains,
        "cgroups": cgroups,
        "files": [str(p) for p in (DEVICE_PLUGINS, MARKER) if p.exists()],
    }
