"""Read a TuningSpec from YAML: a bare spec, `kind: TuningSpec`, or an InferenceService manifest."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from infertune.tuner.api.errors import describe_errors
from infertune.tuner.api.spec import TuningSpec

# Fields of an InferenceService spec that only the operator reads; the tuner ignores them.
_CLUSTER_ONLY_FIELDS = ("hardware", "rollout", "retune")
# ... and of its model: how a pod fetches an hf:// model (standalone, $HF_TOKEN and the local cache).
_CLUSTER_ONLY_MODEL_FIELDS = ("tokenSecret", "cache")


class SpecError(ValueError):
    """A spec that cannot be used, with every problem listed."""

    def __init__(self, source: str, problems: list[str]) -> None:
        self.source = source
        self.problems = problems
        super().__init__(f"{source}: " + "; ".join(problems))


def read_documents(path: Path) -> list[Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise SpecError(str(path), [f"cannot read file: {exc.strerror}"]) from exc
    try:
        return [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as exc:
        raise SpecError(str(path), [f"not valid YAML: {exc}"]) from exc


def tuning_spec_from_document(doc: Any, source: str = "spec") -> TuningSpec:
    if not isinstance(doc, dict):
        raise SpecError(source, ["expected a mapping at the top level"])
    prefix = ""
    body: Any = doc
    if "kind" in doc:
        if doc["kind"] not in ("TuningSpec", "InferenceService"):
            raise SpecError(source, [f"kind {doc['kind']!r} is not TuningSpec or InferenceService"])
        body = doc.get("spec")
        prefix = "spec"
        if not isinstance(body, dict):
            raise SpecError(source, ["spec: required mapping is missing"])
        if doc["kind"] == "InferenceService":
            body = {k: v for k, v in body.items() if k not in _CLUSTER_ONLY_FIELDS}
            if isinstance(body.get("model"), dict):
                model = body["model"].items()
                body["model"] = {k: v for k, v in model if k not in _CLUSTER_ONLY_MODEL_FIELDS}
    try:
        return TuningSpec.model_validate(body)
    except ValidationError as exc:
        raise SpecError(source, describe_errors(exc, TuningSpec, prefix)) from exc


def load_tuning_spec(path: Path) -> TuningSpec:
    docs = read_documents(path)
    if len(docs) != 1:
        raise SpecError(str(path), [f"expected exactly one YAML document, found {len(docs)}"])
    return tuning_spec_from_document(docs[0], str(path))
