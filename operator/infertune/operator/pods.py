"""The few facts the operator needs of a pod, kept small (the pod index holds one per pod)."""

from __future__ import annotations

from typing import Any

from infertune.operator.builders.common import LABEL_COMPONENT, LABEL_TRACK


def pod_summary(body: Any) -> dict[str, Any]:
    """What the operator needs of a pod, kept small: the index holds one per pod in memory."""
    meta, spec, st = body.get("metadata", {}), body.get("spec", {}), body.get("status", {})
    labels = meta.get("labels") or {}
    conds = {c.get("type"): c.get("status") for c in st.get("conditions") or []}
    scheduled = next(
        (c for c in st.get("conditions") or [] if c.get("type") == "PodScheduled"), None
    )
    out: dict[str, Any] = {
        "name": meta.get("name"),
        "uid": meta.get("uid"),
        "component": labels.get(LABEL_COMPONENT),
        "track": labels.get(LABEL_TRACK),
        "job": labels.get("job-name"),
        "node": spec.get("nodeName"),
        "ip": st.get("podIP"),
        "phase": st.get("phase"),
        "ready": conds.get("Ready") == "True",
        "revision": labels.get("pod-template-hash"),  # which ReplicaSet: old or new template
    }
    if scheduled and scheduled.get("status") == "False" and not spec.get("nodeName"):
        # The scheduler's own words ("0/2 nodes are available: 2 Insufficient nvidia.com/gpu.").
        out["unschedulable"] = (
            scheduled.get("message") or scheduled.get("reason") or "Unschedulable"
        )
    for cs in st.get("initContainerStatuses") or []:
        state = cs.get("state") or {}
        term = state.get("terminated") or {}
        if not term and state.get("waiting"):  # restarted by the kubelet: the last attempt's end
            term = (cs.get("lastState") or {}).get("terminated") or {}
        if term and not term.get("exitCode") and cs.get("name") == "fetch-model":
            out["fetched"] = term.get("message")  # what it fetched: URIs, commits, bytes
        if term.get("exitCode"):
            # A failed init step (the hf:// fetch): its exit code and message say why.
            out["init_failed"] = {
                "container": cs.get("name"),
                "pod": meta.get("name"),
                "component": labels.get(LABEL_COMPONENT),
                "exit_code": term.get("exitCode"),
                "message": term.get("message"),
            }
    for cs in st.get("containerStatuses") or []:
        term = (cs.get("state") or {}).get("terminated")
        last = (cs.get("lastState") or {}).get("terminated") or {}
        killed: dict[str, Any] = term if term and term.get("reason") == "OOMKilled" else last
        if killed.get("reason") == "OOMKilled":
            # The kernel killed it at its memory limit (now, or the attempt before a restart).
            out["oom_killed"] = {
                "container": cs.get("name"),
                "restarts": cs.get("restartCount") or 0,
                "at": killed.get("finishedAt"),
            }
        if term:
            out.update(
                terminated=True, message=term.get("message"), finished_at=term.get("finishedAt")
            )
    return out
