"""Helpers shared by the load-generator tests (imported by name: tests/ has no packages)."""

from __future__ import annotations

from collections.abc import Callable

from infertune.testing.ground_truth import server_log
from infertune.testing.scripted_server import boosted_priority

__all__ = ["ServerFactory", "boosted_priority", "server_log"]

ServerFactory = Callable[..., str]
