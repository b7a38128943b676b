"""The operator's live figures through a real Prometheus (2.42) scraping the serving pod, and the
fallback to scraping the pods itself when Prometheus goes away (said in the MetricsSource
condition). Debian's Prometheus has no Kubernetes service discovery, so a small loop here plays
its part: it lists the serving pods and writes them as file_sd targets with the `namespace` and
`pod` labels that Kubernetes SD relabelling would give."""

from __future__ import annotations

import json
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from operator_harness import OperatorProcess, operator_kubeconfig, wait_for
from services import Prometheus  # scripts/devcluster
from test_operator_flow import LABEL, _drive, apply, condition, demo, isvc, wait_phase

pytestmark = pytest.mark.cluster
NAME = "prom"


class PodTargets:
    """Keeps a file_sd targets file in step with the serving pods of one namespace."""

    def __init__(self, api: Any, namespace: str, path: Path) -> None:
        self.api, self.namespace, self.path = api, namespace, path
        self.stop = threading.Event()
        self.path.write_text("[]")
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def sync(self) -> int:
        pods = client.CoreV1Api(self.api).list_namespaced_pod(
            self.namespace, label_selector="app.kubernetes.io/component=serving"
        )
        groups = [
            {
                "targets": [f"{p.status.pod_ip}:8000"],
                "labels": {"namespace": self.namespace, "pod": p.metadata.name},
            }
            for p in pods.items
            if p.status.pod_ip
        ]
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(groups))
        tmp.replace(self.path)  # Prometheus must never read a half-written file
        return len(groups)

    def _loop(self) -> None:
        while not self.stop.wait(1.0):
            try:
                self.sync()
            except Exception as exc:  # keep the last good file; the test's waits will tell
                print(f"target sync failed: {exc!r}", file=sys.stderr)

    def __enter__(self) -> PodTargets:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        self.thread.join(5)


@pytest.fixture
def prometheus(api: Any, namespace: str, tmp_path: Path) -> Iterator[tuple[Prometheus, PodTargets]]:
    targets = PodTargets(api, namespace, tmp_path / "targets.json")
    scrape = {
        "job_name": "serving-pods",
        "scrape_interval": "1s",
        "file_sd_configs": [{"files": [str(targets.path)], "refresh_interval": "1s"}],
    }
    prom = Prometheus([scrape], scrape_interval="1s").start()
    with targets:
        yield prom, targets
    prom.stop()


def promql(url: str, query: str) -> list[dict[str, Any]]:
    q = urllib.parse.urlencode({"query": query})
    with urllib.request.urlopen(f"{url}/api/v1/query?{q}", timeout=5) as r:
        result: list[dict[str, Any]] = json.load(r)["data"]["result"]
        return result


def engine_prompt_mean(ip: str) -> float:
    """The serving engine's own running mean prompt length, read straight from its /metrics."""
    with urllib.request.urlopen(f"http://{ip}:8000/metrics", timeout=5) as r:
        text = r.read().decode()
    values = {}
    for line in text.splitlines():
        for part in ("sum", "count"):
            if line.startswith(f"vllm:request_prompt_tokens_{part}"):
                values[part] = values.get(part, 0.0) + float(line.rsplit(" ", 1)[1])
    return values["sum"] / values["count"]


def test_live_figures_come_from_prometheus_and_fall_back_to_the_pods_when_it_goes_away(
    cluster: Any,
    api: Any,
    namespace: str,
    tmp_path: Path,
    prometheus: tuple[Prometheus, PodTargets],
) -> None:
    prom, targets = prometheus
    op = OperatorProcess(
        operator_kubeconfig(cluster, api, tmp_path),
        tmp_path / "op.log",
        args=("--all-namespaces", "--prometheus-url", prom.url),
    ).start()
    stop, sent, errors = threading.Event(), [], []  # type: ignore[var-annotated]
    try:
        doc = demo(
            NAME,
            hardware={"gpuProducts": [], "gpusPerReplica": 0, "cpu": "1", "memory": "2Gi"},
            retune={"enabled": False, "checkInterval": "10s", "violationWindow": "20s"},
        )
        apply(cluster, namespace, doc, tmp_path)
        wait_phase(api, namespace, NAME, ("Serving", "Degraded"), op)
        pod = wait_for(
            lambda: [p for p in client.CoreV1Api(api).list_namespaced_pod(
                namespace, label_selector=f"{LABEL}={NAME},app.kubernetes.io/component=serving").items
                if p.status.pod_ip],
            "serving pod",
        )[0]  # fmt: skip
        assert targets.sync() == 1
        url = f"http://{pod.status.pod_ip}:8000/v1/completions"
        prompt = " ".join(f"word{i % 50}" for i in range(60))
        drivers = [
            threading.Thread(target=_drive, args=(url, prompt, stop, sent, errors), daemon=True)
            for _ in range(2)
        ]
        started = time.monotonic()
        for t in drivers:
            t.start()

        # Prometheus has the pod's series under the labels the operator's PromQL selects on.
        wait_for(
            lambda: promql(prom.url, f'vllm:e2e_request_latency_seconds_count{{namespace="{namespace}"}}'),
            "Prometheus scraping the serving pod", timeout=60,
        )  # fmt: skip

        def from_prometheus() -> dict[str, Any] | None:
            o = isvc(api, namespace, NAME)
            seen = (o.get("status") or {}).get("observed") or {}
            rate = (seen.get("figures") or {}).get("requestRate")
            elapsed = time.monotonic() - started
            # After a full 30 s PromQL window of steady traffic, figures are comparable.
            ok = seen.get("source") == "prometheus" and rate and elapsed > 35
            return o if ok else None

        obj = wait_for(from_prometheus, "observation from Prometheus", timeout=120, every=1.0)
        send_rate = len(sent) / (time.monotonic() - started)
        fig = obj["status"]["observed"]["figures"]
        ms = condition(obj, "MetricsSource")
        assert (ms["status"], ms["reason"]) == ("True", "Prometheus"), ms
        assert fig["ttftP95Ms"] > 0 and fig["e2eP95Ms"] >= fig["ttftP95Ms"]
        # The rate PromQL saw is the rate the drivers sent (within scheduling noise).
        assert 0.4 * send_rate < fig["requestRate"] < 2.0 * send_rate, (fig, send_rate)
        # Same traffic, same prompt: PromQL's mean length matches the engine's own counters.
        own = engine_prompt_mean(pod.status.pod_ip)
        assert abs(fig["promptTokensMean"] - own) <= 0.1 * own, (fig, own)
        assert "Prometheus unavailable" not in op.log()

        # Prometheus goes away: the operator reads the pods itself and says so.
        prom.stop()

        def fell_back() -> dict[str, Any] | None:
            o = isvc(api, namespace, NAME)
            c = condition(o, "MetricsSource")
            seen = (o.get("status") or {}).get("observed") or {}
            down = c.get("reason") == "PrometheusUnavailable"
            return o if down and seen.get("source") == "scrape" else None

        obj = wait_for(fell_back, "fallback to scraping pods", timeout=90, every=1.0)
        ms = condition(obj, "MetricsSource")
        assert ms["status"] == "False" and prom.url in ms["message"], ms
        assert "/metrics directly" in ms["message"]
        fig = obj["status"]["observed"]["figures"]
        assert fig["requestRate"] > 0 and fig["ttftP95Ms"] > 0
        assert obj["status"]["phase"] in ("Serving", "Degraded")  # serving is not disturbed
        # Logged once per outage, not once per check.
        assert op.log().count("Prometheus unavailable") == 1, op.log()[-2000:]
        assert len(sent) > 10, errors[-3:]
    finally:
        stop.set()
        op.stop()
