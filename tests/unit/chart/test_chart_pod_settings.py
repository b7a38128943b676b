"""The chart's pull secrets and engine runtimes reach every pod the operator creates: render the
chart, parse the operator's rendered args with its real parser, and build the pods from them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from chartlib import one, render

from infertune.operator.api import InferenceService, ServingConfig
from infertune.operator.builders import desired_deployment, desired_job
from infertune.operator.builders.job import RunPlan
from infertune.operator.settings import OperatorSettings, parse_settings

ISVC = {
    "apiVersion": "infertune.dev/v1alpha1",
    "kind": "InferenceService",
    "metadata": {"name": "chat", "namespace": "team-a", "uid": "u-1"},
    "spec": {
        "model": {"uri": "builtin://tiny"},
        "slo": {"ttft": {"max": "300ms"}},
        "traffic": {"rate": 2, "numRequests": 20},
        "imagePullSecrets": [{"name": "team-registry"}],
    },
}


def _operator_settings(values: dict[str, Any], tmp: Path) -> OperatorSettings:
    deployment = one(render(values, tmp=tmp), "Deployment", "-operator")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    settings, _ = parse_settings(container["args"])
    return settings


def _pods(settings: OperatorSettings) -> list[dict[str, Any]]:
    isvc = InferenceService.model_validate(ISVC)
    tuning = isvc.spec.tuning_spec()
    plan = RunPlan(run_id="0a1b2c3d", spec_hash="s", run_hash="r", reason="Created", tuning=tuning)
    out = []
    for engine in ("builtin", "vllm", "sglang", "llamacpp"):
        config = ServingConfig(
            engine=engine, quantization="int8" if engine == "llamacpp" else "bf16", max_num_seqs=8, max_num_batched_tokens=512,
            kv_block_size=16, cuda_graph=False,
        )  # fmt: skip
        out.append(desired_deployment(isvc, config, settings)["spec"]["template"]["spec"])
        out.append(
            desired_deployment(isvc, config, settings, track="canary")["spec"]["template"]["spec"]
        )
    out.append(desired_job(isvc, plan, settings)["spec"]["template"]["spec"])
    return out


def test_cluster_wide_chart_pull_secrets_reach_every_pod(tmp_path: Path) -> None:
    # Cluster-wide (no watchNamespaces): the tuner account is not the chart's, so the secrets
    # must come from the operator itself.
    settings = _operator_settings({"global": {"imagePullSecrets": [{"name": "regcred"}]}}, tmp_path)
    assert settings.image_pull_secrets == ("regcred",)
    pods = _pods(settings)
    assert any("initContainers" in p for p in pods)
    for pod in pods:
        assert pod["imagePullSecrets"] == [{"name": "regcred"}, {"name": "team-registry"}]


def test_chart_engine_runtimes_fit_its_images(tmp_path: Path) -> None:
    # The chart serves vllm and sglang from the project's tuner-full image (USER 65532).
    settings = _operator_settings({}, tmp_path)
    for engine in ("vllm", "sglang"):
        rt = settings.runtime_for(engine)
        assert rt.run_as_user == 65532 and rt.read_only_root_filesystem and rt.home == "/tmp"
    for pod in _pods(settings):
        for c in [*pod.get("initContainers", []), *pod["containers"]]:
            sc = c["securityContext"]
            assert sc["runAsNonRoot"] is True and sc["readOnlyRootFilesystem"] is True
    # An upstream image: runtime null puts the table's row back (root, writable root).
    upstream = {"engines": {"vllm": {"image": {"repository": "vllm/vllm-openai"}, "runtime": None}}}
    rt = _operator_settings(upstream, tmp_path).runtime_for("vllm")
    assert rt.run_as_user is None and not rt.read_only_root_filesystem
