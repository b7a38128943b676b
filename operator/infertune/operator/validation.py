"""Validate InferenceService manifests: the same code for `infertune validate` and the operator."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from infertune.operator.api import API_VERSION, KIND, InferenceService, InferenceServiceSpec
from infertune.tuner.api.errors import describe_errors


def spec_problems(spec: Any) -> list[str]:
    """Every problem with an InferenceService `.spec` (empty when valid)."""
    try:
        InferenceServiceSpec.model_validate(spec)
    except ValidationError as exc:
        return describe_errors(exc, InferenceServiceSpec, "spec")
    return []


def parse_spec(spec: Any) -> InferenceServiceSpec:
    """Parse once at the handler edge; ValueError lists every problem."""
    problems = spec_problems(spec)
    if problems:
        raise ValueError("; ".join(problems))
    return InferenceServiceSpec.model_validate(spec)


def manifest_problems(doc: Any) -> list[str]:
    if not isinstance(doc, dict):
        return ["expected a mapping at the top level"]
    problems: list[str] = []
    if doc.get("apiVersion") != API_VERSION:
        problems.append(f"apiVersion: {doc.get('apiVersion')!r} is not allowed; use {API_VERSION}")
    if doc.get("kind") != KIND:
        problems.append(f"kind: {doc.get('kind')!r} is not allowed; use {KIND}")
    name = (doc.get("metadata") or {}).get("name")
    if not name:
        problems.append("metadata.name: required field is missing")
    if problems:
        return problems
    try:
        InferenceService.model_validate(doc)
    except ValidationError as exc:
        return describe_errors(exc, InferenceService)
    return []
