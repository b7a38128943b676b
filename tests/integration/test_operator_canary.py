"""Canary rollouts on the real API server with real serving engines: a new winner first serves
beside the live config on its own Deployment (same Service selector, track=canary); real traffic
to its pod decides. It is promoted when its live figures held the SLOs for the window and rolled
back at the first breach. The placeholder tuner picks int4 for long prompts, int8 otherwise, so
changing the spec's prompt lengths yields a different winner."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException
from operator_harness import OperatorProcess, operator_kubeconfig, wait_for
from test_operator_flow import LABEL, _drive, apply, condition, demo, isvc, wait_phase

pytestmark = pytest.mark.cluster
LONG_PROMPTS = {"distribution": "uniform", "min": 300, "max": 400}


def _doc(name: str, slo: dict[str, Any]) -> dict[str, Any]:
    return demo(
        name,
        slo=slo,
        hardware={"gpuProducts": [], "gpusPerReplica": 0, "cpu": "1", "memory": "2Gi"},
        rollout={"replicas": 1, "canary": {"enabled": True, "replicas": 1, "window": "40s"}},
        retune={"enabled": False, "checkInterval": "10s", "violationWindow": "20s"},
    )


def _canary_pod_ip(api: Any, namespace: str, name: str) -> str | None:
    pods = client.CoreV1Api(api).list_namespaced_pod(
        namespace, label_selector=f"{LABEL}={name},infertune.dev/track=canary"
    )
    ready = [
        p.status.pod_ip
        for p in pods.items
        if p.status.pod_ip
        and any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or [])
    ]
    return ready[0] if ready else None


def _canary_deployment(api: Any, namespace: str, name: str) -> Any:
    try:
        return client.AppsV1Api(api).read_namespaced_deployment(f"{name}-canary", namespace)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def _history(obj: dict[str, Any]) -> list[str]:
    return [h["event"] for h in (obj.get("status") or {}).get("history", [])]


def test_canary_is_promoted_when_it_holds_the_slos_and_rolled_back_when_it_breaks_them(
    cluster: Any, api: Any, namespace: str, tmp_path: Path
) -> None:
    op = OperatorProcess(operator_kubeconfig(cluster, api, tmp_path), tmp_path / "op.log").start()
    stop, sent, errors = threading.Event(), [], []  # type: ignore[var-annotated]
    try:
        loose = {"ttft": {"max": "20s"}, "itl": {"max": "5s"}, "objective": "goodput"}
        tight = {"itl": {"max": "1ms", "percentile": "p95"}, "objective": "goodput"}
        names = {"good": loose, "bad": tight}
        for name, slo in names.items():
            apply(cluster, namespace, _doc(name, slo), tmp_path)
        first = {
            name: wait_phase(api, namespace, name, ("Serving", "Degraded"), op)["status"]["live"]
            for name in names
        }
        assert all(live["quantization"] == "int8" for live in first.values())

        # A spec change with a different winner (int4): it goes to a canary, not to the live pods.
        for name, slo in names.items():
            doc = _doc(name, slo)
            doc["spec"]["traffic"]["promptTokens"] = LONG_PROMPTS
            apply(cluster, namespace, doc, tmp_path)
        try:
            ips = {
                name: wait_for(
                    lambda n=name: _canary_pod_ip(api, namespace, n),
                    f"{name} canary pod",
                    timeout=300,
                )
                for name in names
            }
        except AssertionError as exc:
            states = {n: isvc(api, namespace, n)["status"] for n in names}
            raise AssertionError(f"{exc}\n{states}\n{op.log()[-2000:]}") from None
        for name in names:
            obj = isvc(api, namespace, name)
            assert obj["status"]["canary"]["config"]["quantization"] == "int4"
            assert obj["status"]["live"]["configHash"] == first[name]["configHash"]
            assert condition(obj, "Canary")["reason"] == "CanaryRunning"
            stable = client.AppsV1Api(api).read_namespaced_deployment(name, namespace)
            assert (
                stable.spec.template.metadata.annotations["infertune.dev/config-hash"]
                == (first[name]["configHash"])
            )
        prompt = " ".join(f"word{i % 50}" for i in range(40))
        drivers = [
            threading.Thread(
                target=_drive,
                args=(f"http://{ip}:8000/v1/completions", prompt, stop, sent, errors),
                daemon=True,
            )
            for ip in ips.values()
        ]
        for t in drivers:
            t.start()

        def settled(name: str) -> dict[str, Any] | None:
            obj = isvc(api, namespace, name)
            return obj if obj["status"].get("canary") is None else None

        bad = wait_for(lambda: settled("bad"), "bad canary judged", timeout=240, every=1.0)
        good = wait_for(lambda: settled("good"), "good canary judged", timeout=240, every=1.0)
        stop.set()

        # Breaking the SLOs (ITL p95 <= 1 ms cannot hold): rolled back, live config untouched.
        assert "CanaryRolledBack" in _history(bad), _history(bad)
        cond = condition(bad, "Canary")
        assert (cond["status"], cond["reason"]) == ("False", "CanaryRolledBack"), cond
        assert "SLOBreach" in cond["message"] and "itl p95" in cond["message"]
        assert bad["status"]["live"]["configHash"] == first["bad"]["configHash"]
        wait_for(lambda: _canary_deployment(api, namespace, "bad") is None, "bad canary removed")

        # Holding them for the window: promoted, the stable Deployment rolls to the new config.
        assert "CanaryPromoted" in _history(good), _history(good)
        assert condition(good, "Canary")["status"] == "True"
        live = good["status"]["live"]
        assert live["quantization"] == "int4" and live["configHash"] != first["good"]["configHash"]
        wait_for(
            lambda: (
                client.AppsV1Api(api)
                .read_namespaced_deployment("good", namespace)
                .spec.template.metadata.annotations["infertune.dev/config-hash"]
                == live["configHash"]
            ),
            "stable Deployment carries the promoted config",
        )
        wait_for(lambda: _canary_deployment(api, namespace, "good") is None, "canary removed")
        assert len(sent) >= 5, errors[-3:]
    finally:
        stop.set()
        op.stop()
