"""Helpers shared by the load-generator tests (imported by name: tests/ has no packages)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from infertune.tuner.loadgen.endpoint import Endpoint, fetch_json
from infertune.tuner.loadgen.scripted_server import boosted_priority

__all__ = ["ServerFactory", "boosted_priority", "server_log"]

ServerFactory = Callable[..., str]


def server_log(url: str) -> list[tuple[float, list[float]]]:
    """The server's own record: (request read, [token write times]) per request, in order."""
    doc = asyncio.run(fetch_json(Endpoint.parse(url), "/scripted/log"))
    return [(float(rcv), [float(t) for t in emits]) for rcv, emits in doc["log"]]
