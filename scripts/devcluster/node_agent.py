"""The test-side kubelet + scheduler stand-in: fake GPU nodes whose pods are local processes.

``NodeAgent`` registers Nodes (labels such as ``nvidia.com/gpu.product``, capacity
``nvidia.com/gpu``), keeps their Leases fresh so the node lifecycle controller sees them Ready,
binds Pending pods to a node that fits (``scheduling.choose_node``), and runs each bound pod's
containers as local processes (``runtime.Container``) on the pod's own loopback address
127.A.B.N (A.B derived from the API server port, so concurrent clusters never collide), which it
reports as ``status.podIP`` and passes as ``POD_IP``. Servers in pods must bind to that address;
probes are sent there. Deleting a pod (graceful or not) kills its process group.

Paths: see ``podspec`` — mountPaths in command/args/env are rewritten to local directories and the
whole mapping is in ``INFERTUNE_PATH_MAP``. Logs: ``<state_dir>/pods/<ns>_<name>/<container>.log``.

Run standalone: ``python node_agent.py --kubeconfig K --nodes nodes.json --state-dir D``.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import signal
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from kubeapi import ApiError, Kube
from podworker import PodWorker, pod_path
from runtime import now_iso
from scheduling import choose_node

Obj = dict[str, Any]
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
GPU_RESOURCE = "nvidia.com/gpu"


@dataclass
class FakeNode:
    name: str
    labels: dict[str, str] = field(default_factory=dict)
    capacity: dict[str, str] = field(default_factory=dict)
    taints: list[Obj] = field(default_factory=list)

    def to_json(self) -> Obj:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Obj) -> FakeNode:
        return cls(**data)


def gpu_node(
    name: str,
    product: str = "NVIDIA-H100-80GB-HBM3",
    gpus: int = 1,
    memory_mib: int = 81559,
    **labels: str,
) -> FakeNode:
    """A node labelled like NVIDIA's GPU feature discovery does, with ``gpus`` allocatable GPUs."""
    return FakeNode(
        name=name,
        labels={
            GPU_PRODUCT_LABEL: product,
            "nvidia.com/gpu.count": str(gpus),
            "nvidia.com/gpu.memory": str(memory_mib),
            "nvidia.com/gpu.present": "true",
            **labels,
        },
        capacity={"cpu": "16", "memory": "128Gi", "pods": "110", GPU_RESOURCE: str(gpus)},
    )


def cpu_node(name: str, **labels: str) -> FakeNode:
    return FakeNode(
        name=name, labels=dict(labels), capacity={"cpu": "16", "memory": "64Gi", "pods": "110"}
    )


def default_nodes() -> list[FakeNode]:
    """The nodes of `make cluster` and of the demo's own control plane, so that the demo runs the
    same on either: two H100s, as a retune's tuning Job needs one while the live pod keeps the other."""
    return [
        gpu_node("gpu-h100-0", gpus=2),
        gpu_node("gpu-a100-0", product="NVIDIA-A100-SXM4-80GB"),
        cpu_node("cpu-0"),
    ]


class NodeAgent:
    """Fake nodes + scheduler + kubelet for the dev cluster (see the module docstring)."""

    def __init__(
        self, kubeconfig: Path, nodes: list[FakeNode], *, state_dir: Path, poll_interval: float = 0.2,
        restart_backoff: tuple[float, float] = (1.0, 20.0), max_grace: float = 10.0,
        image_commands: dict[str, list[str]] | None = None,
    ) -> None:  # fmt: skip
        self.kube = Kube(kubeconfig)
        self.nodes = {n.name: n for n in nodes}
        self.state_dir = state_dir
        self.poll_interval = poll_interval
        self.restart_backoff = restart_backoff
        self.max_grace = max_grace  # caps terminationGracePeriodSeconds so tests stay quick
        self.image_commands = image_commands or {}
        port = self.kube.port
        self.ip_prefix = f"127.{1 + (port >> 8) % 254}.{port & 0xFF}"
        self.workers: dict[str, PodWorker] = {}
        self.ips: dict[str, str] = {}  # pod uid -> ip, held while the pod object exists
        self.unschedulable: dict[str, str] = {}
        self.terminating: dict[str, threading.Thread] = {}  # pod uid -> graceful stop in progress
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="node-agent", daemon=True)
        self._last_heartbeat = 0.0
        self.errors: list[str] = []

    # ------------------------------------------------------------------ nodes
    def node_ip(self, name: str) -> str:
        # Every fake node is this machine; .1 of the cluster's block stands for it.
        return f"{self.ip_prefix}.1"

    def register(self) -> None:
        for n in self.nodes.values():
            labels = {
                "kubernetes.io/hostname": n.name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                **n.labels,
            }
            body = {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {"name": n.name, "labels": labels},
                "spec": {"taints": n.taints},
            }
            try:
                self.kube.create("/api/v1/nodes", body)
            except ApiError as e:
                if e.status != 409:
                    raise
                self.kube.merge_patch(
                    f"/api/v1/nodes/{n.name}",
                    {"metadata": {"labels": labels}, "spec": {"taints": n.taints}},
                )
            status = {
                "capacity": n.capacity, "allocatable": n.capacity,
                "addresses": [{"type": "InternalIP", "address": self.node_ip(n.name)}, {"type": "Hostname", "address": n.name}],
                "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "node agent is posting ready status",
                                "lastHeartbeatTime": now_iso(), "lastTransitionTime": now_iso()}],
                "nodeInfo": {"kubeletVersion": "v1.20.2-infertune-node-agent", "operatingSystem": "linux", "architecture": "amd64",
                             "containerRuntimeVersion": "local-process://1", "kernelVersion": "", "osImage": "", "kubeProxyVersion": "",
                             "machineID": "", "systemUUID": "", "bootID": ""},
            }  # fmt: skip
            self.kube.merge_patch(f"/api/v1/nodes/{n.name}/status", {"status": status})
        self._heartbeat(force=True)

    def _heartbeat(self, force: bool = False) -> None:
        if not force and time.monotonic() - self._last_heartbeat < 10:
            return
        self._last_heartbeat = time.monotonic()
        renew = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        for name in self.nodes:
            path = f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{name}"
            try:
                self.kube.merge_patch(path, {"spec": {"renewTime": renew, "holderIdentity": name}})
            except ApiError as e:
                if e.status != 404:
                    raise
                self.kube.create(
                    "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases",
                    {
                        "metadata": {"name": name},
                        "spec": {
                            "holderIdentity": name,
                            "leaseDurationSeconds": 40,
                            "renewTime": renew,
                        },
                    },
                )

    def relabel(self, node: str, labels: dict[str, str | None]) -> None:
        """Change a node's labels (``None`` removes one): what a hardware change looks like."""
        self.kube.merge_patch(f"/api/v1/nodes/{node}", {"metadata": {"labels": labels}})

    def set_capacity(self, node: str, capacity: dict[str, str]) -> None:
        cap = {**self.nodes[node].capacity, **capacity}
        self.nodes[node].capacity = cap
        self.kube.merge_patch(
            f"/api/v1/nodes/{node}/status", {"status": {"capacity": cap, "allocatable": cap}}
        )

    def pod_log(self, namespace: str, name: str, container: str | None = None) -> str:
        """What ``kubectl logs`` would show (there is no kubelet to serve it)."""
        for w in list(self.workers.values()):
            meta = w.pod["metadata"]
            if (meta["namespace"], meta["name"]) == (namespace, name):
                c = next((c for c in w.containers if container in (None, c.name)), None)
                if c is not None and c.log_path.exists():
                    return c.log_path.read_text(errors="replace")
        return ""

    def track_pgid(self, pgid: int) -> None:
        # Recorded so that devcluster.reap_stale() can kill pods of a crashed test run.
        if pgid:
            (self.state_dir / "pod-pgids").mkdir(parents=True, exist_ok=True)
            (self.state_dir / "pod-pgids" / str(pgid)).touch()

    # ------------------------------------------------------------------ loop
    def start(self) -> None:
        self.register()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        for t in list(self.terminating.values()):
            t.join()
        for w in list(self.workers.values()):
            w.stop(grace=1.0)
        self.workers.clear()
        self.kube.close()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self._heartbeat()
                self._sync()
            except Exception as e:  # the loop must survive API hiccups; the error is kept for tests
                self.errors.append(repr(e))
            del self.errors[:-20]
            self._stop.wait(self.poll_interval)

    def _allocate_ip(self, uid: str) -> str:
        if uid not in self.ips:
            used = set(self.ips.values())
            free = next(
                (
                    f"{self.ip_prefix}.{i}"
                    for i in range(2, 255)
                    if f"{self.ip_prefix}.{i}" not in used
                ),
                None,
            )
            if free is None:
                raise RuntimeError(f"no free pod IP left in {self.ip_prefix}.2-254")
            self.ips[uid] = free
        return self.ips[uid]

    def _sync(self) -> None:
        nodes = [
            n
            for n in self.kube.get("/api/v1/nodes")["items"]
            if n["metadata"]["name"] in self.nodes
        ]
        pods = self.kube.get("/api/v1/pods")["items"]
        seen: set[str] = set()
        for pod in pods:
            meta, spec = pod["metadata"], pod["spec"]
            uid = meta["uid"]
            seen.add(uid)
            node = spec.get("nodeName")
            if not node:
                if (
                    not meta.get("deletionTimestamp")
                    and spec.get("schedulerName", "default-scheduler") == "default-scheduler"
                ):
                    self._schedule(pod, nodes, pods)
                continue
            if node not in self.nodes:
                continue
            worker = self.workers.get(uid)
            if meta.get("deletionTimestamp"):
                if uid not in self.terminating:
                    # Off the loop: a graceful stop may take seconds, scheduling must go on.
                    grace = min(float(meta.get("deletionGracePeriodSeconds") or 0), self.max_grace)
                    t = threading.Thread(target=self._terminate, args=(pod, grace), daemon=True)
                    self.terminating[uid] = t
                    t.start()
                continue
            if worker is None and (pod.get("status") or {}).get("phase") not in (
                "Succeeded",
                "Failed",
            ):
                worker = PodWorker(self, pod, self._allocate_ip(uid), self.node_ip(node))
                self.workers[uid] = worker
                worker.start()
            elif worker is not None:
                worker.pod = pod
        for uid in list(self.workers):
            if uid not in seen and uid not in self.terminating:
                worker = self.workers.pop(uid, None)  # force-deleted (grace 0): kill what is left
                if worker is not None:
                    worker.stop(grace=0)
        for table in (self.ips, self.unschedulable):
            for uid in [u for u in table if u not in seen]:
                del table[uid]

    def _terminate(self, pod: Obj, grace: float) -> None:
        """Graceful deletion as the kubelet does it: stop the containers, then delete with grace 0."""
        uid = pod["metadata"]["uid"]
        worker = self.workers.pop(uid, None)
        if worker is not None:
            worker.stop(grace)
        with contextlib.suppress(ApiError):
            self.kube.delete(
                pod_path(pod), {"gracePeriodSeconds": 0, "preconditions": {"uid": uid}}
            )
        self.terminating.pop(uid, None)

    def _schedule(self, pod: Obj, nodes: list[Obj], pods: list[Obj]) -> None:
        uid = pod["metadata"]["uid"]
        node, why = choose_node(pod, nodes, pods)
        if node is None:
            if self.unschedulable.get(uid) != why:
                self.unschedulable[uid] = why
                cond = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": why,
                        "lastProbeTime": None, "lastTransitionTime": now_iso()}  # fmt: skip
                with contextlib.suppress(ApiError):
                    self.kube.merge_patch(
                        pod_path(pod) + "/status", {"status": {"conditions": [cond]}}
                    )
            return
        name = node["metadata"]["name"]
        binding = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": pod["metadata"]["name"], "uid": uid},
                   "target": {"apiVersion": "v1", "kind": "Node", "name": name}}  # fmt: skip
        try:
            self.kube.create(pod_path(pod) + "/binding", binding)
        except ApiError as e:
            if e.status in (404, 409):
                return
            raise
        self.unschedulable.pop(uid, None)
        pod["spec"]["nodeName"] = name  # later pods in this pass see the capacity taken


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="fake GPU nodes whose pods run as local processes")
    parser.add_argument("--kubeconfig", type=Path, required=True)
    parser.add_argument(
        "--nodes",
        type=Path,
        help="JSON list of {name, labels, capacity, taints}; default: 2 GPU + 1 CPU",
    )
    parser.add_argument("--state-dir", type=Path, required=True)
    args = parser.parse_args(argv)
    nodes = (
        [FakeNode.from_json(n) for n in json.loads(args.nodes.read_text())]
        if args.nodes
        else default_nodes()
    )
    agent = NodeAgent(args.kubeconfig, nodes, state_dir=args.state_dir)
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    agent.start()
    done.wait()
    agent.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
