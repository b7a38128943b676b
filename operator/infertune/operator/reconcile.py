"""Classify, then act: Create / Update / Unchanged is decided purely from (desired, actual); one
small function executes it, so running a reconcile twice changes nothing the second time."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from infertune.operator.builders.common import ANN_DESIRED
from infertune.operator.k8s import Kube

Obj = dict[str, Any]


@dataclass(frozen=True)
class Action:
    verb: Literal["create", "update", "unchanged"]
    desired: Obj

    @property
    def kind(self) -> str:
        return str(self.desired["kind"])

    @property
    def name(self) -> str:
        return str(self.desired["metadata"]["name"])


def classify(desired: Obj, actual: Obj | None) -> Action:
    """Compare by the desired-hash annotation the builders stamp, never by server-defaulted fields."""
    if actual is None:
        return Action("create", desired)
    want = desired["metadata"].get("annotations", {}).get(ANN_DESIRED)
    have = (actual.get("metadata", {}).get("annotations") or {}).get(ANN_DESIRED)
    return Action("unchanged" if want is not None and want == have else "update", desired)


async def apply(kube: Kube, action: Action) -> str:
    """Execute one action; returns the verb actually done (a lost create race counts as unchanged)."""
    ns = action.desired["metadata"]["namespace"]
    if action.verb == "create":
        return "create" if await kube.create(action.desired) else "unchanged"
    if action.verb == "update":
        # A merge patch of the whole desired object: lists (containers, ports) are replaced as a whole,
        # fields the server defaulted stay as they are.
        body = {k: v for k, v in action.desired.items() if k not in ("apiVersion", "kind")}
        await kube.merge_patch(action.kind, ns, action.name, body)
        return "update"
    return "unchanged"


async def ensure(kube: Kube, desired: Obj) -> str:
    actual = await kube.get(
        desired["kind"], desired["metadata"]["namespace"], desired["metadata"]["name"]
    )
    return await apply(kube, classify(desired, actual))


def merge_patch(old: Any, new: Any) -> Any:
    """RFC 7386 patch turning `old` into `new` (None when equal); lists are replaced whole."""
    if isinstance(old, dict) and isinstance(new, dict):
        patch: Obj = {}
        for key in old.keys() - new.keys():
            patch[key] = None
        for key, value in new.items():
            if key not in old:
                patch[key] = value
                continue
            sub = merge_patch(old[key], value)
            if sub is not None:
                patch[key] = sub
        return patch or None
    return None if old == new else new
