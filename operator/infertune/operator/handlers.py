"""kopf handlers, registered into a registry built from the operator's settings. They adapt kopf's
calls (bodies, indices, memo) to the flows (reactions.py, tuning_run.py, rollout.py) and to
checking.py, and hold the per-object lock."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import kopf

from infertune.operator import checking, placement, reactions, rollout, tuning_run
from infertune.operator.api import GROUP, PLURAL, VERSION
from infertune.operator.builders.common import (
    LABEL_COMPONENT,
    LABEL_ISVC,
    LABEL_MANAGED,
    MANAGED_BY,
)
from infertune.operator.k8s import Kube, build_api_client, connection_info
from infertune.operator.metrics import OperatorMetrics
from infertune.operator.monitor import PrometheusSource
from infertune.operator.pods import pod_summary
from infertune.operator.runtime import Runtime
from infertune.operator.settings import OperatorSettings
from infertune.tuner.gpu_identity import GpuIdentity, from_node_labels

ISVC = (GROUP, VERSION, PLURAL)
OURS = {LABEL_MANAGED: MANAGED_BY}
EVENT_ATTEMPTS = 6
log = logging.getLogger("infertune.operator")


async def _retrying(what: str, attempt: Callable[[], Awaitable[None]]) -> None:
    """kopf never retries an on.event handler: a 409, 429 or 5xx while ingesting a finished Job
    would lose its result for good (no further event comes). Retry here, each attempt from fresh
    state (the flows re-read the object), sleeping outside the per-object lock."""
    for n in range(1, EVENT_ATTEMPTS + 1):
        try:
            await attempt()
            return
        except kopf.TemporaryError as err:
            if n == EVENT_ATTEMPTS:
                raise
            log.info(
                "%s: %s; attempt %d of %d in %.0fs",
                what,
                err,
                n + 1,
                EVENT_ATTEMPTS,
                err.delay or 1,
            )
            await asyncio.sleep(float(err.delay or 1.0))


def _values(index: Any, key: Any) -> list[Any]:
    store: Iterable[Any] = index.get(key, []) if index is not None else []
    return list(store)


def _nodes(index: Any) -> dict[str, GpuIdentity | None]:
    if index is None:
        return {}
    return {name: next(iter(store), None) for name, store in index.items()}


def _rt(memo: Any) -> Runtime:
    runtime: Runtime = memo.rt
    return runtime


def _key(body: Any, *, owner_label: bool) -> tuple[str, str]:
    meta = body.get("metadata", {})
    name = (meta.get("labels") or {}).get(LABEL_ISVC, "") if owner_label else meta.get("name", "")
    return str(meta.get("namespace", "")), str(name)


def _never_handled(**kw: Any) -> bool:
    """A new object's first event (kopf's filter: other events do not even reach the handler)."""
    body = kw["body"]
    if kw.get("type") not in (None, "ADDED") or (body.get("status") or {}).get("tuning"):
        return False
    return not body.get("metadata", {}).get("deletionTimestamp")


def build_registry(settings: OperatorSettings) -> kopf.OperatorRegistry:
    registry = kopf.OperatorRegistry()

    @kopf.on.startup(registry=registry, id="startup")
    async def startup(**kw: Any) -> None:
        memo, logger = kw["memo"], kw["logger"]
        op: OperatorSettings = memo.op_settings
        metrics = OperatorMetrics()
        if op.metrics_port is not None:
            server = metrics.serve(op.metrics_port)
            memo.metrics_port = server.server_port
            logger.info("operator metrics on :%d/metrics", server.server_port)
        memo.rt = Runtime(
            settings=op,
            kube=Kube(build_api_client(memo.kubeconfig), metrics),
            metrics=metrics,
            prometheus=PrometheusSource(op.prometheus_url, op.scrape_timeout_s)
            if op.prometheus_url
            else None,
        )

    @kopf.on.login(registry=registry, id="login")
    def login(**kw: Any) -> kopf.ConnectionInfo:
        # A custom registry has none of kopf's default login handlers: log in like the adapter.
        return connection_info(build_api_client(kw["memo"].kubeconfig))

    @kopf.index("", "v1", "pods", labels=OURS, registry=registry, id="infertune_pods")
    def infertune_pods(**kw: Any) -> dict[Any, Any]:
        body = kw["body"]
        key = _key(body, owner_label=True)
        return {key: pod_summary(body)} if key[1] else {}

    @kopf.index("", "v1", "nodes", registry=registry, id="infertune_nodes")
    def infertune_nodes(**kw: Any) -> dict[Any, Any]:
        # GFD's product and memory labels, as the one identity the tuner's result is compared in.
        return {kw["name"]: from_node_labels(kw["labels"])}

    async def spec_handler(**kw: Any) -> None:
        rt, body = _rt(kw["memo"]), kw["body"]
        async with rt.lock(_key(body, owner_label=False)):
            await reactions.on_spec(rt, body, str(kw.get("reason", "")))

    @kopf.on.event(*ISVC, registry=registry, id="first_sight", when=_never_handled)
    async def first_sight(**kw: Any) -> None:
        # The keep-checking timer makes kopf add its finalizer before any create handler runs: a
        # PATCH and another watch event between `kubectl apply` and the Job. A new object's first
        # event starts the run at once instead; the create handler then finds it started (the
        # run id is deterministic, creation idempotent) and only checks.
        body = kw["body"]
        rt = _rt(kw["memo"])
        async with rt.lock(_key(body, owner_label=False)):
            await reactions.on_first_sight(rt, body)

    for decorator in (kopf.on.create, kopf.on.resume):
        decorator(*ISVC, registry=registry, id="spec")(spec_handler)
    kopf.on.update(*ISVC, field="spec", registry=registry, id="spec")(spec_handler)

    @kopf.on.delete(*ISVC, optional=True, registry=registry, id="forget")
    async def forget(**kw: Any) -> None:
        _rt(kw["memo"]).forget(
            _key(kw["body"], owner_label=False)
        )  # children go by owner references

    @kopf.on.event(
        "batch",
        "v1",
        "jobs",
        labels={**OURS, LABEL_COMPONENT: "tuning"},
        registry=registry,
        id="tuning_job",
    )
    async def tuning_job(**kw: Any) -> None:
        if kw.get("type") == "DELETED":
            return
        rt, body = _rt(kw["memo"]), kw["body"]
        key = _key(body, owner_label=True)
        pods, nodes = _values(kw.get("infertune_pods"), key), _nodes(kw.get("infertune_nodes"))

        async def attempt() -> None:
            async with rt.lock(key):
                await tuning_run.ingest_job(rt, dict(body), pods, nodes)

        await _retrying(f"ingest Job {body['metadata'].get('name')}", attempt)

    @kopf.on.event(
        "apps",
        "v1",
        "deployments",
        labels={**OURS, LABEL_COMPONENT: "serving"},
        registry=registry,
        id="serving_deployment",
    )
    async def serving_deployment(**kw: Any) -> None:
        if kw.get("type") == "DELETED":
            return
        rt, body = _rt(kw["memo"]), kw["body"]

        async def attempt() -> None:
            async with rt.lock(_key(body, owner_label=True)):
                await rollout.on_deployment(rt, dict(body))

        await _retrying(f"track Deployment {body['metadata'].get('name')}", attempt)

    @kopf.timer(
        *ISVC, interval=settings.monitor_tick_s, sharp=False, registry=registry, id="keep_checking"
    )
    async def keep_checking(**kw: Any) -> None:
        rt, body = _rt(kw["memo"]), kw["body"]
        key = _key(body, owner_label=False)
        pods, nodes = _values(kw.get("infertune_pods"), key), _nodes(kw.get("infertune_nodes"))
        async with rt.lock(key):
            if await placement.check(rt, body, pods):
                return  # the body is stale now; the next tick checks from fresh state
            if await tuning_run.resync_children(rt, body, pods, nodes):
                return
            await checking.check(rt, body, pods, nodes)

    return registry


def kopf_settings(_op: OperatorSettings) -> kopf.OperatorSettings:
    """Keep kopf's own writes and events to what an idle fleet can afford."""
    settings = kopf.OperatorSettings()
    prefix = "infertune.dev"
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=prefix)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix=prefix)
    settings.persistence.finalizer = f"{prefix}/operator"
    # kopf's own INFO lines ("Handler succeeded") stay in the log; our events are posted explicitly.
    settings.posting.level = logging.WARNING
    settings.peering.standalone = _op.peering is None
    if _op.peering is not None:
        settings.peering.name = _op.peering
        settings.peering.mandatory = True
        settings.peering.clusterwide = _op.all_namespaces
    settings.networking.request_timeout = 60
    settings.watching.server_timeout = 300
    settings.batching.worker_limit = 64
    return settings
