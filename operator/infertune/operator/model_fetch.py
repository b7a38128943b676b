"""A failed hf:// fetch, as the InferenceService's condition: the field to fix and the Hub's answer.

The fetch-model init step (infertune.tuner.fetch_cli) writes a JSON termination message saying
what failed (hub_fetch.FetchError: repo, revision, token, network, hub, disk), with the Hub's
status code, reason and X-Error-Code; the operator knows the spec, so it names the field here:
spec.model.uri (or the variant's uri), spec.model.revision when the revision came from that field,
spec.model.tokenSecret, spec.model.cache.size.
"""

from __future__ import annotations

import json
from typing import Any

from infertune.operator.api import InferenceService
from infertune.operator.builders.common import FETCH_CONTAINER
from infertune.operator.conditions import get_condition
from infertune.operator.context import Ctx, log
from infertune.tuner.api.model import split_hf_uri
from infertune.tuner.fetch_cli import EXIT_PERMANENT
from infertune.tuner.models import pinned_uri

# FetchError.what -> the condition's reason.
REASONS = {
    "repo": "ModelNotFound",
    "revision": "RevisionNotFound",
    "token": "ModelAccessDenied",
    "disk": "ModelCacheFull",
    "cache": "ModelCacheUnwritable",
}
DEFAULT_REASON = "ModelFetchFailed"


def _uri_field(isvc: InferenceService, uri: str) -> str:
    model = isvc.spec.model
    if uri in (model.uri, pinned_uri(model)):
        return "spec.model.uri"
    for q, v in model.variants.items() if model.variants else []:
        if uri == v.uri:
            return f"spec.model.variants.{q}.uri"
    return "spec.model.uri"


def _field(isvc: InferenceService, what: str, uri: str) -> str:
    model = isvc.spec.model
    if what == "token":
        ref = model.token_secret
        if ref is None:
            return "spec.model.tokenSecret (not set)"
        return f"spec.model.tokenSecret (Secret {ref.name!r}, key {ref.key!r})"
    if what == "disk":
        return "spec.model.cache.size"
    if what == "cache":
        return "spec.model.cache.claimName (or the chart's modelCache.claimName)"
    field = _uri_field(isvc, uri)
    from_field = model.revision is not None and split_hf_uri(model.uri)[1] is None
    if what == "revision" and field == "spec.model.uri" and from_field:
        return "spec.model.revision"
    return field


def describe_failure(isvc: InferenceService, failed: dict[str, Any]) -> tuple[str, str, bool]:
    """(reason, message, permanent) for a pod's failed fetch-model init step (pods.pod_summary's
    `init_failed`). The message starts with the field to fix and carries the Hub's answer."""
    raw = failed.get("message") or ""
    try:
        record = json.loads(raw)
    except ValueError:
        record = None
    permanent = is_permanent(failed)
    if not isinstance(record, dict) or "what" not in record:
        tail = raw.strip().splitlines()[-1] if raw.strip() else "no message"
        return (
            DEFAULT_REASON,
            f"spec.model.uri: the fetch-model step failed (exit {failed.get('exit_code')}): {tail}",
            permanent,
        )
    what = str(record.get("what"))
    field = _field(isvc, what, str(record.get("uri") or ""))
    message = f"{field}: {record.get('message') or 'the fetch failed'}"
    return REASONS.get(what, DEFAULT_REASON), message, permanent


def fetched_bytes(pod: dict[str, Any], uri: str) -> int | None:
    """Bytes of `uri` as the pod's fetch step reported them (its success message), if it did."""
    try:
        record = json.loads(pod.get("fetched") or "")
    except ValueError:
        return None
    done = record.get("fetched") if isinstance(record, dict) else None
    sizes = [d.get("bytes") for d in done or [] if isinstance(d, dict) and d.get("uri") == uri]
    return int(sizes[0]) if sizes and isinstance(sizes[0], int) else None


def is_permanent(failed: dict[str, Any]) -> bool:
    """The step exited with EXIT_PERMANENT: no retry can help (the spec or the Secret must change)."""
    return bool(failed.get("exit_code") == EXIT_PERMANENT)


def fetch_failure(pods: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The latest failed fetch-model init step among `pods` (pod summaries), if any."""
    failed = [
        p["init_failed"]
        for p in pods
        if (p.get("init_failed") or {}).get("container") == FETCH_CONTAINER
    ]
    return failed[-1] if failed else None


SERVING_NOTE = "serving pod"


def report_serving(ctx: Ctx, pods: list[dict[str, Any]]) -> bool:
    """A serving pod whose fetch fails (an emptyDir cache re-downloads per pod; a token revoked
    since tuning): ModelFetched=False naming the field and the Hub's answer, and a Warning event,
    once per distinct failure (the kubelet retries the pod with its back-off); back to True once
    no serving pod fails and one is ready. True when the status changed."""
    serving = [p for p in pods if p.get("component") == "serving"]
    failed = fetch_failure(serving)
    shown = get_condition(ctx.status.conditions, "ModelFetched")
    if failed is None:
        ours = shown is not None and shown.status == "False" and SERVING_NOTE in shown.message
        if ours and any(p.get("ready") for p in serving):
            ctx.condition("ModelFetched", "True", "Fetched", "the serving pods fetched the model")
            return True
        return False
    reason, message, _ = describe_failure(ctx.isvc, failed)
    message = (
        f"{message} ({SERVING_NOTE} {failed.get('pod')}; the kubelet retries it with back-off)"
    )
    if shown is not None and (shown.status, shown.reason, shown.message) == (
        "False",
        reason,
        message,
    ):
        return False
    ctx.condition("ModelFetched", "False", reason, message)
    log.warning("%s/%s: %s", *ctx.key, message)
    ctx.event("Warning", reason, message)
    return True
