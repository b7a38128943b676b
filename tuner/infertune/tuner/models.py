"""Where a model URI's files are: inside a pod, and on the machine the tuner runs on.

One set of rules for both sides: the operator mounts a model where `pod_path` says
(builders.common.model_location) and the tuner, given the same URI, looks there (`resolve_model`),
so the two agree on the mount point. No torch here: the builtin checkpoints' generator is imported
only when a builtin:// model is resolved.

    pvc://CLAIM/sub   -> the claim mounted read-only at /mnt/models/CLAIM, files at /mnt/models/CLAIM/sub
    file:///dir       -> the node's directory, mounted at the same path (/dir)
    /dir (plain path) -> as file:///dir (taken literally: '#', '?' and ';' are part of the name)
    hf://, builtin:// -> no volume; builtin:// is generated locally, hf:// cannot be tuned standalone

A precision with a pre-quantized checkpoint (model.variants.<q>) is served by vLLM/SGLang from that
checkpoint's URI, by the same rules (`model_uri`); its --quantization method is the spec's, else the
checkpoint's config.json `quantization_config.quant_method` when it is local (`variant_methods`).
"""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import urlparse

from infertune.tuner.api.model import ModelSource

MODELS_ROOT = "/mnt/models"  # where a pod finds its pvc:// claims


def scheme_of(uri: str) -> str:
    """The URI's scheme; a plain path is a file:// URI."""
    return urlparse(uri).scheme or "file"


def claim_mount(claim: str) -> str:
    """The mount point of a pvc:// model's claim inside the pod."""
    return f"{MODELS_ROOT}/{claim}"


def pod_path(uri: str) -> str | None:
    """Where a pod sees the model's files, or None when no volume carries them (hf://, builtin://)."""
    parsed = urlparse(uri)
    if not parsed.scheme:
        return uri
    if parsed.scheme == "pvc":
        return claim_mount(parsed.netloc) + parsed.path.rstrip("/")
    if parsed.scheme == "file":
        return parsed.path
    return None


# The engines that serve a pre-quantized checkpoint for int8/int4; the others quantize model.uri.
VARIANT_ENGINES = frozenset({"vllm", "sglang"})


def model_uri(source: ModelSource, quantization: str | None = None, engine: str = "") -> str:
    """The URI `engine` loads for `quantization`: the variant's when the spec names one for that
    precision and the engine serves variants, else model.uri."""
    variant = source.variant(quantization) if quantization else None
    return variant.uri if variant is not None and engine in VARIANT_ENGINES else source.uri


def _local_dir(uri: str) -> Path | None:
    """The URI's directory on this machine when it is there (file://, a path, a mounted pvc://)."""
    local = pod_path(uri)
    return Path(local) if local is not None and Path(local).is_dir() else None


def checkpoint_method(uri: str) -> str | None:
    """config.json's `quantization_config.quant_method` of a local checkpoint (None: not local,
    no config, or no such key)."""
    local = _local_dir(uri)
    if local is None:
        return None
    try:
        config = json.loads((local / "config.json").read_text())
    except (OSError, ValueError):
        return None
    quant = config.get("quantization_config") if isinstance(config, dict) else None
    method = quant.get("quant_method") if isinstance(quant, dict) else None
    return str(method) if method else None


def variant_methods(source: ModelSource, *, read_checkpoints: bool = True) -> dict[str, str | None]:
    """Precision -> the --quantization method of its pre-quantized checkpoint, for every variant
    the spec names: the spec's `method`, else (with `read_checkpoints`) the checkpoint's own
    config.json when it is local; None when neither says (the precision is then pruned)."""
    if source.variants is None:
        return {}
    return {
        q: v.method or (checkpoint_method(v.uri) if read_checkpoints else None)
        for q, v in source.variants.items()
    }


def resolve_model(source: ModelSource, quantization: str | None = None, engine: str = "") -> Path:
    """A local checkpoint directory for the spec's model URI (the variant's for `quantization`
    when `engine` serves variants)."""
    uri = model_uri(source, quantization, engine)
    if uri != source.uri:
        return resolve_model(source.model_copy(update={"uri": uri, "variants": None}))
    scheme = source.scheme
    if scheme == "builtin":  # a generated random-weight size or a converted pretrained model
        from infertune.engine.pretrained import ensure_builtin

        return ensure_builtin(urlparse(source.uri).netloc)
    local = pod_path(source.uri)
    if scheme == "file" and local is not None:
        path = Path(local)
        if not path.exists():
            raise ValueError(f"model.uri {source.uri!r}: {path} does not exist")
        return path
    # pvc:// is mounted by the operator's pods under MODELS_ROOT; hf:// needs a download step.
    if scheme == "pvc" and local is not None:
        path = Path(local)
        if path.exists():
            return path
        raise ValueError(f"model.uri {source.uri!r}: expected the claim mounted at {path}")
    raise ValueError(
        f"model.uri {source.uri!r}: scheme {source.scheme!r} cannot be tuned standalone; "
        "use builtin://, file:// or a path"
    )
