"""Validate InferenceService manifests: the same code for `infertune validate` and the operator."""

from __future__ import annotations

import re
from typing import Any

from pydantic import ValidationError

from infertune.operator.api import API_VERSION, KIND, InferenceService, InferenceServiceSpec
from infertune.tuner.api.errors import describe_errors

# The name also names the Service (a DNS-1035 label) and is the label value that ties every child to
# its InferenceService (63 characters at most): a longer or dotted name could never be served.
_DNS1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


def name_problems(name: Any) -> list[str]:
    """Problems with `metadata.name` beyond what the API server checks (empty when usable)."""
    if not isinstance(name, str) or not name:
        return ["metadata.name: required field is missing"]
    if len(name) > 63 or not _DNS1035_LABEL.match(name):
        return [
            f"metadata.name: {name[:70]!r} must be a DNS-1035 label (at most 63 lowercase letters, "
            "digits or '-', starting with a letter, ending with a letter or digit): it names the "
            "Service and labels every child"
        ]
    return []


def spec_problems(spec: Any) -> list[str]:
    """Every problem with an InferenceService `.spec` (empty when valid)."""
    try:
        InferenceServiceSpec.model_validate(spec)
    except ValidationError as exc:
        return describe_errors(exc, InferenceServiceSpec, "spec")
    return []


def storage_problems(spec: InferenceServiceSpec, shared_storage: bool) -> list[str]:
    """What this operator's installation cannot run: several tuning workers need a study storage
    they all reach (`--storage-secret`, the chart's storage.type postgresql or external)."""
    workers = spec.budget.parallel_trials
    if workers <= 1 or shared_storage:
        return []
    return [
        f"spec.budget.parallelTrials: {workers} workers share one study, but this operator has no "
        "shared study storage: each tuning pod would keep its own SQLite study and run the whole "
        "budget alone. Install the chart with storage.type=postgresql (or external with "
        "storage.url.secretName), or set parallelTrials: 1"
    ]


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
    problems += name_problems((doc.get("metadata") or {}).get("name"))
    if problems:
        return problems
    try:
        InferenceService.model_validate(doc)
    except ValidationError as exc:
        return describe_errors(exc, InferenceService)
    return []
