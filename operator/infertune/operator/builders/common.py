"""What every child shares: names, labels, owner reference, hardened pod settings, placement."""

from __future__ import annotations

import hashlib
from typing import Any
from urllib.parse import urlparse

from infertune.operator import engine_runtime
from infertune.operator.api import API_VERSION, KIND, ClusterModelSource, InferenceService
from infertune.operator.engine_runtime import PROJECT_IMAGE, EngineRuntime
from infertune.operator.hashing import digest
from infertune.operator.settings import OperatorSettings
from infertune.tuner.api.model import ModelSource
from infertune.tuner.gpu_identity import PRODUCT_LABEL
from infertune.tuner.models import (
    CACHE_ENV,
    MODEL_CACHE_ROOT,
    claim_mount,
    pinned_uri,
    pod_path,
    scheme_of,
)

Obj = dict[str, Any]

LABEL_ISVC = "infertune.dev/inferenceservice"
LABEL_COMPONENT = "app.kubernetes.io/component"
LABEL_MANAGED = "app.kubernetes.io/managed-by"
LABEL_TRACK = "infertune.dev/track"
MANAGED_BY = "infertune-operator"
ANN_DESIRED = "infertune.dev/desired-hash"
ANN_CONFIG = "infertune.dev/config-hash"
ANN_SPEC = "infertune.dev/spec-hash"
GPU_PRODUCT_LABEL = PRODUCT_LABEL
GPU_RESOURCE = "nvidia.com/gpu"


def child_name(base: str, suffix: str, limit: int = 63) -> str:
    """`base-suffix` within `limit` chars (names used as label values must fit 63)."""
    name = f"{base}-{suffix}"
    if len(name) <= limit:
        return name
    tag = hashlib.sha256(base.encode()).hexdigest()[:6]
    keep = limit - len(suffix) - len(tag) - 2
    return f"{base[:keep].rstrip('-')}-{tag}-{suffix}"


def labels(isvc: InferenceService, component: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "infertune",
        "app.kubernetes.io/instance": isvc.name[:63],
        LABEL_COMPONENT: component,
        LABEL_MANAGED: MANAGED_BY,
        LABEL_ISVC: isvc.name[:63],
    }


def owner_reference(isvc: InferenceService) -> Obj:
    """Controller owner: the garbage collector deletes every child with the InferenceService."""
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": isvc.name,
        "uid": str(isvc.metadata.get("uid", "")),
        "controller": True,
        "blockOwnerDeletion": True,
    }


def metadata(isvc: InferenceService, name: str, component: str, **extra_labels: str) -> Obj:
    return {
        "name": name,
        "namespace": isvc.namespace,
        "labels": {**labels(isvc, component), **extra_labels},
        "annotations": {},
        "ownerReferences": [owner_reference(isvc)],
    }


def stamp(obj: Obj) -> Obj:
    """Record the desired object's hash, so reconcile compares hashes, not server-defaulted fields."""
    obj["metadata"].setdefault("annotations", {})[ANN_DESIRED] = digest(obj)[:16]
    return obj


def pod_security_context(rt: EngineRuntime = PROJECT_IMAGE) -> Obj:
    """The image's user (the project's images: 65532) and seccomp RuntimeDefault."""
    return engine_runtime.pod_security_context(rt)


def container_security_context(rt: EngineRuntime = PROJECT_IMAGE) -> Obj:
    return engine_runtime.container_security_context(rt)


def writable_dirs(
    rt: EngineRuntime = PROJECT_IMAGE, memory: str | None = None
) -> tuple[list[Obj], list[Obj], list[Obj]]:
    """emptyDirs for /tmp and caches (the root filesystem is read-only); volumes, mounts, env.
    `memory` (the pod's) sizes /dev/shm where the runtime has one."""
    return engine_runtime.writable_dirs(rt, memory)


def pull_secrets(isvc: InferenceService, settings: OperatorSettings) -> Obj:
    """`imagePullSecrets` for a pod: the operator's (the chart's), then the service's own."""
    names = [*settings.image_pull_secrets, *(s.name for s in isvc.spec.image_pull_secrets)]
    unique = list(dict.fromkeys(names))
    return {"imagePullSecrets": [{"name": n} for n in unique]} if unique else {}


def model_location(uri: str, volume: str = "model") -> tuple[str, list[Obj], list[Obj]]:
    """Where the pod sees the model, plus the volume and mount that put it there.

    pvc://CLAIM/sub -> the claim mounted read-only under /mnt/models/CLAIM; file:///dir -> the node's
    directory (hostPath) at the same path; hf:// is on the model cache (model_cache), builtin://
    needs no volume. The paths come from
    infertune.tuner.models, the rules the tuner resolves the same URI with. `volume`: its name.
    """
    path = pod_path(uri)
    if path is None:
        return uri, [], []
    parsed = urlparse(uri)
    if parsed.scheme == "hf":  # on the model cache volume (model_cache), shared by every hf:// URI
        return path, [], []
    if parsed.scheme == "pvc":
        claim = parsed.netloc
        mount = claim_mount(claim)
        vol = {"name": volume, "persistentVolumeClaim": {"claimName": claim, "readOnly": True}}
        return path, [vol], [{"name": volume, "mountPath": mount, "readOnly": True}]
    vol = {"name": volume, "hostPath": {"path": path, "type": "Directory"}}
    return path, [vol], [{"name": volume, "mountPath": path, "readOnly": True}]


def model_volumes(source: ModelSource) -> tuple[list[Obj], list[Obj]]:
    """Volumes and mounts for model.uri and every pre-quantized variant (the tuning pod loads each
    precision's checkpoint): `model`, then `model-<q>`; a mount point already there (the same claim
    or directory) is not mounted twice."""
    vols: list[Obj] = []
    mounts: list[Obj] = []
    variants = source.variants.items() if source.variants is not None else []
    for name, uri in [("model", source.uri), *((f"model-{q}", v.uri) for q, v in variants)]:
        _, more_vols, more_mounts = model_location(uri, name)
        if more_mounts and any(m["mountPath"] == more_mounts[0]["mountPath"] for m in mounts):
            continue
        vols += more_vols
        mounts += more_mounts
    return vols, mounts


MODEL_CACHE_VOLUME = "model-cache"
FETCH_CONTAINER = "fetch-model"
FETCH_TERMINATION_LOG = "/dev/termination-log"
# The fetch needs little: a few HTTP streams written to disk (hf_xet buffers some chunks).
FETCH_RESOURCES: Obj = {"requests": {"cpu": "500m", "memory": "512Mi"}, "limits": {"memory": "2Gi"}}


def hf_uris(source: ClusterModelSource, uris: list[str] | None = None) -> list[str]:
    """The hf:// URIs among `uris` (default: model.uri and every variant), each with its revision
    pinned (models.pinned_uri), once each."""
    chosen = source.hf_uris() if uris is None else [u for u in uris if scheme_of(u) == "hf"]
    return list(dict.fromkeys(pinned_uri(source, u) for u in chosen))


def cache_size_for(model_bytes: int) -> str:
    """An emptyDir's room for a checkpoint of `model_bytes`: 10% more and 1 GiB for the client's
    metadata and partial files (rounded up to MiB)."""
    return f"{-(-(model_bytes * 11 // 10 + 2**30) // 2**20)}Mi"


def model_cache_volume(
    isvc: InferenceService, settings: OperatorSettings, model_bytes: int | None = None
) -> Obj:
    """The spec's claim, else the operator's (the chart's), else an emptyDir per pod, sized by
    the spec or the chart when either says, else by the checkpoint's fetched size when known
    (`model_bytes`: the tuning pod's download, for a serving pod)."""
    cache = isvc.spec.model.cache
    claim = (cache.claim_name if cache else None) or settings.model_cache_claim
    if claim:
        return {"name": MODEL_CACHE_VOLUME, "persistentVolumeClaim": {"claimName": claim}}
    size = (cache.size if cache else None) or settings.model_cache_size
    if size is None and model_bytes:
        size = cache_size_for(model_bytes)
    return {"name": MODEL_CACHE_VOLUME, "emptyDir": {"sizeLimit": size} if size else {}}


def fetch_init_container(
    isvc: InferenceService, settings: OperatorSettings, uris: list[str]
) -> Obj:
    """`infertune fetch-model` in the project's image: the hf:// models into the cache volume,
    once per cache (a filled claim costs no download). The token reaches it only as $HF_TOKEN
    from the spec's Secret (optional: a missing Secret is reported as the Hub's refusal, not a
    pod stuck in CreateContainerConfigError); its outcome is its termination message."""
    env: list[Obj] = [
        *writable_dirs(PROJECT_IMAGE)[2],
        {"name": CACHE_ENV, "value": MODEL_CACHE_ROOT},
        {"name": "HF_HUB_DISABLE_TELEMETRY", "value": "1"},
    ]
    if settings.hf_endpoint:
        env.append({"name": "HF_ENDPOINT", "value": settings.hf_endpoint})
    ref = isvc.spec.model.token_secret
    if ref is not None:
        secret = {"name": ref.name, "key": ref.key, "optional": True}
        env.append({"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": secret}})
    command = [
        *settings.infertune_command,
        "fetch-model",
        *(u.replace("$", "$$") for u in uris),
        *(["--format", "gguf"] if isvc.spec.model.format == "gguf" else []),
        "--termination-message",
        FETCH_TERMINATION_LOG,
    ]
    return {
        "name": FETCH_CONTAINER,
        "image": settings.tuner_image,
        "imagePullPolicy": settings.image_pull_policy,
        "command": command,
        "env": env,
        "resources": FETCH_RESOURCES,
        # The project's image: its own user and a read-only root, whatever the engine's.
        "securityContext": container_security_context(PROJECT_IMAGE),
        "terminationMessagePath": FETCH_TERMINATION_LOG,
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "volumeMounts": [
            *writable_dirs(PROJECT_IMAGE)[1],
            {"name": MODEL_CACHE_VOLUME, "mountPath": MODEL_CACHE_ROOT},
        ],
    }


def model_cache(
    isvc: InferenceService,
    settings: OperatorSettings,
    uris: list[str],
    have: list[Obj],
    model_bytes: int | None = None,
) -> tuple[list[Obj], Obj, list[Obj], list[Obj]]:
    """What a pod that loads the hf:// `uris` needs: (volumes to add, the read-only mount for the
    containers that load them, the env that tells the tuner the mount point, the init containers).
    Empty when none of `uris` is hf://. `have`: the pod's volumes already (the project image's
    writable dirs are added when missing); `model_bytes` sizes an emptyDir (model_cache_volume)."""
    if not uris:
        return [], {}, [], []
    names = {v["name"] for v in have}
    extra = [v for v in writable_dirs(PROJECT_IMAGE)[0] if v["name"] not in names]
    volumes = [*extra, model_cache_volume(isvc, settings, model_bytes)]
    mount = {"name": MODEL_CACHE_VOLUME, "mountPath": MODEL_CACHE_ROOT, "readOnly": True}
    env = [{"name": CACHE_ENV, "value": MODEL_CACHE_ROOT}]
    return volumes, mount, env, [fetch_init_container(isvc, settings, uris)]


def placement(isvc: InferenceService, gpu_product: str | None = None) -> Obj:
    """nodeSelector, required affinity on the GPU product, tolerations (incl. the usual GPU taint)."""
    hw = isvc.spec.hardware
    out: Obj = {}
    if hw.node_selector:
        out["nodeSelector"] = dict(sorted(hw.node_selector.items()))
    products = [gpu_product] if gpu_product else list(hw.gpu_products)
    if products:
        out["affinity"] = {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {"key": GPU_PRODUCT_LABEL, "operator": "In", "values": products}
                            ]
                        }
                    ]
                }
            }
        }
    tolerations = [t.to_wire() for t in hw.tolerations]
    if hw.gpus_per_replica > 0:
        tolerations.append({"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"})
    if tolerations:
        out["tolerations"] = tolerations
    return out


def resources(isvc: InferenceService) -> Obj:
    hw = isvc.spec.hardware
    requests: Obj = {"cpu": hw.cpu, "memory": hw.memory}
    limits: Obj = {"memory": hw.memory}
    if hw.gpus_per_replica > 0:
        # Extended resources cannot be overcommitted: request and limit must be equal.
        requests[GPU_RESOURCE] = str(hw.gpus_per_replica)
        limits[GPU_RESOURCE] = str(hw.gpus_per_replica)
    return {"requests": requests, "limits": limits}
