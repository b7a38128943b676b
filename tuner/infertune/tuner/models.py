"""Where a model URI's files are: inside a pod, and on the machine the tuner runs on.

One set of rules for both sides: the operator mounts a model where `pod_path` says
(builders.common.model_location) and the tuner, given the same URI, looks there (`resolve_model`),
so the two agree on the mount point. No torch here: the builtin checkpoints' generator is imported
only when a builtin:// model is resolved.

    pvc://CLAIM/sub   -> the claim mounted read-only at /mnt/models/CLAIM, files at /mnt/models/CLAIM/sub
    file:///dir       -> the node's directory, mounted at the same path (/dir)
    /dir (plain path) -> as file:///dir (taken literally: '#', '?' and ';' are part of the name)
    hf://REPO[@REV]   -> the model cache volume at /mnt/model-cache, files at
                         /mnt/model-cache/hf/REPO/REV (REV: the URI's, else model.revision, else
                         main; quoted when it holds '/'), written by the pod's fetch-model init step
                         (hub_fetch.py); standalone, the same code fetches into the local cache
    builtin://        -> no volume; generated locally

The tuner looks for hf:// files under $INFERTUNE_MODEL_CACHE (the operator sets it to the mount
point in its pods), else /mnt/model-cache when it exists, else ~/.cache/infertune/models; an hf://
directory counts only once its fetch finished (hub_fetch.FETCHED_MARKER), so a half-written download
is never loaded.

A precision with a pre-quantized checkpoint (model.variants.<q>) is served by vLLM/SGLang from that
checkpoint's URI, by the same rules (`model_uri`); its --quantization method is the spec's, else the
checkpoint's config.json `quantization_config.quant_method` when it is local (`variant_methods`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from urllib.parse import quote, urlparse

from infertune.tuner.api.model import ModelSource, split_hf_uri
from infertune.tuner.hub_fetch import FetchError, fetch, fetched, hf_location

MODELS_ROOT = "/mnt/models"  # where a pod finds its pvc:// claims
MODEL_CACHE_ROOT = "/mnt/model-cache"  # where a pod finds its hf:// models (the cache volume)
CACHE_ENV = "INFERTUNE_MODEL_CACHE"  # the cache root as the process sees it


def scheme_of(uri: str) -> str:
    """The URI's scheme; a plain path is a file:// URI."""
    return urlparse(uri).scheme or "file"


def claim_mount(claim: str) -> str:
    """The mount point of a pvc:// model's claim inside the pod."""
    return f"{MODELS_ROOT}/{claim}"


def hf_subdir(repo: str, revision: str) -> str:
    """The directory of one repository at one revision, relative to the cache root: one per
    revision, so a service pinned to a commit never sees another revision's files."""
    return f"hf/{repo}/{quote(revision, safe='')}"


def pinned_uri(source: ModelSource, uri: str | None = None) -> str:
    """`uri` (default model.uri) with model.revision written into it when it is model.uri's own
    hf:// URI, so a URI alone says where its files are (variants pin theirs in their URI)."""
    uri = source.uri if uri is None else uri
    if uri != source.uri or source.scheme != "hf":
        return uri
    repo, _ = split_hf_uri(uri)
    return f"hf://{repo}@{source.hf_revision}"


def pod_path(uri: str) -> str | None:
    """Where a pod sees the model's files, or None when no volume carries them (builtin://)."""
    parsed = urlparse(uri)
    if not parsed.scheme:
        return uri
    if parsed.scheme == "pvc":
        return claim_mount(parsed.netloc) + parsed.path.rstrip("/")
    if parsed.scheme == "file":
        return parsed.path
    if parsed.scheme == "hf":
        return f"{MODEL_CACHE_ROOT}/{hf_subdir(*hf_location(uri))}"
    return None


def cache_root() -> Path:
    """The hf:// cache as this process sees it: $INFERTUNE_MODEL_CACHE (set in the operator's
    pods to the mount point), else the mount point when it exists, else the user's cache."""
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env)
    if Path(MODEL_CACHE_ROOT).is_dir():
        return Path(MODEL_CACHE_ROOT)
    return Path.home() / ".cache" / "infertune" / "models"


def hf_local_dir(uri: str, root: Path | None = None) -> Path:
    """The directory an hf:// URI's files are fetched into under `root` (default cache_root())."""
    return (root or cache_root()) / hf_subdir(*hf_location(uri))


# The engines that serve a pre-quantized checkpoint for int8/int4; the others quantize model.uri.
VARIANT_ENGINES = frozenset({"vllm", "sglang"})


def model_uri(source: ModelSource, quantization: str | None = None, engine: str = "") -> str:
    """The URI `engine` loads for `quantization`: the variant's when the spec names one for that
    precision and the engine serves variants, else model.uri."""
    variant = source.variant(quantization) if quantization else None
    return variant.uri if variant is not None and engine in VARIANT_ENGINES else source.uri


def _local_dir(uri: str) -> Path | None:
    """The URI's directory on this machine when it is there (file://, a path, a mounted pvc://,
    a fetched hf://)."""
    if scheme_of(uri) == "hf":
        local_hf = hf_local_dir(uri)
        return local_hf if fetched(local_hf) else None
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
        # The variant's own URI pins its revision: model.revision is model.uri's.
        variant = {"uri": uri, "variants": None, "revision": None}
        return resolve_model(source.model_copy(update=variant))
    scheme = source.scheme
    if scheme == "hf":
        return _resolve_hf(pinned_uri(source), source.format)
    if scheme == "builtin":  # a generated random-weight size or a converted pretrained model
        from infertune.engine.pretrained import ensure_builtin

        return ensure_builtin(urlparse(source.uri).netloc)
    local = pod_path(source.uri)
    if scheme == "file" and local is not None:
        path = Path(local)
        if not path.exists():
            raise ValueError(f"model.uri {source.uri!r}: {path} does not exist")
        return path
    # pvc:// is mounted by the operator's pods under MODELS_ROOT.
    if scheme == "pvc" and local is not None:
        path = Path(local)
        if path.exists():
            return path
        raise ValueError(f"model.uri {source.uri!r}: expected the claim mounted at {path}")
    raise ValueError(
        f"model.uri {source.uri!r}: scheme {source.scheme!r} cannot be tuned standalone; "
        "use builtin://, hf://, file:// or a path"
    )


def _resolve_hf(uri: str, fmt: str = "safetensors") -> Path:
    """The fetched directory of an hf:// URI: in a pod, where its init step put it; standalone,
    fetched now into the local cache by the same code (needs the Hub, or $HF_ENDPOINT's mirror;
    a gated repository needs $HF_TOKEN)."""
    local = hf_local_dir(uri)
    if fetched(local):
        return local
    try:
        return fetch(uri, local, fmt=fmt).directory
    except FetchError as exc:
        raise ValueError(f"model.uri {uri!r}: {exc.message}") from exc
