"""Malformed manifests: each is rejected with a message naming the field, the value and what is allowed."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from infertune.cli import main as cli_main
from infertune.operator.validation import manifest_problems, parse_spec
from infertune.tuner.api import Duration, TuningSpec
from infertune.tuner.api.load import SpecError, tuning_spec_from_document

ROOT = Path(__file__).resolve().parents[3]
BASE: dict[str, Any] = {
    "apiVersion": "infertune.dev/v1alpha1",
    "kind": "InferenceService",
    "metadata": {"name": "t"},
    "spec": {"model": {"uri": "builtin://tiny"}, "slo": {"ttft": {"max": "300ms"}}},
}


def with_spec(**changes: Any) -> dict[str, Any]:
    doc = copy.deepcopy(BASE)
    for dotted, value in changes.items():
        node = doc["spec"]
        *parents, leaf = dotted.split("__")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return doc


# (manifest, substrings the single relevant message must contain)
CASES: list[tuple[str, dict[str, Any], list[str]]] = [
    (
        "negative latency",
        with_spec(slo={"ttft": {"max": "-5ms"}}),
        ["spec.slo.ttft.max", "-5ms", "positive"],
    ),
    ("zero latency", with_spec(slo={"itl": {"max": "0s"}}), ["spec.slo.itl.max", "0s", "positive"]),
    (
        "unitless latency",
        with_spec(slo={"e2e": {"max": "300"}}),
        ["spec.slo.e2e.max", "'300'", '"300ms"'],
    ),
    (
        "number latency",
        with_spec(slo={"e2e": {"max": 0.3}}),
        ["spec.slo.e2e.max", "0.3", "with a unit"],
    ),
    (
        "unknown percentile",
        with_spec(slo={"ttft": {"max": "1s", "percentile": "p97"}}),
        ["spec.slo.ttft.percentile", "'p97'", "'p99'"],
    ),
    ("no SLO bound", with_spec(slo={"objective": "goodput"}), ["spec.slo", "ttft, itl or e2e"]),
    (
        "unknown objective",
        with_spec(slo={"ttft": {"max": "1s"}, "objective": "speed"}),
        ["spec.slo.objective", "'speed'", "'goodput'"],
    ),
    (
        "unknown engine",
        with_spec(search={"engines": ["tensorrt"]}),
        ["spec.search.engines[0]", "'tensorrt'", "'vllm'"],
    ),
    (
        "unknown quantization",
        with_spec(search={"quantizations": ["int3"]}),
        ["spec.search.quantizations[0]", "'int3'", "'int4'"],
    ),
    (
        "min > max",
        with_spec(search={"maxNumSeqs": {"min": 64, "max": 8}}),
        ["spec.search.maxNumSeqs", "min (64)", "max (8)"],
    ),
    (
        "values and range",
        with_spec(search={"maxNumBatchedTokens": {"values": [1], "min": 1, "max": 2}}),
        ["spec.search.maxNumBatchedTokens", "not both"],
    ),
    (
        "empty after filtering",
        # (vLLM's int8 is no longer refused here: model.variants.int8 may provide it)
        with_spec(search={"engines": ["sglang"], "quantizations": ["fp32"]}),
        ["spec.search", "empty", "sglang"],
    ),
    ("empty engines", with_spec(search={"engines": []}), ["spec.search.engines", "at least 1"]),
    (
        "bad block size",
        with_spec(search={"kvBlockSizes": [24]}),
        ["spec.search.kvBlockSizes", "powers of two", "24"],
    ),
    (
        "rate and concurrency missing",
        with_spec(traffic={"arrival": "poisson"}),
        ["spec.traffic", "rate", "concurrency"],
    ),
    (
        "negative rate",
        with_spec(traffic={"rate": -1}),
        ["spec.traffic.rate", "greater than 0", "-1"],
    ),
    (
        "uniform lengths inverted",
        with_spec(
            traffic={
                "concurrency": 1,
                "promptTokens": {"distribution": "uniform", "min": 9, "max": 3},
            }
        ),
        ["spec.traffic.promptTokens", "min (9)", "max (3)"],
    ),
    (
        "lognormal without p95",
        with_spec(
            traffic={"concurrency": 1, "outputTokens": {"distribution": "lognormal", "mean": 9}}
        ),
        ["spec.traffic.outputTokens", "mean and p95"],
    ),
    (
        "unknown field",
        with_spec(rollout={"replicaz": 2}),
        ["spec.rollout.replicaz", "unknown field", "did you mean 'replicas'"],
    ),
    (
        "unknown top-level field",
        with_spec(sloz={}),
        ["spec.sloz", "unknown field", "allowed fields here"],
    ),
    (
        "model path escape",
        with_spec(model={"uri": "file:///models/../etc/shadow"}),
        ["spec.model.uri", "'..'"],
    ),
    (
        "model scheme",
        with_spec(model={"uri": "s3://bucket/model"}),
        ["spec.model.uri", "'s3'", "pvc"],
    ),
    (
        "missing model",
        {**BASE, "spec": {"slo": {"ttft": {"max": "1s"}}}},
        ["spec.model", "required"],
    ),
    (
        "zero trials",
        with_spec(budget={"maxTrials": 0}),
        ["spec.budget.maxTrials", "greater than or equal to 1"],
    ),
    (
        "parallel above trials",
        with_spec(budget={"maxTrials": 2, "parallelTrials": 4}),
        ["parallelTrials (4)", "maxTrials (2)"],
    ),
    (
        "bad GPU product",
        with_spec(hardware={"gpuProducts": ["H100 80GB!"]}),
        ["spec.hardware.gpuProducts", "label values"],
    ),
    (
        "bad toleration effect",
        with_spec(hardware={"tolerations": [{"key": "a", "effect": "Never"}]}),
        ["spec.hardware.tolerations[0].effect", "'Never'", "'NoSchedule'"],
    ),
    (
        "window shorter than interval",
        with_spec(retune={"checkInterval": "5m", "violationWindow": "1m"}),
        ["spec.retune", "violationWindow (1m)", "checkInterval (5m)"],
    ),
    (
        "unknown trigger",
        with_spec(retune={"triggers": ["Always"]}),
        ["spec.retune.triggers[0]", "'Always'", "'TrafficDrift'"],
    ),
    ("negative replicas", with_spec(rollout={"replicas": -1}), ["spec.rollout.replicas", "-1"]),
]


@pytest.mark.parametrize(("title", "doc", "expected"), CASES, ids=[c[0] for c in CASES])
def test_malformed_manifest_names_field_value_and_fix(
    title: str, doc: dict[str, Any], expected: list[str]
) -> None:
    problems = manifest_problems(doc)
    assert problems, f"{title}: accepted a malformed manifest"
    assert any(all(part in p for part in expected) for p in problems), (title, problems)


def test_every_problem_is_reported_not_only_the_first() -> None:
    doc = with_spec(
        slo={"ttft": {"max": "-1s", "percentile": "p1"}},
        search={"engines": ["x"], "kvBlockSizes": [3]},
        budget={"maxTrials": 0},
    )
    problems = manifest_problems(doc)
    assert len(problems) >= 5, problems


def test_wrong_kind_and_api_version() -> None:
    doc = {**BASE, "apiVersion": "infertune.dev/v1", "kind": "Deployment"}
    problems = manifest_problems(doc)
    assert any("apiVersion" in p and "infertune.dev/v1alpha1" in p for p in problems)
    assert any(p.startswith("kind:") for p in problems)


def test_minimal_spec_gets_sensible_defaults() -> None:
    spec = parse_spec(BASE["spec"])
    assert spec.traffic.concurrency == 8
    assert spec.search.engines == ["builtin"]
    assert spec.budget.max_trials == 20
    assert float(spec.retune.check_interval) == 60.0
    assert spec.rollout.replicas == 1


def test_durations_keep_the_users_text() -> None:
    spec = parse_spec(with_spec(slo={"ttft": {"max": "1m30s"}})["spec"])
    assert spec.slo.ttft is not None
    assert float(spec.slo.ttft.max) == 90.0
    assert spec.to_wire()["slo"]["ttft"]["max"] == "1m30s"
    assert Duration("250ms").ms == pytest.approx(250.0)


def test_tuning_spec_ignores_cluster_fields_but_keeps_tuning_ones() -> None:
    doc = yaml.safe_load((ROOT / "examples" / "full.yaml").read_text())
    tuning = tuning_spec_from_document(doc)
    assert isinstance(tuning, TuningSpec)
    assert "hardware" not in tuning.to_wire()
    assert tuning.search.engines[0] == "vllm"


def test_bare_tuning_spec_errors_use_plain_paths() -> None:
    with pytest.raises(SpecError) as err:
        tuning_spec_from_document(
            {"model": {"uri": "builtin://huge"}, "slo": {"ttft": {"max": "1s"}}}
        )
    assert any(p.startswith("model.uri:") and "tiny" in p for p in err.value.problems)


def test_cli_validate_prints_every_error_and_fails(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        yaml.safe_dump(with_spec(slo={"ttft": {"max": "-1s"}}, search={"engines": ["x"]}))
    )
    good = ROOT / "examples" / "minimal.yaml"
    assert cli_main(["validate", str(good), str(bad)]) == 1
    out = capsys.readouterr().out
    assert "minimal.yaml: valid" in out
    assert "INVALID (2 problem(s))" in out
    assert "spec.slo.ttft.max" in out and "spec.search.engines[0]" in out


def test_cli_validate_rejects_unreadable_and_non_yaml(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    broken = tmp_path / "broken.yaml"
    broken.write_text("spec: [unclosed")
    assert cli_main(["validate", str(broken), str(tmp_path / "missing.yaml")]) == 1
    out = capsys.readouterr().out
    assert "not valid YAML" in out and "cannot read file" in out


@pytest.mark.parametrize("path", sorted((ROOT / "examples").glob("*.yaml")), ids=lambda p: p.name)
def test_examples_validate(path: Path) -> None:
    assert cli_main(["validate", str(path)]) == 0
