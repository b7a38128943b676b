"""Helpers shared by the load-generator tests (imported by name: tests/ has no packages)."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable, Iterator

from infertune.tuner.loadgen.endpoint import Endpoint, fetch_json

ServerFactory = Callable[..., str]


def server_log(url: str) -> list[tuple[float, list[float]]]:
    """The server's own record: (request read, [token write times]) per request, in order."""
    doc = asyncio.run(fetch_json(Endpoint.parse(url), "/scripted/log"))
    return [(float(rcv), [float(t) for t in emits]) for rcv, emits in doc["log"]]


@contextlib.contextmanager
def boosted_priority() -> Iterator[None]:
    """Run the block ahead of ordinary work when allowed (root), as the scripted server does.

    Timing tests measure the generator, not whatever else shares this machine's two cores (a
    compiler, another engineer's cluster). Real-time FIFO where permitted (the kernel still leaves
    others 5% of each core), else nice -10, else as it is; restored afterwards.
    """
    policy, nice = os.sched_getscheduler(0), os.getpriority(os.PRIO_PROCESS, 0)
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(10))
    except OSError:
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, 0, -10)
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            os.sched_setscheduler(0, policy, os.sched_param(0))
            os.setpriority(os.PRIO_PROCESS, 0, nice)
