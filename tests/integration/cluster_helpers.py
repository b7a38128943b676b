"""Shared helpers for the tests that run against the dev control plane."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from kubernetes import client
from kubernetes.client.rest import ApiException

ROOT = Path(__file__).resolve().parents[2]
CRD = ROOT / "crds" / "inferenceservices.infertune.dev.yaml"
GROUP, VERSION, PLURAL = "infertune.dev", "v1alpha1", "inferenceservices"
PY = sys.executable
T = TypeVar("T")


def wait_for(fn: Callable[[], T | None], what: str, timeout: float = 60.0, every: float = 0.2) -> T:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = fn()
        except ApiException as e:
            if e.status != 404:
                raise
            last = None  # not there yet
        if last:
            return last  # type: ignore[no-any-return]
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}; last value: {last!r}")


def alive(pid: int) -> bool:
    """True while the process exists and is not a zombie waiting for init to reap it."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def pod(name: str, command: list[str], **spec: Any) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "main", "image": "local", "command": command}
    for key in ("env", "readinessProbe", "livenessProbe", "resources", "volumeMounts", "ports"):
        if key in spec:
            container[key] = spec.pop(key)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "containers": [container],
            "restartPolicy": spec.pop("restartPolicy", "Never"),
            **spec,
        },
    }


def isvc(name: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "InferenceService",
        "metadata": {"name": name},
        "spec": {
            "model": {"uri": "pvc://models/tiny"},
            "slo": {"ttft": {"max": "300ms", "percentile": "p95"}},
        },
    }


def phase_is(core: client.CoreV1Api, ns: str, name: str, *phases: str) -> Callable[[], Any]:
    def check() -> Any:
        p = core.read_namespaced_pod(name, ns)
        return p if p.status.phase in phases else None

    return check
