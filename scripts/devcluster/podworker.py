"""One bound pod on a fake node: materialise volumes, run its containers, report its status.

The status written is what a kubelet writes (phase, conditions, containerStatuses, podIP), so the
ReplicaSet, Job and EndpointSlice controllers and the operator react to it as in a real cluster.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import podspec
from kubeapi import ApiError
from runtime import Container, now_iso

if TYPE_CHECKING:
    from node_agent import NodeAgent

Obj = dict[str, Any]


def pod_path(pod: Obj) -> str:
    return f"/api/v1/namespaces/{pod['metadata']['namespace']}/pods/{pod['metadata']['name']}"


class PodWorker:
    """Runs one bound pod: materialise, start containers, report status, kill on delete."""

    def __init__(self, agent: NodeAgent, pod: Obj, ip: str, host_ip: str) -> None:
        self.agent, self.pod, self.ip, self.host_ip = agent, pod, ip, host_ip
        self.uid: str = pod["metadata"]["uid"]
        meta = pod["metadata"]
        self.dir = agent.state_dir / "pods" / f"{meta['namespace']}_{meta['name']}_{self.uid[:8]}"
        self.containers: list[Container] = []
        self.init_containers: list[Container] = []
        self.initialized = False
        self.failed_init = False
        self.stop_event = threading.Event()
        self.config_error = ""
        self.start_iso = now_iso()
        self.conditions: dict[str, Obj] = {}
        self.last_status: Obj | None = None
        self.thread = threading.Thread(target=self._run, name=f"pod-{meta['name']}", daemon=True)

    def _container(self, pod: Obj, spec: Obj, volumes: dict[str, Path], policy: str) -> Container:
        base = podspec.base_env(pod, self.ip, "127.0.0.1", self.agent.kube.port)
        env = podspec.container_env(pod, spec, self.agent.kube, base)
        mapping = podspec.path_mapping(spec, volumes, self.dir)
        argv, env, cwd = podspec.process_spec(
            pod, spec, env, mapping, self.dir, self.agent.image_commands
        )
        term = dict(mapping)[spec.get("terminationMessagePath") or "/dev/termination-log"]
        return Container(
            spec={**spec, "terminationGracePeriodSeconds": pod["spec"].get("terminationGracePeriodSeconds")},
            argv=argv, env=env, cwd=cwd, log_path=self.dir / f"{spec['name']}.log",
            termination_path=Path(term), pod_ip=self.ip, restart_policy=policy,
            backoff=self.agent.restart_backoff,
        )  # fmt: skip

    def _prepare(self) -> None:
        pod = dict(self.pod)
        pod["status"] = {
            **(pod.get("status") or {}),
            "podIP": self.ip,
            "hostIP": self.host_ip,
            "podIPs": [{"ip": self.ip}],
        }
        volumes = podspec.materialise_volumes(
            pod, self.dir, self.agent.kube, self.agent.state_dir / "pvcs"
        )
        policy = pod["spec"].get("restartPolicy") or "Always"
        # Init containers run to completion one by one; a failed one is retried unless the pod's
        # policy is Never, in which case the pod fails (kubelet semantics).
        init_policy = "Never" if policy == "Never" else "OnFailure"
        inits = [
            self._container(pod, s, volumes, init_policy)
            for s in pod["spec"].get("initContainers") or []
        ]
        mains = [self._container(pod, s, volumes, policy) for s in pod["spec"]["containers"]]
        self.init_containers, self.containers = inits, mains

    def _tick(self, containers: list[Container]) -> None:
        now = time.monotonic()
        for c in containers:
            before = c.proc.pid if c.proc else 0
            c.tick(now)
            if c.proc is not None and c.proc.pid != before:
                self.agent.track_pgid(c.proc.pid)

    def _run_init_containers(self) -> bool:
        """True when every init container succeeded; False if the pod failed or is stopping."""
        for c in self.init_containers:
            c.start()
            self.agent.track_pgid(c.proc.pid if c.proc else 0)
            while not self.stop_event.is_set() and not c.done:
                self._tick([c])
                self._report()
                self.stop_event.wait(0.1)
            if self.stop_event.is_set():
                return False
            if c.state["terminated"]["exitCode"] != 0:
                self.failed_init = True
                self._report()
                return False
        return True

    def _run(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        while not self.stop_event.is_set() and not self.containers:
            try:
                self._prepare()
            except (podspec.ConfigError, ApiError, OSError) as e:
                # Missing ConfigMap/Secret or an API hiccup: report it and retry, like the kubelet.
                self.containers, self.config_error = [], str(e)
                self._report()
                self.stop_event.wait(1.0)
        self.config_error = ""
        if not self._run_init_containers():
            return
        self.initialized = True
        for c in self.containers:
            if not self.stop_event.is_set():
                c.start()
                self.agent.track_pgid(c.proc.pid if c.proc else 0)
        while not self.stop_event.is_set():
            self._tick(self.containers)
            self._report()
            if self.containers and all(c.done for c in self.containers):
                break  # terminal phase reported; nothing left to run
            self.stop_event.wait(0.1)

    def _condition(self, kind: str, ok: bool, reason: str = "") -> Obj:
        status = "True" if ok else "False"
        old = self.conditions.get(kind)
        if old is None or old["status"] != status:
            old = {
                "type": kind,
                "status": status,
                "lastProbeTime": None,
                "lastTransitionTime": now_iso(),
            }
            if reason:
                old["reason"] = reason
            self.conditions[kind] = old
        return old

    def _phase(self) -> str:
        if self.failed_init:
            return "Failed"
        if not self.initialized or not self.containers:
            return "Pending"
        if all(c.done for c in self.containers):
            codes = [c.state["terminated"]["exitCode"] for c in self.containers]
            return "Succeeded" if all(code == 0 for code in codes) else "Failed"
        return "Running"

    def _report(self) -> None:
        phase = self._phase()
        statuses = [c.status() for c in self.containers]
        if self.config_error:
            statuses = [
                {"name": s["name"], "image": s.get("image", ""), "imageID": "", "ready": False, "restartCount": 0,
                 "started": False, "state": {"waiting": {"reason": "CreateContainerConfigError", "message": self.config_error}},
                 "lastState": {}}
                for s in self.pod["spec"]["containers"]
            ]  # fmt: skip
        ready = (
            bool(self.containers) and all(c.ready for c in self.containers) and phase == "Running"
        )
        done_reason = "PodCompleted" if phase in ("Succeeded", "Failed") else ""
        init_reason = "" if self.initialized else "ContainersNotInitialized"
        conditions = [
            self._condition("Initialized", self.initialized, init_reason),
            self._condition("Ready", ready, done_reason or ("" if ready else "ContainersNotReady")),
            self._condition(
                "ContainersReady", ready, done_reason or ("" if ready else "ContainersNotReady")
            ),
            self._condition("PodScheduled", True),
        ]
        status: Obj = {
            "phase": phase, "conditions": conditions, "hostIP": self.host_ip, "podIP": self.ip,
            "podIPs": [{"ip": self.ip}], "startTime": self.start_iso, "containerStatuses": statuses,
        }  # fmt: skip
        if self.init_containers:
            status["initContainerStatuses"] = [c.status() for c in self.init_containers]
        if status == self.last_status:
            return
        try:
            self.agent.kube.merge_patch(pod_path(self.pod) + "/status", {"status": status})
            self.last_status = json.loads(json.dumps(status))
        except ApiError as e:
            if e.status == 404:
                self.stop_event.set()
            else:  # retried at the next tick, since last_status is unchanged
                self.agent.errors.append(f"status of {self.pod['metadata']['name']}: {e}")
        except OSError as e:
            self.agent.errors.append(f"status of {self.pod['metadata']['name']}: {e!r}")

    def start(self) -> None:
        self.thread.start()

    def stop(self, grace: float) -> None:
        self.stop_event.set()
        self.thread.join()
        for c in [*self.init_containers, *self.containers]:
            c.stop(grace)
