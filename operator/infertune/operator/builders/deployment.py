"""The serving Deployment, built from (spec, chosen config): the engine's image and flags, the
config hash on the pod template (a new config rolls the pods), /health readiness, rolling update."""

from __future__ import annotations

from importlib import import_module
from typing import Any

from infertune.operator.api import InferenceService, ServingConfig
from infertune.operator.builders.common import (
    ANN_CONFIG,
    LABEL_ISVC,
    LABEL_TRACK,
    Obj,
    child_name,
    container_security_context,
    metadata,
    model_location,
    placement,
    pod_security_context,
    resources,
    stamp,
    writable_dirs,
)
from infertune.operator.hashing import config_hash
from infertune.operator.settings import OperatorSettings

HOST = "$(POD_IP)"  # expanded by the kubelet from the downward-API env var below


def _builtin_argv(
    config: ServingConfig, model: str, served: str, port: int, cli: tuple[str, ...]
) -> list[str]:
    return [
        *cli,
        "serve",
        "--model", model,
        "--served-model-name", served,
        "--host", HOST,
        "--port", str(port),
        "--quantization", config.quantization,
        "--max-num-seqs", str(config.max_num_seqs),
        "--max-num-batched-tokens", str(config.max_num_batched_tokens),
        "--kv-block-size", str(config.kv_block_size),
        "--cuda-graph" if config.cuda_graph else "--no-cuda-graph",
    ]  # fmt: skip


def serving_argv(
    isvc: InferenceService, config: ServingConfig, settings: OperatorSettings
) -> list[str]:
    """The exact command line the tuner measured: builtin per the contract, other engines from the
    tuner's engine adapters (imported lazily: the operator must not need them for the builtin)."""
    model, _, _ = model_location(isvc.spec.model.uri)
    if needs_gguf(isvc, config):
        model = GGUF_FILE  # written by the init container (gguf_init_container)
    # The kubelet expands $(VAR) in a container's command: the user's URI must reach the engine
    # literally (`$$` is the kubelet's escape), or `$(POD_IP)` or `$(HOME)` in it would be replaced.
    model = model.replace("$", "$$")
    served = isvc.spec.model.served_name
    if config.engine == "builtin":
        return _builtin_argv(
            config, model, served, settings.serving_port, settings.infertune_command
        )
    try:
        engines: Any = import_module("infertune.tuner.engines")
        candidate_mod: Any = import_module("infertune.tuner.candidate")
    except ImportError as exc:
        raise ValueError(
            f"engine {config.engine!r}: the tuner's engine adapters are not installed ({exc})"
        ) from exc
    knobs = {k: getattr(config, k) for k in candidate_mod.KNOBS}
    # The adapter's flags, not its command: its program is the interpreter or binary on the tuning
    # machine (a venv path there), which does not exist inside the engine's image.
    flags = engines.get_adapter(config.engine).flags(
        candidate_mod.Candidate.from_dict(knobs),
        model,
        HOST,
        settings.serving_port,
        served_model_name=served,
    )
    return [*IMAGE_ENTRY[config.engine], *[str(a) for a in flags]]


# How the engines' own images start their servers.
IMAGE_ENTRY: dict[str, tuple[str, ...]] = {
    "vllm": ("python3", "-m", "vllm.entrypoints.openai.api_server"),
    "sglang": ("python3", "-m", "sglang.launch_server"),
    "llamacpp": ("/app/llama-server",),
}


GGUF_DIR = "/gguf"
GGUF_FILE = f"{GGUF_DIR}/model.gguf"


def needs_gguf(isvc: InferenceService, config: ServingConfig) -> bool:
    """llama.cpp serves GGUF only: any other checkpoint is converted in the pod first."""
    model = isvc.spec.model
    return config.engine == "llamacpp" and not (
        model.format == "gguf" or model.uri.endswith(".gguf")
    )


def gguf_init_container(
    isvc: InferenceService, config: ServingConfig, settings: OperatorSettings, mounts: list[Obj]
) -> Obj:
    """Converts the checkpoint with the project's own converter and quantizer -- the ones the
    tuner's llamacpp trials used -- so the pod serves exactly the weights that were measured."""
    model, _, _ = model_location(isvc.spec.model.uri)
    command = [
        *settings.infertune_command,
        "gguf",
        "--model", model.replace("$", "$$"),
        "--quantization", config.quantization,
        "--out", GGUF_FILE,
    ]  # fmt: skip
    return {
        "name": "gguf",
        "image": settings.tuner_image,
        "imagePullPolicy": settings.image_pull_policy,
        "command": command,
        "resources": resources(isvc),
        "securityContext": container_security_context(),
        "env": writable_dirs()[2],
        "volumeMounts": mounts,
    }


def deployment_name(isvc: InferenceService, track: str) -> str:
    return isvc.name if track == "stable" else child_name(isvc.name, track)


def desired_deployment(
    isvc: InferenceService,
    config: ServingConfig,
    settings: OperatorSettings,
    *,
    track: str = "stable",
    replicas: int | None = None,
) -> Obj:
    image = settings.image_for(config.engine)
    chash = config_hash(config, isvc.spec.model.uri, image)
    name = deployment_name(isvc, track)
    meta = metadata(isvc, name, "serving", **{LABEL_TRACK: track})
    meta["annotations"][ANN_CONFIG] = chash
    selector = {LABEL_ISVC: isvc.name[:63], LABEL_TRACK: track}
    _, model_vols, model_mounts = model_location(isvc.spec.model.uri)
    tmp_vols, tmp_mounts, tmp_env = writable_dirs()
    port = settings.serving_port
    probe_http = {"path": "/health", "port": "http"}
    container: Obj = {
        "name": "engine",
        "image": image,
        "imagePullPolicy": settings.image_pull_policy,
        "command": serving_argv(isvc, config, settings),
        "env": [
            {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            *tmp_env,
            {"name": "PYTHONUNBUFFERED", "value": "1"},
        ],
        "ports": [{"name": "http", "containerPort": port, "protocol": "TCP"}],
        "resources": resources(isvc),
        "securityContext": container_security_context(),
        # Loading weights can take minutes: the startup probe holds liveness off until /health answers.
        "startupProbe": {"httpGet": probe_http, "periodSeconds": 5, "failureThreshold": 120},
        "readinessProbe": {"httpGet": probe_http, "periodSeconds": 5, "failureThreshold": 3},
        "livenessProbe": {"httpGet": probe_http, "periodSeconds": 15, "failureThreshold": 4},
        "volumeMounts": [*tmp_mounts, *model_mounts],
    }
    volumes = [*tmp_vols, *model_vols]
    init: list[Obj] = []
    if needs_gguf(isvc, config):
        gguf_mount = {"name": "gguf", "mountPath": GGUF_DIR}
        volumes.append({"name": "gguf", "emptyDir": {}})
        init.append(
            gguf_init_container(isvc, config, settings, [*tmp_mounts, *model_mounts, gguf_mount])
        )
        container["volumeMounts"].append({**gguf_mount, "readOnly": True})
    template_meta = {
        "labels": {**meta["labels"]},
        "annotations": {
            ANN_CONFIG: chash,
            "prometheus.io/scrape": "true",
            "prometheus.io/port": str(port),
            "prometheus.io/path": "/metrics",
        },
    }
    count = isvc.spec.rollout.replicas if replicas is None else replicas
    return stamp(
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": meta,
            "spec": {
                "replicas": count,
                "selector": {"matchLabels": selector},
                # Never drop below the serving capacity while a new config rolls in.
                "strategy": {
                    "type": "RollingUpdate",
                    "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1},
                },
                "revisionHistoryLimit": 3,
                "template": {
                    "metadata": template_meta,
                    "spec": {
                        "automountServiceAccountToken": False,
                        "enableServiceLinks": False,
                        "securityContext": pod_security_context(),
                        **({"initContainers": init} if init else {}),
                        "containers": [container],
                        "volumes": volumes,
                        **placement(isvc),
                    },
                },
            },
        }
    )
