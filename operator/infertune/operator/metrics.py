"""The operator's own metrics on /metrics (prometheus-client, a private registry per operator)."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server


@dataclass
class OperatorMetrics:
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        r = self.registry
        self.reconciles = Counter(
            "infertune_operator_reconciles",
            "InferenceService reconciles.",
            ["trigger", "result"],
            registry=r,
        )
        self.tuning_runs = Counter(
            "infertune_operator_tuning_runs",
            "Tuning runs by start reason and outcome.",
            ["reason", "result"],
            registry=r,
        )
        self.tuning_duration = Histogram(
            "infertune_operator_tuning_duration_seconds",
            "Wall time of finished tuning Jobs.",
            ["result"],
            buckets=(30, 60, 120, 300, 600, 1200, 1800, 3600, 7200, 14400, float("inf")),
            registry=r,
        )
        self.slo_met = Gauge(
            "infertune_operator_slo_met", "1 when the live service meets its SLOs, 0 when not.",
            ["namespace", "name"], registry=r,
        )  # fmt: skip
        self.slo_checks = Counter(
            "infertune_operator_slo_checks", "SLO checks by outcome (met, violated, no_traffic).",
            ["namespace", "name", "outcome"], registry=r,
        )  # fmt: skip
        self.retunes = Counter(
            "infertune_operator_retunes", "Retunes started, by reason.", ["reason"], registry=r
        )
        self.api_calls = Counter(
            "infertune_operator_api_calls", "Kubernetes API calls made by the operator's adapter.",
            ["verb", "kind"], registry=r,
        )  # fmt: skip

    def forget(self, namespace: str, name: str) -> None:
        """Drop a deleted service's series (label sets otherwise live forever)."""
        with contextlib.suppress(KeyError):
            self.slo_met.remove(namespace, name)
        for outcome in ("met", "violated", "no_traffic"):
            with contextlib.suppress(KeyError):
                self.slo_checks.remove(namespace, name, outcome)

    def serve(self, port: int) -> Any:
        """Start the /metrics endpoint; returns the server (port 0 picks a free port)."""
        server, _thread = start_http_server(port, registry=self.registry)
        return server
