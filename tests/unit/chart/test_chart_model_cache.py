"""The chart's modelCache values reach the pods the operator creates for an hf:// model: render the
chart, parse the operator's rendered args with its real parser, and build the tuning Job."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from chartlib import HelmError, by_kind, one, render, template_text

from infertune.operator.api import InferenceService
from infertune.operator.builders import desired_job
from infertune.operator.builders.job import RunPlan
from infertune.operator.settings import parse_settings

ISVC = {
    "apiVersion": "infertune.dev/v1alpha1",
    "kind": "InferenceService",
    "metadata": {"name": "chat", "namespace": "team-a", "uid": "u-1"},
    "spec": {
        "model": {"uri": "hf://meta-llama/Llama-3.1-8B-Instruct", "tokenSecret": {"name": "hf"}},
        "slo": {"ttft": {"max": "300ms"}},
    },
}


def _job(values: dict[str, Any], tmp: Path) -> dict[str, Any]:
    deployment = one(render(values, tmp=tmp), "Deployment", "-operator")
    settings, _ = parse_settings(deployment["spec"]["template"]["spec"]["containers"][0]["args"])
    isvc = InferenceService.model_validate(ISVC)
    tuning = isvc.spec.tuning_spec()
    plan = RunPlan(run_id="0a1b2c3d", spec_hash="s", run_hash="r", reason="Created", tuning=tuning)
    return desired_job(isvc, plan, settings)


def test_the_charts_claim_and_mirror_reach_the_fetch_step(tmp_path: Path) -> None:
    values = {
        "modelCache": {
            "claimName": "models",
            "hfEndpoint": "https://hub-mirror.internal",
            "create": {"enabled": True, "size": "500Gi", "storageClassName": "nfs"},
        }
    }
    pod = _job(values, tmp_path)["spec"]["template"]["spec"]
    cache = next(v for v in pod["volumes"] if v["name"] == "model-cache")
    assert cache["persistentVolumeClaim"] == {"claimName": "models"}
    env = {e["name"]: e.get("value") for e in pod["initContainers"][0]["env"]}
    assert env["HF_ENDPOINT"] == "https://hub-mirror.internal"
    (pvc,) = by_kind(render(values, tmp=tmp_path), "PersistentVolumeClaim")
    assert pvc["metadata"]["name"] == "models"
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"]
    assert pvc["spec"]["resources"]["requests"]["storage"] == "500Gi"
    assert pvc["spec"]["storageClassName"] == "nfs"


def test_without_a_claim_each_pod_gets_a_sized_emptydir(tmp_path: Path) -> None:
    pod = _job({"modelCache": {"size": "40Gi"}}, tmp_path)["spec"]["template"]["spec"]
    cache = next(v for v in pod["volumes"] if v["name"] == "model-cache")
    assert cache["emptyDir"] == {"sizeLimit": "40Gi"}
    assert by_kind(render({}, tmp=tmp_path), "PersistentVolumeClaim") == []


def test_creating_the_claim_needs_its_name(tmp_path: Path) -> None:
    with pytest.raises(HelmError, match=r"modelCache\.create\.enabled needs modelCache\.claimName"):
        template_text({"modelCache": {"create": {"enabled": True}}}, tmp=tmp_path)
