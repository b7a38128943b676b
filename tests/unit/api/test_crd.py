"""The CRD is generated from the models, is structural, loads on Kubernetes 1.20, and matches the repo."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import kubernetes_validate.utils
import pytest
import yaml

from infertune.operator.crd import crd_manifest, render_crd_yaml

ROOT = Path(__file__).resolve().parents[3]
CRD_FILES = [
    ROOT / "crds" / "inferenceservices.infertune.dev.yaml",
    ROOT / "charts" / "infertune" / "crds" / "inferenceservices.infertune.dev.yaml",
]
# Keywords a structural schema may not use (apiextensions v1), and CEL which 1.20 does not know.
FORBIDDEN = {
    "$ref",
    "anyOf",
    "oneOf",
    "allOf",
    "not",
    "const",
    "default",
    "x-kubernetes-validations",
}


@pytest.mark.parametrize("path", CRD_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_committed_crd_matches_the_models(path: Path) -> None:
    assert path.read_text(encoding="utf-8") == render_crd_yaml(), (
        f"{path.relative_to(ROOT)} is stale: run `make crds` and commit the result"
    )


def _walk(node: Any, where: str = "") -> list[str]:
    problems: list[str] = []
    if isinstance(node, dict):
        typed_keys = "properties" in node or "items" in node or "enum" in node
        if typed_keys and "type" not in node:
            problems.append(f"{where}: no type (not structural)")
        problems += [f"{where}: uses {k}" for k in FORBIDDEN & node.keys()]
        for key, value in node.items():
            if key == "properties":
                for name, sub in value.items():
                    problems += _walk(sub, f"{where}.{name}")
            elif key in ("items", "additionalProperties") and isinstance(value, dict):
                problems += _walk(value, f"{where}[]")
        if isinstance(node.get("exclusiveMinimum"), (int, float)) and not isinstance(
            node.get("exclusiveMinimum"), bool
        ):
            problems.append(f"{where}: exclusiveMinimum must be a boolean in OpenAPI v3.0")
    return problems


def test_schema_is_structural() -> None:
    schema = crd_manifest()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    assert _walk(schema) == []


def test_crd_is_a_valid_kubernetes_object() -> None:
    # The oldest schema the package bundles (apiextensions v1 is unchanged since 1.16).
    oldest = kubernetes_validate.utils.all_versions()[0]
    kubernetes_validate.validate(crd_manifest(), oldest, strict=True)


def test_printer_columns_and_status_subresource() -> None:
    version = crd_manifest()["spec"]["versions"][0]
    assert version["subresources"] == {"status": {}}
    names = [c["name"] for c in version["additionalPrinterColumns"]]
    assert names == ["Phase", "Ready", "Engine", "Quant", "TTFT-P95-ms", "SLO-Met", "Age"]


def _openapi_validator() -> jsonschema.Draft4Validator:
    schema = crd_manifest()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return jsonschema.Draft4Validator(schema)


@pytest.mark.parametrize("path", sorted((ROOT / "examples").glob("*.yaml")), ids=lambda p: p.name)
def test_examples_pass_the_crd_schema(path: Path) -> None:
    doc = yaml.safe_load(path.read_text())
    errors = list(_openapi_validator().iter_errors(doc))
    assert errors == []


@pytest.mark.parametrize(
    ("patch", "field"),
    [
        ({"slo": {"ttft": {"max": "fast"}}}, "max"),
        ({"slo": {"ttft": {"max": "1s", "percentile": "p97"}}}, "percentile"),
        ({"search": {"engines": ["tensorrt"]}}, "engines"),
        ({"budget": {"maxTrials": 0}}, "maxTrials"),
    ],
)
def test_crd_schema_rejects_bad_values(patch: dict[str, Any], field: str) -> None:
    doc = yaml.safe_load((ROOT / "examples" / "minimal.yaml").read_text())
    doc["spec"].update(patch)
    errors = list(_openapi_validator().iter_errors(doc))
    assert errors and any(field in "/".join(map(str, e.absolute_path)) for e in errors)
