"""Generate the CustomResourceDefinition from the pydantic models (never hand-edit crds/)."""

from __future__ import annotations

import copy
from typing import Any

import yaml

from infertune.operator.api import (
    GROUP,
    KIND,
    PLURAL,
    SHORT_NAMES,
    SINGULAR,
    VERSION,
    InferenceServiceSpec,
    InferenceServiceStatus,
)

# Keywords Kubernetes' structural schemas accept (apiextensions.k8s.io/v1 JSONSchemaProps).
_KEEP = {
    "type", "format", "description", "properties", "items", "required", "enum", "pattern",
    "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "minLength", "maxLength",
    "minItems", "maxItems", "uniqueItems", "additionalProperties", "nullable",
}  # fmt: skip


def _resolve(node: Any, defs: dict[str, Any]) -> Any:
    """Inline $refs: structural schemas cannot reference definitions."""
    if isinstance(node, dict):
        if "$ref" in node:
            target = defs[node["$ref"].split("/")[-1]]
            merged = {**copy.deepcopy(target), **{k: v for k, v in node.items() if k != "$ref"}}
            return _resolve(merged, defs)
        return {k: _resolve(v, defs) for k, v in node.items()}
    if isinstance(node, list):
        return [_resolve(v, defs) for v in node]
    return node


def _structural(node: dict[str, Any]) -> dict[str, Any]:
    """Rewrite one JSON-Schema 2020-12 node (pydantic's output) as an OpenAPI v3.0 structural node."""
    node = dict(node)
    any_of = node.pop("anyOf", None)
    if any_of is not None:
        branches = [b for b in any_of if b.get("type") != "null"]
        if len(branches) != 1:
            raise ValueError(f"unions other than Optional are not structural: {any_of}")
        inner = branches[0]
        node = {**inner, **{k: v for k, v in node.items() if k in ("description",)}}
    if "const" in node:
        node["enum"] = [node.pop("const")]
    for key in ("exclusiveMinimum", "exclusiveMaximum"):
        if isinstance(node.get(key), (int, float)) and not isinstance(node.get(key), bool):
            node["minimum" if key == "exclusiveMinimum" else "maximum"] = node[key]
            node[key] = True
    if "enum" in node and "type" not in node:
        node["type"] = "string"
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key not in _KEEP:
            continue
        if key == "properties":
            out[key] = {name: _structural(sub) for name, sub in value.items()}
        elif key == "items":
            out[key] = _structural(value)
        elif key == "additionalProperties":
            if isinstance(value, dict):
                out[key] = _structural(value)
            # `additionalProperties: false` is implied by pruning and forbidden beside properties.
        else:
            out[key] = value
    if (
        out.get("type") == "object"
        and "properties" not in out
        and "additionalProperties" not in out
    ):
        out["x-kubernetes-preserve-unknown-fields"] = True
    return out


def openapi_schema(model: type[Any]) -> dict[str, Any]:
    raw = model.model_json_schema(by_alias=True, mode="validation")
    defs = raw.pop("$defs", {})
    return _structural(_resolve(raw, defs))


def _condition_column(kind: str) -> str:
    return f'.status.conditions[?(@.type=="{kind}")].status'


def crd_manifest() -> dict[str, Any]:
    spec_schema = openapi_schema(InferenceServiceSpec)
    status_schema = openapi_schema(InferenceServiceStatus)
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{PLURAL}.{GROUP}",
            "annotations": {"infertune.dev/generated-by": "infertune crds (do not edit)"},
        },
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": KIND,
                "listKind": f"{KIND}List",
                "plural": PLURAL,
                "singular": SINGULAR,
                "shortNames": SHORT_NAMES,
                "categories": ["infertune"],
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": [
                        {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
                        {"name": "Ready", "type": "string", "jsonPath": _condition_column("Ready")},
                        {"name": "Engine", "type": "string", "jsonPath": ".status.live.engine"},
                        {
                            "name": "Quant",
                            "type": "string",
                            "jsonPath": ".status.live.quantization",
                        },
                        {
                            "name": "TTFT-P95-ms",
                            "type": "number",
                            "jsonPath": ".status.live.measured.ttftP95Ms",
                        },
                        {
                            "name": "SLO-Met",
                            "type": "string",
                            "jsonPath": _condition_column("SLOMet"),
                        },
                        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
                    ],
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "description": "A model served under latency SLOs, tuned and kept tuned.",
                            "required": ["spec"],
                            "properties": {
                                "apiVersion": {"type": "string"},
                                "kind": {"type": "string"},
                                "metadata": {"type": "object"},
                                "spec": spec_schema,
                                "status": status_schema,
                            },
                        }
                    },
                }
            ],
        },
    }


def render_crd_yaml() -> str:
    header = "# Generated by `make crds` from infertune.operator.api; edits here are overwritten.\n"
    return header + yaml.safe_dump(crd_manifest(), sort_keys=False, width=100)
