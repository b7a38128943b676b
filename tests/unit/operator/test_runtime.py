"""Runtime keeps one ServiceState per InferenceService: scrapers by track, and forget drops it all."""

from __future__ import annotations

from typing import Any, cast

from infertune.operator.metrics import OperatorMetrics
from infertune.operator.runtime import Runtime
from infertune.operator.settings import OperatorSettings


def _runtime() -> Runtime:
    # No API calls here: the client is never touched.
    return Runtime(settings=OperatorSettings(), kube=cast(Any, None), metrics=OperatorMetrics())


def test_one_state_per_service_with_a_scraper_per_track() -> None:
    rt = _runtime()
    key = ("ns", "svc")
    assert rt.service(key) is rt.service(key)
    assert rt.lock(key) is rt.service(key).lock
    assert rt.lock(key) is not rt.lock(("ns", "other"))
    stable, canary = rt.scraper(key), rt.scraper(key, "canary")
    assert stable is not canary
    assert rt.scraper(key, "stable") is stable
    assert stable.timeout_s == rt.settings.scrape_timeout_s


def test_forget_drops_the_whole_record_canary_scraper_included() -> None:
    rt = _runtime()
    key = ("ns", "svc")
    state = rt.service(key)
    rt.scraper(key, "canary")
    state.last_check, state.cooldown_noted, state.prometheus_down = 1.0, "SLOViolation", "down"
    rt.service(("ns", "kept"))
    rt.forget(key)
    assert key not in rt.services and ("ns", "kept") in rt.services
    fresh = rt.service(key)
    assert fresh is not state
    assert (fresh.scrapers, fresh.last_check, fresh.cooldown_noted) == ({}, None, None)
    assert fresh.timers.violating_since is None and fresh.children_resynced == float("-inf")
