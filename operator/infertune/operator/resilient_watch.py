"""Keep the operator's watches running through an API server's restart.

Just after a kube-apiserver restarts, it answers 404 for a custom resource's list and watch until
its CRD informer has synced (kubernetes/kubernetes#71218); a load balancer in front of it answers
502/503 as briefly. kopf ends a watch stream on a dropped connection and starts it again, but any
HTTP error other than 429 ends the whole operator. Ending it is worse than waiting: its pod goes
into CrashLoopBackOff's growing delays for a blip the cluster heals from in seconds, and tearing
kopf down mid-handler can hang (a timer waiting on API credentials that nobody refreshes any more).

So the one kopf function that opens a list-then-watch stream is wrapped: a transient status ends
the stream quietly, after a backoff, and kopf opens it again, listing every object anew (handlers
are idempotent and their progress is kept in annotations, so nothing is repeated). An error that
does not heal still ends the operator, with what to fix: 401/403 at once, a 404 or 5xx once it has
lasted longer than `give_up_after_s` (the CRD was never installed, the API server is gone).

kopf exposes neither its watch nor its API errors publicly; `install()` checks that the function it
wraps is still there with the signature it expects, and says so when it is not.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import inspect
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from kopf._cogs.clients import watching
from kopf._cogs.clients.errors import APIError

log = logging.getLogger("infertune.operator")

TRANSIENT_STATUSES = frozenset({404, 500, 502, 503, 504})
_EXPECTED_PARAMETERS = ("settings", "resource", "namespace", "operator_pause_waiter")
TESTED_KOPF = "1.45"  # the watch wrapped here is kopf's, as of this release


def _kopf_version() -> str:
    try:
        return importlib.metadata.version("kopf")
    except importlib.metadata.PackageNotFoundError:
        return "(unknown version)"


@dataclass(frozen=True)
class Backoff:
    first_s: float = 1.0
    factor: float = 2.0
    max_s: float = 30.0
    give_up_after_s: float = 300.0

    def delay(self, attempt: int) -> float:
        return float(min(self.max_s, self.first_s * self.factor ** max(0, attempt - 1)))


class WatchGaveUpError(RuntimeError):
    """A watch kept failing for longer than the backoff allows, or was refused outright."""


def transient(exc: BaseException) -> bool:
    return isinstance(exc, APIError) and exc.status in TRANSIENT_STATUSES


def advice(status: int) -> str:
    if status == 404:
        return (
            "the API server does not serve this resource: install the CRDs (kubectl apply -f "
            "crds/, or the Helm chart) and check `kubectl api-resources --api-group=infertune.dev`"
        )
    if status in (401, 403):
        return (
            "the operator's ServiceAccount may not list or watch it: check the chart's "
            "ClusterRole/Role and its binding"
        )
    return "the API server kept failing; check its health (kubectl get --raw /readyz)"


@dataclass
class _Outage:
    began: float
    attempts: int = 0


Watch = Callable[..., AsyncIterator[Any]]


def tolerant(
    watch: Watch, backoff: Backoff = Backoff(), clock: Callable[[], float] = time.monotonic
) -> Watch:
    """`watch` (kopf's continuous_watch), ending quietly on a transient HTTP error so that kopf
    opens it again. One outage per resource and namespace; any item received ends it."""
    outages: dict[str, _Outage] = {}

    async def tolerant_watch(**kwargs: Any) -> AsyncIterator[Any]:
        key = f"{kwargs.get('resource')} in {kwargs.get('namespace') or 'all namespaces'}"
        try:
            async for item in watch(**kwargs):
                outages.pop(key, None)  # it listed or watched something: healthy again
                yield item
        except APIError as exc:
            if exc.status in (401, 403):
                raise WatchGaveUpError(f"{key}: HTTP {exc.status}: {advice(exc.status)}") from exc
            if not transient(exc):
                raise
            now = clock()
            outage = outages.setdefault(key, _Outage(began=now))
            outage.attempts += 1
            if now - outage.began > backoff.give_up_after_s:
                raise WatchGaveUpError(
                    f"{key}: HTTP {exc.status} for {now - outage.began:.0f} s over "
                    f"{outage.attempts} attempts: {advice(exc.status)}"
                ) from exc
            delay = backoff.delay(outage.attempts)
            log.warning(
                "the watch of %s got HTTP %d (%s); opening it again in %.0f s (attempt %d; "
                "the API server may be restarting)",
                key,
                exc.status,
                str(exc).strip() or "no message",
                delay,
                outage.attempts,
            )
            await asyncio.sleep(delay)  # a watcher task of kopf's, cancelled when it stops

    tolerant_watch.infertune_tolerant = True  # type: ignore[attr-defined]
    return tolerant_watch


def install(backoff: Backoff = Backoff()) -> bool:
    """Wrap kopf's list-then-watch stream once per process (before kopf.operator starts).
    A kopf whose stream is not the one expected is left as it is, with a warning: the operator
    still runs, it only ends on such a 404 again. Returns whether the wrapper is in place."""
    current = getattr(watching, "continuous_watch", None)
    if getattr(current, "infertune_tolerant", False):
        return True
    parameters = (
        tuple(inspect.signature(current).parameters)
        if current is not None and inspect.isasyncgenfunction(current)
        else None
    )
    if current is None or parameters != _EXPECTED_PARAMETERS:
        log.warning(
            "kopf %s's continuous_watch is missing or takes %s, not %s: this kopf is not one "
            "the operator was tested with (kopf %s), so a watch answered 404 while the API "
            "server restarts will end the operator (its pod restarts it)",
            _kopf_version(),
            parameters,
            _EXPECTED_PARAMETERS,
            TESTED_KOPF,
        )
        return False
    watching.continuous_watch = tolerant(current, backoff)
    return True
