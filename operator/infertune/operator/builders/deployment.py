"""The serving Deployment, built from (spec, chosen config): the engine's image and flags, the
config hash on the pod template (a new config rolls the pods), /health readiness, rolling update."""

from __future__ import annotations

from infertune.operator.api import InferenceService, ServingConfig
from infertune.operator.builders.common import (
    ANN_CONFIG,
    LABEL_ISVC,
    LABEL_TRACK,
    Obj,
    child_name,
    container_security_context,
    hf_uris,
    metadata,
    model_cache,
    model_location,
    placement,
    pod_security_context,
    pull_secrets,
    resources,
    stamp,
    writable_dirs,
)
from infertune.operator.builders.probes import serving_probes
from infertune.operator.engine_runtime import PROJECT_IMAGE
from infertune.operator.hashing import config_hash
from infertune.operator.settings import OperatorSettings
from infertune.tuner.engines import get_adapter
from infertune.tuner.models import model_uri, pinned_uri

HOST = "$(POD_IP)"  # expanded by the kubelet from the downward-API env var below


def serving_argv(
    isvc: InferenceService, config: ServingConfig, settings: OperatorSettings
) -> list[str]:
    """The exact command line the tuner measured: the engine adapter's flags (the same call the
    tuner's trial made) behind the engine image's entry point."""
    model, _, _ = model_location(served_uri(isvc, config))
    knobs = config.candidate()
    if needs_gguf(isvc, config):
        model = GGUF_FILE  # written by the init container (gguf_init_container)
    # The kubelet expands $(VAR) in a container's command: the user's URI must reach the engine
    # literally (`$$` is the kubelet's escape), or `$(POD_IP)` or `$(HOME)` in it would be replaced.
    model = model.replace("$", "$$")
    # The adapter's flags, not its command: its program is the interpreter or binary on the tuning
    # machine (a venv path there), which does not exist inside the engine's image.
    # Rendered for the engine version the tuner measured (its summary's engineOptions).
    adapter = get_adapter(
        knobs.engine, options=config.adapter_options(), quant_methods=quant_methods(isvc, config)
    )
    flags = adapter.flags(
        knobs, model, HOST, settings.serving_port, served_model_name=isvc.spec.model.served_name
    )
    return [*image_entry(knobs.engine, settings), *flags]


def served_uri(isvc: InferenceService, config: ServingConfig) -> str:
    """The checkpoint the Deployment serves: the spec's pre-quantized variant for the winner's
    precision on vLLM/SGLang (models.model_uri, the rule the tuner's trial loaded it by), an
    hf:// model.uri with model.revision pinned in it (models.pinned_uri)."""
    knobs = config.candidate()
    return pinned_uri(isvc.spec.model, model_uri(isvc.spec.model, knobs.quantization, knobs.engine))


def quant_methods(isvc: InferenceService, config: ServingConfig) -> dict[str, str | None]:
    """The winner's precision -> its variant's --quantization method: the one the tuner served it
    with (its summary), else the spec's; none when the winner is not served from a variant."""
    knobs = config.candidate()
    if model_uri(isvc.spec.model, knobs.quantization, knobs.engine) == isvc.spec.model.uri:
        return {}
    variant = isvc.spec.model.variant(knobs.quantization)
    spec_method = variant.method if variant is not None else None
    return {knobs.quantization: config.quantization_method or spec_method}


# How the engines' images start their servers: a module run by the image's interpreter that has
# the engine (the runtime row's `python`: `python3` in the upstream images, the engine's own venv
# in tuner-full, where no single `python3` has both vLLM and SGLang), or a binary.
IMAGE_MODULE: dict[str, str] = {
    "vllm": "vllm.entrypoints.openai.api_server",
    "sglang": "sglang.launch_server",
}
IMAGE_BINARY: dict[str, tuple[str, ...]] = {"llamacpp": ("/app/llama-server",)}


def image_entry(engine: str, settings: OperatorSettings) -> tuple[str, ...]:
    if engine == "builtin":
        return tuple(settings.infertune_command)
    if engine in IMAGE_MODULE:
        return (settings.runtime_for(engine).python, "-m", IMAGE_MODULE[engine])
    return IMAGE_BINARY[engine]


GGUF_DIR = "/gguf"
GGUF_FILE = f"{GGUF_DIR}/model.gguf"


def needs_gguf(isvc: InferenceService, config: ServingConfig) -> bool:
    """llama.cpp serves GGUF only: any other checkpoint is converted in the pod first."""
    model = isvc.spec.model
    return config.candidate().engine == "llamacpp" and not (
        model.format == "gguf" or model.uri.endswith(".gguf")
    )


def gguf_init_container(
    isvc: InferenceService, config: ServingConfig, settings: OperatorSettings, mounts: list[Obj]
) -> Obj:
    """Converts the checkpoint with the project's own converter and quantizer -- the ones the
    tuner's llamacpp trials used -- so the pod serves exactly the weights that were measured."""
    model, _, _ = model_location(pinned_uri(isvc.spec.model))
    command = [
        *settings.infertune_command,
        "gguf",
        "--model", model.replace("$", "$$"),
        "--quantization", config.candidate().quantization,
        "--out", GGUF_FILE,
    ]  # fmt: skip
    return {
        "name": "gguf",
        "image": settings.tuner_image,
        "imagePullPolicy": settings.image_pull_policy,
        "command": command,
        "resources": resources(isvc),
        # The tuner image is the project's: its own user and read-only root, whatever the engine's.
        "securityContext": container_security_context(PROJECT_IMAGE),
        "env": writable_dirs(PROJECT_IMAGE)[2],
        "volumeMounts": mounts,
    }


def rollout_strategy(strategy: str) -> Obj:
    """The Deployment's strategy. Surge never drops below the serving capacity but needs a free
    GPU for the extra pod; ReplaceInPlace stops one pod before its replacement starts, so it rolls
    on a full GPU pool (one replica fewer meanwhile; with one replica, a gap in serving)."""
    if strategy == "ReplaceInPlace":
        return {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1, "maxSurge": 0}}
    return {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}}


def serving_identity(isvc: InferenceService, settings: OperatorSettings) -> Obj:
    """The serving pods' pull secrets and, when the spec names one, their service account."""
    out = pull_secrets(isvc, settings)
    if isvc.spec.service_account_name:
        out["serviceAccountName"] = isvc.spec.service_account_name
    return out


def deployment_name(isvc: InferenceService, track: str) -> str:
    return isvc.name if track == "stable" else child_name(isvc.name, track)


def desired_deployment(
    isvc: InferenceService,
    config: ServingConfig,
    settings: OperatorSettings,
    *,
    track: str = "stable",
    replicas: int | None = None,
    strategy: str | None = None,
) -> Obj:
    """`strategy`: Surge or ReplaceInPlace as resolved (schedulable.effective_strategy); by
    default the spec's, Auto surging."""
    image = settings.image_for(config.candidate().engine)
    chash = config_hash(config, served_uri(isvc, config), image)
    name = deployment_name(isvc, track)
    meta = metadata(isvc, name, "serving", **{LABEL_TRACK: track})
    meta["annotations"][ANN_CONFIG] = chash
    selector = {LABEL_ISVC: isvc.name[:63], LABEL_TRACK: track}
    _, model_vols, model_mounts = model_location(served_uri(isvc, config))
    runtime = settings.runtime_for(config.candidate().engine)
    tmp_vols, tmp_mounts, tmp_env = writable_dirs(runtime, isvc.spec.hardware.memory)
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
        "securityContext": container_security_context(runtime),
        # Timed by the winner's measured start-up and /health latency under load: the startup
        # probe holds liveness off while weights load, and liveness never kills a busy engine.
        **serving_probes(probe_http, config.startup_s, config.health_latency_ms),
        "volumeMounts": [*tmp_mounts, *model_mounts],
    }
    volumes = [*tmp_vols, *model_vols]
    # An hf:// checkpoint: fetched into the cache by the init step (nothing to fetch when the
    # tuning run already filled a shared claim), read-only for the engine.
    cache_vols, cache_mount, _, init = model_cache(
        isvc,
        settings,
        hf_uris(isvc.spec.model, [served_uri(isvc, config)]),
        volumes,
        config.model_bytes,
    )
    volumes += cache_vols
    if cache_mount:
        container["volumeMounts"].append(cache_mount)
    if needs_gguf(isvc, config):
        gguf_mount = {"name": "gguf", "mountPath": GGUF_DIR}
        volumes.append({"name": "gguf", "emptyDir": {}})
        init_vols, init_mounts, _ = writable_dirs(PROJECT_IMAGE)
        have = {v["name"] for v in volumes}
        volumes += [v for v in init_vols if v["name"] not in have]
        cache_mounts = [cache_mount] if cache_mount else []
        init.append(  # after the fetch: it converts the fetched files
            gguf_init_container(
                isvc, config, settings, [*init_mounts, *model_mounts, *cache_mounts, gguf_mount]
            )
        )
        container["volumeMounts"].append({**gguf_mount, "readOnly": True})
    pod_security = pod_security_context(runtime)
    if cache_vols and "fsGroup" not in pod_security:
        # The fetch step writes as the project's user; a claim is group-writable through fsGroup.
        pod_security["fsGroup"] = PROJECT_IMAGE.run_as_user
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
    want = isvc.spec.rollout.strategy
    return stamp(
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": meta,
            "spec": {
                "replicas": count,
                "selector": {"matchLabels": selector},
                "strategy": rollout_strategy(strategy or ("Surge" if want == "Auto" else want)),
                "revisionHistoryLimit": 3,
                "template": {
                    "metadata": template_meta,
                    "spec": {
                        **serving_identity(isvc, settings),
                        "automountServiceAccountToken": False,
                        "enableServiceLinks": False,
                        "securityContext": pod_security,
                        **({"initContainers": init} if init else {}),
                        "containers": [container],
                        "volumes": volumes,
                        **placement(isvc),
                    },
                },
            },
        }
    )
