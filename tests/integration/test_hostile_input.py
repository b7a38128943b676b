"""Bad and hostile InferenceServices against the real API server and a running operator.

1. A hypothesis property over >= 1,000 malformed manifests, each sent to the API server (server-side
   dry-run, so the batch stays fast): it is refused with a 422 naming the broken field, or - when the
   CRD schema cannot express the rule - the operator's validation names it.
2. A sample of those the schema lets through is applied for real: the running operator answers
   each with Ready=False/InvalidSpec naming the field and one Event, handles it once (no retry
   loop) and creates no Job.
3. Hostile but valid values (253-char names, `$(...)`/backticks/`;`, unicode, image and
   privilege overrides, host paths) are applied for real: every child stays in the object's
   namespace, commands are argv lists with no shell, user text reaches the process literally (no
   kubelet `$(VAR)` expansion), and nothing privileged or host-mounted comes from the user.
"""

from __future__ import annotations

import copy
import json
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from hostile_cases import BASE, OPERATOR_RULES, malformed, names_field, set_path
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kubernetes import client
from kubernetes.client.rest import ApiException
from operator_harness import (
    GROUP,
    PLURAL,
    VERSION,
    OperatorProcess,
    wait_for,
)
from podspec import expand  # the node agent's kubelet-style $(VAR) expansion

from infertune.operator.builders.common import model_location
from infertune.operator.validation import name_problems, spec_problems

pytestmark = pytest.mark.cluster
LABEL = "infertune.dev/inferenceservice"


def _rejection(api: Any, ns: str, doc: dict[str, Any]) -> tuple[str, str]:
    """('schema', message) on a 4xx from the API server (dry-run), else ('operator', problems)."""
    try:
        stored = client.CustomObjectsApi(api).create_namespaced_custom_object(
            GROUP, VERSION, ns, PLURAL, doc, dry_run="All"
        )
    except ApiException as e:
        assert e.status in (400, 422), (e.status, e.body)
        return "schema", str(json.loads(e.body).get("message", e.body))
    # Accepted by the schema: what the operator would read (pruned and defaulted by the server).
    problems = name_problems(stored["metadata"]["name"]) + spec_problems(stored.get("spec"))
    return "operator", "; ".join(problems)


def test_a_thousand_malformed_manifests_are_refused_naming_the_field(
    cluster: Any, api: Any, namespace: str
) -> None:
    paths: Counter[str] = Counter()
    families: Counter[str] = Counter()

    @settings(max_examples=1000, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))  # fmt: skip
    @given(malformed())
    def refused(case: tuple[dict[str, Any], str, str]) -> None:
        doc, field, family = case
        path, message = _rejection(api, namespace, doc)
        assert message, (
            f"accepted by the API server and the operator's validation: {field} in {json.dumps(doc)[:2000]}"
        )
        assert names_field(message, field), (
            f"{path} rejection does not name {field!r}: {message[:1500]}"
        )
        paths[path] += 1
        families[family] += 1

    refused()
    print(
        f"\nmalformed manifests: {sum(paths.values())} ({dict(paths)}); families {dict(families)}"
    )
    assert sum(paths.values()) >= 1000
    assert paths["schema"] >= 300 and paths["operator"] >= 100, paths


# ------------------------------------------ with a running operator (conftest's `operator`)
def _events(api: Any, ns: str, name: str) -> list[Any]:
    items = (
        client.CoreV1Api(api)
        .list_namespaced_event(ns, field_selector=f"involvedObject.name={name}")
        .items
    )
    return [e for e in items if e.reason == "InvalidSpec"]


def _condition(obj: dict[str, Any], kind: str) -> dict[str, Any]:
    return next(
        (c for c in (obj.get("status") or {}).get("conditions", []) if c["type"] == kind), {}
    )


def test_the_operator_refuses_what_the_schema_lets_through_once_and_creates_nothing(
    cluster: Any, api: Any, namespace: str, operator: OperatorProcess
) -> None:
    custom, batch = client.CustomObjectsApi(api), client.BatchV1Api(api)
    drawn: dict[str, list[Any]] = {}
    rules = st.sampled_from(OPERATOR_RULES).flatmap(lambda r: st.tuples(st.just(r), r[2]))

    @settings(max_examples=300, database=None, derandomize=True, deadline=None)
    @given(rules)
    def draw(case: tuple[tuple[str, tuple[str, ...], Any], Any]) -> None:
        drawn.setdefault(case[0][0], []).append(case[1])

    draw()
    sample: list[tuple[dict[str, Any], str]] = []
    for field, path, _ in OPERATOR_RULES:
        for value in drawn[field][-3:]:  # hypothesis' later examples are the more varied ones
            doc = copy.deepcopy(BASE)
            doc["metadata"] = {"name": f"op-{len(sample)}-{uuid.uuid4().hex[:6]}"}
            set_path(doc, path, value)
            sample.append((doc, field))
    for name in ("h" * 120 + "." + "x" * 132, "n" * 64, "llama-3.1-8b"):
        doc = copy.deepcopy(BASE)
        doc["metadata"] = {"name": name}
        sample.append((doc, "metadata.name"))
    before = operator.metric("infertune_operator_reconciles_total", result="invalid")
    for doc, _ in sample:
        custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, doc)
    for doc, field in sample:
        name = doc["metadata"]["name"]

        def refused(n: str = name) -> dict[str, Any] | None:
            o = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, n)
            return o if _condition(o, "Ready").get("reason") == "InvalidSpec" else None

        obj = wait_for(refused, f"{name} Ready=False/InvalidSpec", timeout=90)
        ready = _condition(obj, "Ready")
        assert ready["status"] == "False" and names_field(ready["message"], field), (field, ready)
        wait_for(
            lambda n=name: _events(api, namespace, n), f"InvalidSpec Event for {name}", timeout=30
        )
    time.sleep(8)  # a retry loop would show up as more reconciles and events by now
    after = operator.metric("infertune_operator_reconciles_total", result="invalid")
    assert after - before == len(sample), (
        f"{after - before} invalid reconciles for {len(sample)} objects"
    )
    for doc, _ in sample:
        events = _events(api, namespace, doc["metadata"]["name"])
        assert sum(e.count or 1 for e in events) == 1, [(e.count, e.message) for e in events]
    assert batch.list_namespaced_job(namespace).items == []
    assert operator.proc is not None and operator.proc.poll() is None, "the operator died"
    assert "Traceback" not in operator.log(), operator.log()[-4000:]
    print(f"\napplied for real: {len(sample)} schema-valid, operator-invalid manifests")


HOSTILE_VALID: list[dict[str, Any]] = [
    # 63 characters: the longest name the operator takes; children must still fit 63.
    {"name": "l" * 63, "model": {"uri": "builtin://tiny"}},
    # Kubelet variables, command substitution, backticks and `;` in everything free-form.
    # (model.revision is read since hf:// models are fetched: hf:// only, git ref characters only,
    # so hostile text there is refused: tests/unit/operator/test_hf_models.py.)
    {"name": "dollar", "model": {"uri": "builtin://tiny?$(POD_IP)#`id`;rm -rf /"}},
    {"name": "hostpath", "model": {"uri": "file:///models/tiny/$(HOME)", "name": "tiny..x"}},
    # Overrides the schema has no place for: pruned by the API server, never reach a child.
    {"name": "overrides", "model": {"uri": "pvc://models/tiny", "image": "evil:latest"},
     "image": "evil:latest", "command": ["sh", "-c", "id"], "privileged": True,
     "hardware": {"hostNetwork": True, "hostPath": "/", "securityContext": {"privileged": True}, "image": "evil:1"},
     "rollout": {"image": "evil:2", "namespace": "kube-system"}},
]  # fmt: skip


def _hostile(case: dict[str, Any]) -> dict[str, Any]:
    doc = copy.deepcopy(BASE)
    doc["metadata"] = {"name": case.pop("name")}
    for key, value in case.items():
        doc["spec"][key] = (
            {**doc["spec"].get(key, {}), **value} if isinstance(value, dict) else value
        )
    # Any node, no GPU: the Jobs run at once; no replicas: nothing heavy starts serving.
    doc["spec"]["hardware"] = {**doc["spec"]["hardware"], "gpuProducts": [], "gpusPerReplica": 0}
    doc["spec"]["rollout"] = {**doc["spec"].get("rollout", {}), "replicas": 0}
    return doc


def _containers(obj: Any) -> list[dict[str, Any]]:
    spec = obj["spec"]["template"]["spec"]
    return list(spec.get("initContainers", [])) + list(spec["containers"])


def test_hostile_values_stay_in_their_namespace_and_never_reach_a_shell(
    cluster: Any, api: Any, namespace: str, operator: OperatorProcess, tmp_path: Path
) -> None:
    docs = [_hostile(dict(c)) for c in copy.deepcopy(HOSTILE_VALID)]
    for doc in docs:
        # Straight to the API (kubectl's client-side validation would refuse the unknown fields).
        client.CustomObjectsApi(api).create_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, doc
        )
    serializer = client.ApiClient()
    for doc in docs:
        name = doc["metadata"]["name"]
        stored = client.CustomObjectsApi(api).get_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, name
        )
        text = json.dumps(stored["spec"])
        assert "evil" not in text and "privileged" not in text and "hostNetwork" not in text, text
        selector = f"{LABEL}={name[:63]}"
        try:
            deps = wait_for(
                lambda s=selector: client.AppsV1Api(api).list_namespaced_deployment(namespace, label_selector=s).items,
                f"Deployment of {name[:30]}", timeout=120,
            )  # fmt: skip
        except AssertionError as exc:
            got = client.CustomObjectsApi(api).get_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, name
            )
            raise AssertionError(
                f"{exc}\nstatus: {json.dumps(got.get('status'))[:3000]}\n{operator.log()[-3000:]}"
            ) from None
        jobs = client.BatchV1Api(api).list_namespaced_job(namespace, label_selector=selector).items
        assert jobs and deps
        for kind, obj in [("Job", j) for j in jobs] + [("Deployment", d) for d in deps]:
            body = serializer.sanitize_for_serialization(obj)
            meta = body["metadata"]
            assert meta["namespace"] == namespace and len(meta["name"]) <= 63, (kind, meta["name"])
            assert all(len(v) <= 63 for v in meta.get("labels", {}).values())
            assert meta["ownerReferences"][0]["name"] == name
            pod = body["spec"]["template"]["spec"]
            assert not any(pod.get(k) for k in ("hostNetwork", "hostPID", "hostIPC"))
            host_paths = [v for v in pod.get("volumes", []) if "hostPath" in v]
            if doc["spec"]["model"]["uri"].startswith("file://"):
                # A file:// model is a node directory by design: read-only, exactly the URI's path.
                assert [v["hostPath"]["path"] for v in host_paths] == ["/models/tiny/$(HOME)"]
            else:
                assert host_paths == [], host_paths
            for c in _containers(body):
                sc = c.get("securityContext") or {}
                assert not sc.get("privileged") and sc.get("allowPrivilegeEscalation") is False
                assert not (sc.get("capabilities") or {}).get("add")
                assert "evil" not in c["image"]
                for m in c.get("volumeMounts", []):
                    if m["name"] == "model":
                        assert m.get("readOnly") is True
                argv = list(c["command"]) + list(c.get("args") or [])
                assert all(isinstance(a, str) for a in argv)
                assert (
                    argv[0] not in ("sh", "bash", "/bin/sh", "/bin/bash") and "-c" not in argv[:3]
                ), argv
                # What the process receives after the kubelet's $(VAR) expansion: user text is literal.
                env = {e["name"]: "EXPANDED" for e in c.get("env", [])}
                received = [expand(a, env) for a in argv]
                if kind == "Deployment":
                    model = received[received.index("--model") + 1]
                    uri = doc["spec"]["model"]["uri"]
                    assert model == model_location(uri)[0], (model, uri)
                assert not any(
                    "EXPANDED" in a and "--host" not in argv[i - 1 : i]
                    for i, a in enumerate(received)
                ), received
        for kind in ("ConfigMap", "Service"):
            items = getattr(
                client.CoreV1Api(api),
                f"list_namespaced_{'config_map' if kind == 'ConfigMap' else 'service'}",
            )(namespace, label_selector=selector).items
            assert all(i.metadata.namespace == namespace for i in items)
    # Nothing landed in kube-system (spec.rollout.namespace asked for it) or anywhere else.
    for other in client.CoreV1Api(api).list_namespace().items:
        ns = other.metadata.name
        if ns == namespace:
            continue
        found = client.BatchV1Api(api).list_namespaced_job(ns, label_selector=LABEL).items
        assert not [
            j
            for j in found
            if j.metadata.labels.get(LABEL, "") in {d["metadata"]["name"][:63] for d in docs}
        ]
