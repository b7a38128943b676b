"""What the handlers share, kept in kopf's memo: built at startup, never at import."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from infertune.operator.drift import Windows
from infertune.operator.k8s import Kube
from infertune.operator.metrics import OperatorMetrics
from infertune.operator.monitor import Live, PrometheusSource, Scraper
from infertune.operator.settings import OperatorSettings

Key = tuple[str, str]  # (namespace, name)


@dataclass
class Runtime:
    settings: OperatorSettings
    kube: Kube
    metrics: OperatorMetrics
    prometheus: PrometheusSource | None = None
    scrapers: dict[Key, Scraper] = field(default_factory=dict)
    windows: dict[Key, Windows] = field(default_factory=dict)
    last_check: dict[Key, float] = field(default_factory=dict)
    cooldown_noted: dict[Key, str] = field(default_factory=dict)
    traffic_seen: dict[Key, Live] = field(default_factory=dict)  # last window with enough requests
    prometheus_down: dict[Key, str] = field(
        default_factory=dict
    )  # last PromQL failure, logged once
    locks: dict[Key, asyncio.Lock] = field(default_factory=dict)
    children_resynced: dict[Key, float] = field(default_factory=dict)  # see resync_children
    # kopf indices (set by the handlers on each call): pods and nodes seen through watches.
    pods: Any = None
    nodes: Any = None

    def lock(self, key: Key) -> asyncio.Lock:
        return self.locks.setdefault(key, asyncio.Lock())

    def scraper(self, key: Key) -> Scraper:
        return self.scrapers.setdefault(key, Scraper(self.settings.scrape_timeout_s))

    def window(self, key: Key) -> Windows:
        return self.windows.setdefault(key, Windows())

    def forget(self, key: Key) -> None:
        for table in (
            self.scrapers,
            self.windows,
            self.last_check,
            self.cooldown_noted,
            self.traffic_seen,
            self.prometheus_down,
            self.locks,
            self.children_resynced,
        ):
            table.pop(key, None)  # type: ignore[attr-defined]
        self.metrics.forget(*key)
