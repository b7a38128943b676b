"""The only module that touches the Kubernetes client. Raw JSON in and out (builders produce API
dicts already), calls run in a worker thread, and API errors become kopf's retry semantics:
409 -> TemporaryError(delay), 429 -> TemporaryError(Retry-After), 404 on reads -> None, and an
unreachable API server (refused, reset, timed out) or a path it does not serve yet (a 404 that is
not a Status: just restarted) -> TemporaryError(delay=UNREACHABLE_DELAY_S)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import kopf
from kubernetes import client as k8s_client
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError as TransportError

from infertune.operator.api import GROUP, PLURAL, VERSION
from infertune.operator.metrics import OperatorMetrics

Obj = dict[str, Any]

# kind -> (API prefix, plural)
KINDS: dict[str, tuple[str, str]] = {
    "ConfigMap": ("/api/v1", "configmaps"),
    "Service": ("/api/v1", "services"),
    "Pod": ("/api/v1", "pods"),
    "Job": ("/apis/batch/v1", "jobs"),
    "Deployment": ("/apis/apps/v1", "deployments"),
    "InferenceService": (f"/apis/{GROUP}/{VERSION}", PLURAL),
}
MERGE = "application/merge-patch+json"
# An API server that restarts (upgrade, crash) refuses connections for seconds: retry soon rather
# than after kopf's 60 s default for unexpected exceptions, which would stall every reconcile.
UNREACHABLE_DELAY_S = 5.0


class ApiError(Exception):
    def __init__(self, status: int, message: str, *, unserved: bool = False) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status
        self.message = message
        # A 404 without a Status object: no handler serves the path at all. An object that does
        # not exist is answered with a Status (reason NotFound); a path nobody serves, with the
        # mux's plain "404 page not found", which a restarted API server says for a custom
        # resource until it has loaded the CRD again (kubernetes/kubernetes#71218).
        self.unserved = unserved


def build_api_client(kubeconfig: str | None = None) -> Any:
    """In-cluster service-account credentials when running in a pod, else the kubeconfig."""
    cfg = k8s_client.Configuration()
    if (
        kubeconfig is None
        and os.environ.get("KUBERNETES_SERVICE_HOST")
        and Path("/var/run/secrets/kubernetes.io/serviceaccount/token").exists()
    ):
        k8s_config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
    else:
        k8s_config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=kubeconfig, client_configuration=cfg, persist_config=False
        )
    return k8s_client.ApiClient(cfg)


def connection_info(api_client: Any) -> kopf.ConnectionInfo:
    """kopf's own watch connections use the same credentials as the adapter's client."""
    cfg = api_client.configuration
    raw = next(
        (v for k, v in (cfg.api_key or {}).items() if k in ("authorization", "BearerToken")), None
    )
    # The kubernetes client's in-cluster loader stores "bearer <token>" (lower case): kopf adds
    # its own scheme, so any case of the prefix goes (else the API server sees "Bearer bearer ...").
    token = str(raw).strip() if raw else None
    if token and token[:7].lower() == "bearer ":
        token = token[7:].strip()
    return kopf.ConnectionInfo(
        server=cfg.host,
        ca_path=cfg.ssl_ca_cert,
        insecure=not cfg.verify_ssl,
        certificate_path=cfg.cert_file,
        private_key_path=cfg.key_file,
        scheme="Bearer" if token else None,
        token=token,
    )


def _path(kind: str, namespace: str, name: str | None = None, sub: str | None = None) -> str:
    prefix, plural = KINDS[kind]
    path = f"{prefix}/namespaces/{namespace}/{plural}"
    if name:
        path += f"/{name}"
    if sub:
        path += f"/{sub}"
    return path


class Kube:
    """Async facade over one ApiClient; every call counted in the operator's metrics."""

    def __init__(self, api_client: Any, metrics: OperatorMetrics | None = None) -> None:
        self.api = api_client
        self.metrics = metrics

    def _request(
        self, method: str, path: str, body: Any = None, content_type: str | None = None
    ) -> Any:
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = content_type or "application/json"
        params = self.api.param_serialize(
            method=method,
            resource_path=path,
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
        )
        try:
            resp = self.api.call_api(*params, _request_timeout=30)
        except ApiException as exc:  # the REST layer raises for Retry-After responses itself
            raise ApiError(int(exc.status or 0), str(exc.body or exc.reason)) from exc
        data = resp.read()
        if resp.status >= 300:
            text = data.decode(errors="replace") if isinstance(data, bytes) else str(data)
            status_object = False
            with contextlib.suppress(ValueError, AttributeError):
                decoded = json.loads(text)
                status_object = decoded.get("kind") == "Status"
                text = decoded.get("message", text)
            err = ApiError(resp.status, text.strip(), unserved=not status_object)
            err.retry_after = resp.getheader("Retry-After")  # type: ignore[attr-defined]
            raise err
        return json.loads(data) if data else None

    async def call(
        self,
        verb: str,
        kind: str,
        method: str,
        path: str,
        body: Any = None,
        content_type: str | None = None,
    ) -> Any:
        if self.metrics is not None:
            self.metrics.api_calls.labels(verb, kind).inc()
        try:
            return await asyncio.to_thread(self._request, method, path, body, content_type)
        except ApiError as err:
            mapped = _retryable(err, f"{verb} {kind}")
            if mapped is err:
                raise
            raise mapped from err
        except (TransportError, OSError) as err:  # urllib3 already retried the connection
            raise kopf.TemporaryError(
                f"{verb} {kind}: API server unreachable ({type(err).__name__}); retrying",
                delay=UNREACHABLE_DELAY_S,
            ) from err

    async def get(self, kind: str, namespace: str, name: str) -> Obj | None:
        try:
            result: Obj = await self.call("get", kind, "GET", _path(kind, namespace, name))
            return result
        except ApiError as err:
            if err.status == 404:
                return None
            raise

    async def list(self, kind: str, namespace: str, label_selector: str) -> list[Obj]:
        path = _path(kind, namespace) + "?" + urlencode({"labelSelector": label_selector})
        result: Obj = await self.call("list", kind, "GET", path)
        items: list[Obj] = result.get("items") or []
        return items

    async def create(self, obj: Obj) -> bool:
        """Create; False when it already exists (creation is idempotent by name)."""
        meta = obj["metadata"]
        try:
            await self.call(
                "create", obj["kind"], "POST", _path(obj["kind"], meta["namespace"]), obj
            )
        except ApiError as err:
            if err.status == 409:
                return False
            raise
        return True

    async def merge_patch(self, kind: str, namespace: str, name: str, patch: Obj) -> Obj:
        result: Obj = await self.call(
            "patch", kind, "PATCH", _path(kind, namespace, name), patch, MERGE
        )
        return result

    async def delete(self, kind: str, namespace: str, name: str) -> bool:
        body = {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Background"}
        try:
            await self.call("delete", kind, "DELETE", _path(kind, namespace, name), body)
        except ApiError as err:
            if err.status == 404:
                return False
            raise
        return True

    async def patch_status(
        self, namespace: str, name: str, status_patch: Obj, resource_version: str | None
    ) -> Obj:
        """Merge-patch the status subresource; with a resourceVersion the write is conditional."""
        body: Obj = {"status": status_patch}
        if resource_version:
            body["metadata"] = {"resourceVersion": resource_version}
        kind = "InferenceService"
        result: Obj = await self.call(
            "patch-status", kind, "PATCH", _path(kind, namespace, name, "status"), body, MERGE
        )
        return result


def _retryable(err: ApiError, what: str) -> Exception:
    """Map API errors onto kopf's retry semantics (reads keep their 404 for the caller)."""
    if err.status == 404 and err.unserved:  # not "no such object": the path is not served yet
        return kopf.TemporaryError(
            f"{what}: the API server does not serve it ({err.message}): restarting, or the CRD "
            "is missing; retrying",
            delay=UNREACHABLE_DELAY_S,
        )
    if err.status == 404 or (err.status == 409 and what.startswith("create")):
        return err
    if err.status == 409:
        return kopf.TemporaryError(
            f"{what}: conflict ({err.message}); retrying with fresh state", delay=1
        )
    if err.status == 429:
        delay = getattr(err, "retry_after", None)
        try:
            seconds = float(delay) if delay else 5.0
        except ValueError:
            seconds = 5.0
        return kopf.TemporaryError(f"{what}: API server throttled the operator", delay=seconds)
    if err.status >= 500 or err.status == 0:
        return kopf.TemporaryError(
            f"{what}: API server error {err.status}: {err.message}", delay=10
        )
    if err.status == 403:
        return kopf.TemporaryError(
            f"{what}: forbidden by RBAC ({err.message}); see infertune.operator.rbac", delay=60
        )
    return err
