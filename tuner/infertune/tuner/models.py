"""Where a model URI's files are: inside a pod, and on the machine the tuner runs on.

One set of rules for both sides: the operator mounts a model where `pod_path` says
(builders.common.model_location) and the tuner, given the same URI, looks there (`resolve_model`),
so the two agree on the mount point. No torch here: the builtin checkpoints' generator is imported
only when a builtin:// model is resolved.

    pvc://CLAIM/sub   -> the claim mounted read-only at /mnt/models/CLAIM, files at /mnt/models/CLAIM/sub
    file:///dir       -> the node's directory, mounted at the same path (/dir)
    /dir (plain path) -> as file:///dir (taken literally: '#', '?' and ';' are part of the name)
    hf://, builtin:// -> no volume; builtin:// is generated locally, hf:// cannot be tuned standalone
"""

from __future__ import annotations

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


def resolve_model(source: ModelSource) -> Path:
    """A local checkpoint directory for the spec's model URI."""
    scheme = source.scheme
    if scheme == "builtin":
        from infertune.engine.make_model import ensure_model

        return ensure_model(urlparse(source.uri).netloc)
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
