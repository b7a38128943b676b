"""Helpers shared by the load-generator tests (imported by name: tests/ has no packages)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from infertune.tuner.loadgen.endpoint import Endpoint, fetch_json

ServerFactory = Callable[..., str]


def server_log(url: str) -> list[tuple[float, list[float]]]:
    """The server's own record: (request read, [token write times]) per request, in order."""
    doc = asyncio.run(fetch_json(Endpoint.parse(url), "/scripted/log"))
    return [(float(rcv), [float(t) for t in emits]) for rcv, emits in doc["log"]]
