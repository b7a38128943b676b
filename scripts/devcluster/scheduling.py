"""The scheduler's filter step, for the node agent: which node may run a pod.

Implements the predicates the operator relies on, with the scheduler's semantics: nodeSelector,
required node affinity (matchExpressions In/NotIn/Exists/DoesNotExist/Gt/Lt and matchFields on
metadata.name), taints vs tolerations (NoSchedule/NoExecute), resource requests including
extended resources such as ``nvidia.com/gpu`` against the node's allocatable minus what the
node's non-terminated pods already request, required inter-pod affinity and anti-affinity
(labelSelector, namespaces, topologyKey), and preferred anti-affinity as the first score. Pods and nodes are plain API JSON dicts.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from decimal import Decimal
from typing import Any

Obj = dict[str, Any]

_SUFFIX = {
    "n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "": Decimal(1),
    "k": Decimal(10**3), "M": Decimal(10**6), "G": Decimal(10**9), "T": Decimal(10**12),
    "P": Decimal(10**15), "E": Decimal(10**18),
    "Ki": Decimal(2**10), "Mi": Decimal(2**20), "Gi": Decimal(2**30), "Ti": Decimal(2**40),
    "Pi": Decimal(2**50), "Ei": Decimal(2**60),
}  # fmt: skip
_QUANTITY = re.compile(r"^([+-]?[0-9.]+(?:[eE][+-]?[0-9]+)?)([a-zA-Z]*)$")


def parse_quantity(value: str | int | float) -> Decimal:
    """Parse a Kubernetes quantity ("500m", "2Gi", "1") into a Decimal."""
    m = _QUANTITY.match(str(value).strip())
    if not m or m.group(2) not in _SUFFIX:
        raise ValueError(f"invalid quantity {value!r}")
    return Decimal(m.group(1)) * _SUFFIX[m.group(2)]


def pod_requests(pod: Obj) -> defaultdict[str, Decimal]:
    """Effective requests: the sum over containers, or the max with any init container."""
    total: defaultdict[str, Decimal] = defaultdict(Decimal)
    spec = pod.get("spec", {})
    for c in spec.get("containers", []):
        res = c.get("resources") or {}
        # A limit without a request defaults the request to the limit (apiserver does this too).
        merged = {**(res.get("limits") or {}), **(res.get("requests") or {})}
        for name, q in merged.items():
            total[name] += parse_quantity(q)
    for c in spec.get("initContainers", []) or []:
        res = c.get("resources") or {}
        merged = {**(res.get("limits") or {}), **(res.get("requests") or {})}
        for name, q in merged.items():
            total[name] = max(total[name], parse_quantity(q))
    return total


def is_terminated(pod: Obj) -> bool:
    return pod.get("status", {}).get("phase") in ("Succeeded", "Failed")


def _match_expression(expr: Obj, labels: dict[str, str]) -> bool:
    key, op, values = expr.get("key", ""), expr.get("operator", ""), expr.get("values") or []
    if op == "In":
        return key in labels and labels[key] in values
    if op == "NotIn":
        return key not in labels or labels[key] not in values
    if op == "Exists":
        return key in labels
    if op == "DoesNotExist":
        return key not in labels
    if op in ("Gt", "Lt"):
        try:
            have, want = int(labels[key]), int(values[0])
        except (KeyError, ValueError, IndexError):
            return False
        return have > want if op == "Gt" else have < want
    raise ValueError(
        f"node affinity operator {op!r} is not one of In, NotIn, Exists, DoesNotExist, Gt, Lt"
    )


def _match_term(term: Obj, node: Obj) -> bool:
    labels = node["metadata"].get("labels") or {}
    fields = {"metadata.name": node["metadata"]["name"]}
    exprs = term.get("matchExpressions") or []
    field_exprs = term.get("matchFields") or []
    if not exprs and not field_exprs:
        return False  # an empty term matches no objects (scheduler semantics)
    return all(_match_expression(e, labels) for e in exprs) and all(
        _match_expression(e, fields) for e in field_exprs
    )


def matches_affinity(pod: Obj, node: Obj) -> bool:
    spec = pod.get("spec", {})
    labels = node["metadata"].get("labels") or {}
    for k, v in (spec.get("nodeSelector") or {}).items():
        if labels.get(k) != v:
            return False
    required = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or {}
    terms = required.get("nodeSelectorTerms")
    if terms is None:
        return True
    return any(_match_term(t, node) for t in terms)  # terms are ORed


def tolerates(toleration: Obj, taint: Obj) -> bool:
    effect = toleration.get("effect") or ""
    if effect and effect != taint.get("effect"):
        return False
    key = toleration.get("key") or ""
    op = toleration.get("operator") or "Equal"
    if not key:
        return op == "Exists"  # empty key + Exists tolerates everything
    if key != taint.get("key"):
        return False
    return op == "Exists" or (toleration.get("value") or "") == (taint.get("value") or "")


def untolerated_taint(pod: Obj, node: Obj) -> Obj | None:
    tolerations = pod.get("spec", {}).get("tolerations") or []
    for taint in node.get("spec", {}).get("taints") or []:
        if taint.get("effect") not in ("NoSchedule", "NoExecute"):
            continue  # PreferNoSchedule only lowers a score
        if not any(tolerates(t, taint) for t in tolerations):
            return dict(taint)
    return None


def insufficient(pod: Obj, node: Obj, pods_on_node: list[Obj]) -> list[str]:
    """Resource names whose request does not fit in what the node has left."""
    allocatable = (
        node.get("status", {}).get("allocatable") or node.get("status", {}).get("capacity") or {}
    )
    used: defaultdict[str, Decimal] = defaultdict(Decimal)
    for other in pods_on_node:
        if not is_terminated(other):
            for name, q in pod_requests(other).items():
                used[name] += q
    out = []
    if "pods" in allocatable and len(
        [p for p in pods_on_node if not is_terminated(p)]
    ) + 1 > parse_quantity(allocatable["pods"]):
        out.append("pods")
    for name, want in sorted(pod_requests(pod).items()):
        if want <= 0:
            continue
        have = parse_quantity(allocatable[name]) if name in allocatable else Decimal(0)
        if used[name] + want > have:
            out.append(name)
    return out


def _selects(term: Obj, pod: Obj, other: Obj) -> bool:
    """Whether a pod-affinity term's labelSelector (in its namespaces) picks `other`."""
    namespaces = term.get("namespaces") or [pod["metadata"].get("namespace")]
    if other["metadata"].get("namespace") not in namespaces:
        return False
    selector = term.get("labelSelector") or {}
    labels = other["metadata"].get("labels") or {}
    return all(labels.get(k) == v for k, v in (selector.get("matchLabels") or {}).items()) and all(
        _match_expression(e, labels) for e in selector.get("matchExpressions") or []
    )


def _same_domain(term: Obj, node: Obj, other: Obj, by_name: dict[str, Obj]) -> bool:
    """Whether `other` (a bound, live pod) runs in `node`'s domain of the term's topologyKey."""
    key = term.get("topologyKey", "")
    there = by_name.get(other.get("spec", {}).get("nodeName") or "")
    mine = node["metadata"].get("labels") or {}
    theirs = (there or {}).get("metadata", {}).get("labels") or {}
    return there is not None and key in mine and mine.get(key) == theirs.get(key)


def _others(pod: Obj, pods: list[Obj]) -> list[Obj]:
    """The live pods other than `pod` (by uid when it has one)."""
    uid = pod["metadata"].get("uid")
    return [
        p
        for p in pods
        if not is_terminated(p) and p is not pod and not (uid and p["metadata"].get("uid") == uid)
    ]


def pod_affinity_problem(pod: Obj, node: Obj, pods: list[Obj], by_name: dict[str, Obj]) -> str:
    """Required inter-pod (anti-)affinity as the scheduler's InterPodAffinity filter checks it
    ("" when `node` satisfies it). A pod whose required affinity matches no pod anywhere may go
    where the topology key exists if it matches its own terms (the first pod of a group)."""
    aff = pod.get("spec", {}).get("affinity") or {}
    live = _others(pod, pods)
    for term in (aff.get("podAntiAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or []:
        if any(_selects(term, pod, o) and _same_domain(term, node, o, by_name) for o in live):
            return "node(s) didn't match pod anti-affinity rules"
    for term in (aff.get("podAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or []:
        matching = [o for o in live if _selects(term, pod, o) and o.get("spec", {}).get("nodeName")]
        if any(_same_domain(term, node, o, by_name) for o in matching):
            continue
        first = not matching and _selects(term, pod, pod)
        if not (first and term.get("topologyKey", "") in (node["metadata"].get("labels") or {})):
            return "node(s) didn't match pod affinity rules"
    return ""


def anti_affinity_penalty(pod: Obj, node: Obj, pods: list[Obj], by_name: dict[str, Obj]) -> int:
    """Weights of the preferred anti-affinity terms `node` would break (the scheduler's score)."""
    aff = (pod.get("spec", {}).get("affinity") or {}).get("podAntiAffinity") or {}
    live = _others(pod, pods)
    total = 0
    for weighted in aff.get("preferredDuringSchedulingIgnoredDuringExecution") or []:
        term = weighted.get("podAffinityTerm") or {}
        if any(_selects(term, pod, o) and _same_domain(term, node, o, by_name) for o in live):
            total += int(weighted.get("weight", 1))
    return total


def choose_node(pod: Obj, nodes: list[Obj], pods: list[Obj]) -> tuple[Obj | None, str]:
    """The feasible node with the least preferred anti-affinity broken, then the least loaded,
    or None with a scheduler-style explanation."""
    reasons: Counter[str] = Counter()
    feasible: list[tuple[int, int, str, Obj]] = []
    by_name = {n["metadata"]["name"]: n for n in nodes}
    for node in nodes:
        name = node["metadata"]["name"]
        if node.get("spec", {}).get("unschedulable"):
            reasons["node(s) were unschedulable"] += 1
            continue
        if not matches_affinity(pod, node):
            reasons["node(s) didn't match node selector"] += 1
            continue
        taint = untolerated_taint(pod, node)
        if taint is not None:
            reasons[
                f"node(s) had taint {{{taint.get('key')}: {taint.get('value', '')}}}, that the pod didn't tolerate"
            ] += 1
            continue
        on_node = [p for p in pods if p.get("spec", {}).get("nodeName") == name]
        short = insufficient(pod, node, on_node)
        if short:
            for r in short:
                reasons[f"Insufficient {r}"] += 1
            continue
        affinity = pod_affinity_problem(pod, node, pods, by_name)
        if affinity:
            reasons[affinity] += 1
            continue
        penalty = anti_affinity_penalty(pod, node, pods, by_name)
        feasible.append((penalty, len([p for p in on_node if not is_terminated(p)]), name, node))
    if feasible:
        return min(feasible, key=lambda t: (t[0], t[1], t[2]))[3], ""
    # Same text as kube-scheduler's FitError: "<count> <reason>" strings, sorted.
    detail = ", ".join(sorted(f"{n} {r}" for r, n in reasons.items()))
    return None, f"0/{len(nodes)} nodes are available: {detail}."
