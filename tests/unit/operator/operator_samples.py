"""Sample InferenceServices for the operator's unit tests (shared by conftest and the tests)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

from infertune.operator.api import InferenceService

ROOT = Path(__file__).resolve().parents[3]


def demo_doc(**spec_changes: Any) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((ROOT / "examples" / "demo.yaml").read_text())
    doc["metadata"].update(
        namespace="team-a", uid="0b6c1c84-1111-2222-3333-444455556666", generation=1
    )
    for dotted, value in spec_changes.items():
        node = doc["spec"]
        *parents, leaf = dotted.split("__")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return doc


def isvc_from(doc: dict[str, Any]) -> InferenceService:
    return InferenceService.model_validate(copy.deepcopy(doc))
