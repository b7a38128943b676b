"""What the handlers share, kept in kopf's memo: built at startup, never at import. Everything the
operator remembers about one InferenceService between calls is one ServiceState."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from infertune.operator.drift import RetuneTimers
from infertune.operator.k8s import Kube
from infertune.operator.metrics import OperatorMetrics
from infertune.operator.monitor import Live, PrometheusSource, Scraper
from infertune.operator.settings import OperatorSettings

Key = tuple[str, str]  # (namespace, name)


@dataclass
class ServiceState:
    """In-memory state of one InferenceService (lost on restart, rebuilt from what comes next)."""

    scrapers: dict[str, Scraper] = field(default_factory=dict)  # by track: stable, canary
    timers: RetuneTimers = field(default_factory=RetuneTimers)  # violation/drift held since
    last_check: float | None = None  # monotonic time of the last SLO check
    cooldown_noted: str | None = None  # the retune reason last logged as held back
    traffic_seen: Live | None = None  # last window with enough requests
    prometheus_down: str | None = None  # last PromQL failure, logged once
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    children_resynced: float = float("-inf")  # monotonic; see tuning_run.resync_children


@dataclass
class Runtime:
    settings: OperatorSettings
    kube: Kube
    metrics: OperatorMetrics
    prometheus: PrometheusSource | None = None
    services: dict[Key, ServiceState] = field(default_factory=dict)

    def service(self, key: Key) -> ServiceState:
        state = self.services.get(key)
        if state is None:
            state = self.services[key] = ServiceState()
        return state

    def lock(self, key: Key) -> asyncio.Lock:
        return self.service(key).lock

    def scraper(self, key: Key, track: str = "stable") -> Scraper:
        scrapers = self.service(key).scrapers
        if track not in scrapers:
            scrapers[track] = Scraper(self.settings.scrape_timeout_s)
        return scrapers[track]

    def forget(self, key: Key) -> None:
        self.services.pop(key, None)
        self.metrics.forget(*key)
