"""The pure builders: what lands on the cluster for a tuning run and for serving."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from kubernetes_validate import validate
from operator_samples import demo_doc, isvc_from

from infertune.operator.api import InferenceService, ServingConfig
from infertune.operator.builders import (
    RunPlan,
    desired_deployment,
    desired_job,
    desired_service,
    desired_spec_configmap,
)
from infertune.operator.builders.common import ANN_CONFIG, ANN_DESIRED
from infertune.operator.builders.job import pod_tuning_spec
from infertune.operator.hashing import run_hash, tuning_hash
from infertune.operator.settings import OperatorSettings
from infertune.tuner.api import TuningSpec

K8S_VERSION = "1.25.0"  # the oldest schema kubernetes-validate ships; our API server is older still


def plan_for(isvc: InferenceService, reason: str = "Created", gpu: str | None = None) -> RunPlan:
    tuning = pod_tuning_spec(isvc.spec.tuning_spec())
    return RunPlan(
        run_id="0123abcd", spec_hash=tuning_hash(isvc.spec), run_hash=run_hash(tuning, gpu),
        reason=reason, tuning=tuning, gpu_product=gpu,
    )  # fmt: skip


def pod_spec(obj: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = obj["spec"]["template"]["spec"]
    return spec


def test_every_child_is_a_valid_kubernetes_object(
    isvc: InferenceService, settings: OperatorSettings, config: ServingConfig
) -> None:
    plan = plan_for(isvc)
    for obj in (
        desired_job(isvc, plan, settings),
        desired_spec_configmap(isvc, plan.job_name(isvc.name), plan.tuning),
        desired_deployment(isvc, config, settings),
        desired_service(isvc, settings),
    ):
        validate(obj, K8S_VERSION, strict=True)
        owner = obj["metadata"]["ownerReferences"][0]
        assert owner["uid"] == isvc.metadata["uid"] and owner["controller"] is True


def test_job_runs_the_tuner_per_the_contract(
    isvc: InferenceService, settings: OperatorSettings
) -> None:
    plan = plan_for(isvc)
    job = desired_job(isvc, plan, settings)
    container = pod_spec(job)["containers"][0]
    assert container["command"] == [
        "infertune", "tune", "/etc/infertune/spec.yaml",
        "--study-name", f"team-a-tiny-demo-{plan.run_id}",
        "--out", "/var/run/infertune/out", "--termination-message", "/dev/termination-log",
    ]  # fmt: skip
    assert container["terminationMessagePath"] == "/dev/termination-log"
    assert container["terminationMessagePolicy"] == "FallbackToLogsOnError"
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod_spec(job)["volumes"]}
    assert volumes[mounts["/etc/infertune"]]["configMap"]["name"] == job["metadata"]["name"]
    assert pod_spec(job)["restartPolicy"] == "Never"
    assert job["spec"]["backoffLimit"] == settings.job_backoff_limit


def test_job_has_no_api_token_and_a_hardened_container(
    isvc: InferenceService, settings: OperatorSettings
) -> None:
    spec = pod_spec(desired_job(isvc, plan_for(isvc), settings))
    assert spec["automountServiceAccountToken"] is False
    psc, csc = spec["securityContext"], spec["containers"][0]["securityContext"]
    assert psc["runAsNonRoot"] is True and psc["runAsUser"] == 65532
    assert psc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert csc["readOnlyRootFilesystem"] is True and csc["allowPrivilegeEscalation"] is False
    assert csc["capabilities"] == {"drop": ["ALL"]}
    writable = {m["mountPath"] for m in spec["containers"][0]["volumeMounts"]}
    assert {"/tmp", "/var/cache/infertune", "/var/run/infertune"} <= writable


def test_job_is_pinned_to_the_requested_gpus(settings: OperatorSettings) -> None:
    doc = demo_doc(
        hardware__gpuProducts=["NVIDIA-H100-80GB-HBM3", "NVIDIA-A100-SXM4-80GB"],
        hardware__gpusPerReplica=2,
        hardware__nodeSelector={"pool": "inference"},
        hardware__tolerations=[
            {"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}
        ],
    )
    isvc = isvc_from(doc)
    spec = pod_spec(desired_job(isvc, plan_for(isvc), settings))
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert terms == [
        {"matchExpressions": [{"key": "nvidia.com/gpu.product", "operator": "In",
                               "values": ["NVIDIA-H100-80GB-HBM3", "NVIDIA-A100-SXM4-80GB"]}]}
    ]  # fmt: skip
    assert spec["nodeSelector"] == {"pool": "inference"}
    res = spec["containers"][0]["resources"]
    assert res["requests"]["nvidia.com/gpu"] == res["limits"]["nvidia.com/gpu"] == "2"
    keys = {(t.get("key"), t.get("effect")) for t in spec["tolerations"]}
    assert {("dedicated", "NoSchedule"), ("nvidia.com/gpu", "NoSchedule")} <= keys


def test_hardware_retune_pins_the_new_product(
    isvc: InferenceService, settings: OperatorSettings
) -> None:
    spec = pod_spec(desired_job(isvc, plan_for(isvc, "HardwareChanged", "Tesla-T4"), settings))
    expr = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ][0]
    assert expr["matchExpressions"][0]["values"] == ["Tesla-T4"]


def test_cpu_only_spec_requests_no_gpu(settings: OperatorSettings) -> None:
    isvc = isvc_from(demo_doc(hardware__gpusPerReplica=0, hardware__gpuProducts=[]))
    spec = pod_spec(desired_job(isvc, plan_for(isvc), settings))
    assert "nvidia.com/gpu" not in spec["containers"][0]["resources"]["requests"]
    assert "affinity" not in spec and "tolerations" not in spec


def test_storage_secret_reaches_the_tuner_as_an_expanded_flag(isvc: InferenceService) -> None:
    settings = OperatorSettings(storage_secret="study-db:dsn")
    container = pod_spec(desired_job(isvc, plan_for(isvc), settings))["containers"][0]
    argv = container["command"]
    assert argv[argv.index("--storage") + 1] == "$(INFERTUNE_STORAGE_URL)"
    env = {e["name"]: e for e in container["env"]}
    assert env["INFERTUNE_STORAGE_URL"]["valueFrom"]["secretKeyRef"] == {
        "name": "study-db",
        "key": "dsn",
    }


def test_pvc_model_is_mounted_and_the_spec_points_at_it(settings: OperatorSettings) -> None:
    isvc = isvc_from(demo_doc(model={"uri": "pvc://models/llama-3/8b"}))
    plan = plan_for(isvc)
    assert plan.tuning.model.uri == "file:///mnt/models/models/llama-3/8b"
    cm = desired_spec_configmap(isvc, plan.job_name(isvc.name), plan.tuning)
    assert TuningSpec.model_validate(yaml.safe_load(cm["data"]["spec.yaml"])) == plan.tuning
    spec = pod_spec(desired_job(isvc, plan, settings))
    claim = next(v for v in spec["volumes"] if v["name"] == "model")["persistentVolumeClaim"]
    assert claim == {"claimName": "models", "readOnly": True}


def test_long_names_fit_label_limits(settings: OperatorSettings) -> None:
    doc = demo_doc()
    doc["metadata"]["name"] = "a" * 60
    isvc = isvc_from(doc)
    job = desired_job(isvc, plan_for(isvc), settings)
    assert len(job["metadata"]["name"]) <= 63


def test_deployment_serves_the_chosen_config(
    isvc: InferenceService, settings: OperatorSettings, config: ServingConfig
) -> None:
    dep = desired_deployment(isvc, config, settings)
    container = pod_spec(dep)["containers"][0]
    assert container["command"] == [
        "infertune", "serve", "--model", "builtin://tiny", "--served-model-name", "tiny-llama",
        "--host", "$(POD_IP)", "--port", "8000", "--quantization", "int8", "--max-num-seqs", "16",
        "--max-num-batched-tokens", "512", "--kv-block-size", "16", "--no-cuda-graph",
    ]  # fmt: skip
    env = {e["name"]: e for e in container["env"]}
    assert env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    assert container["readinessProbe"]["httpGet"]["path"] == "/health"
    assert dep["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    assert dep["spec"]["replicas"] == 1
    assert pod_spec(dep)["automountServiceAccountToken"] is False


def test_config_hash_rolls_pods_only_when_the_config_changes(
    isvc: InferenceService, settings: OperatorSettings, config: ServingConfig
) -> None:
    base = desired_deployment(isvc, config, settings)
    measured = config.model_copy(update={"slo_margins_ms": {"ttft": 12.0}})
    other = config.model_copy(update={"quantization": "int4"})
    template_hash = base["spec"]["template"]["metadata"]["annotations"][ANN_CONFIG]
    assert (
        desired_deployment(isvc, measured, settings)["spec"]["template"]["metadata"]["annotations"][
            ANN_CONFIG
        ]
        == template_hash
    )
    assert (
        desired_deployment(isvc, other, settings)["spec"]["template"]["metadata"]["annotations"][
            ANN_CONFIG
        ]
        != template_hash
    )


def test_replicas_change_the_deployment_but_not_the_pod_template(
    settings: OperatorSettings, config: ServingConfig
) -> None:
    one = desired_deployment(isvc_from(demo_doc()), config, settings)
    three = desired_deployment(isvc_from(demo_doc(rollout={"replicas": 3})), config, settings)
    assert three["spec"]["replicas"] == 3
    assert one["spec"]["template"] == three["spec"]["template"]
    assert (
        one["metadata"]["annotations"][ANN_DESIRED] != three["metadata"]["annotations"][ANN_DESIRED]
    )


def test_service_selects_both_tracks(
    isvc: InferenceService, settings: OperatorSettings, config: ServingConfig
) -> None:
    svc = desired_service(isvc, settings)
    for track in ("stable", "canary"):
        labels = desired_deployment(isvc, config, settings, track=track, replicas=1)["spec"][
            "template"
        ]["metadata"]["labels"]
        assert all(labels.get(k) == v for k, v in svc["spec"]["selector"].items())


def test_unknown_engine_image_names_the_flag(isvc: InferenceService, config: ServingConfig) -> None:
    settings = OperatorSettings(engine_images={"builtin": "x"})
    with pytest.raises(ValueError, match="--engine-image vllm=IMAGE"):
        desired_deployment(isvc, config.model_copy(update={"engine": "vllm"}), settings)


@pytest.mark.parametrize(
    ("engine", "entry"),
    [
        ("vllm", ["python3", "-m", "vllm.entrypoints.openai.api_server"]),
        ("sglang", ["python3", "-m", "sglang.launch_server"]),
    ],
)
def test_external_engine_runs_the_images_entry_point_not_a_local_path(
    isvc: InferenceService,
    settings: OperatorSettings,
    config: ServingConfig,
    monkeypatch: pytest.MonkeyPatch,
    engine: str,
    entry: list[str],
) -> None:
    # The tuning machine's vLLM venv must not leak into the pod spec.
    monkeypatch.setenv("INFERTUNE_VLLM_PYTHON", "/home/someone/.cache/venvs/vllm/bin/python")
    knobs = {"engine": engine, "quantization": "bf16", "max_num_seqs": 4}
    dep = desired_deployment(isvc, config.model_copy(update=knobs), settings)
    command = pod_spec(dep)["containers"][0]["command"]
    assert command[:3] == entry, command
    assert not any("/.cache/" in a or "venv" in a for a in command), command
    assert "4" in command  # the tuned knobs still reach the server


def test_llamacpp_pod_converts_the_checkpoint_and_serves_the_gguf_file(
    isvc: InferenceService, settings: OperatorSettings, config: ServingConfig
) -> None:
    # A llama-server on the tuning machine lives in a venv; the pod runs the image's binary, and
    # llama.cpp cannot load a Hugging Face directory: an init container writes the GGUF file.
    knobs = {"engine": "llamacpp", "quantization": "int4", "max_num_seqs": 4}
    settings = settings.model_copy(
        update={"engine_images": {**settings.engine_images, "llamacpp": "llama:server"}}
    )
    spec = pod_spec(desired_deployment(isvc, config.model_copy(update=knobs), settings))
    engine, (init,) = spec["containers"][0], spec["initContainers"]
    assert engine["command"][0] == "/app/llama-server"
    assert engine["command"][engine["command"].index("--model") + 1] == "/gguf/model.gguf"
    assert "/gguf" in {m["mountPath"] for m in engine["volumeMounts"]}
    assert init["image"] == settings.tuner_image
    cmd = init["command"]
    assert cmd[len(settings.infertune_command)] == "gguf"
    assert cmd[cmd.index("--model") + 1] == isvc.spec.model.uri
    assert cmd[cmd.index("--quantization") + 1] == "int4"
    assert cmd[cmd.index("--out") + 1] == "/gguf/model.gguf"
    assert init["securityContext"]["readOnlyRootFilesystem"] is True
    assert {"gguf", "tmp"} <= {m["name"] for m in init["volumeMounts"]}
