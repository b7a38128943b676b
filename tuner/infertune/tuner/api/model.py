"""Where the weights are."""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import Literal
from urllib.parse import urlparse

from pydantic import Field, field_validator

from infertune.tuner.api.base import ApiModel

MODEL_SCHEMES = ("file", "pvc", "hf", "builtin")
BUILTIN_SIZES = ("tiny", "small", "medium")


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

    @field_validator("uri")
    @classmethod
    def _safe_uri(cls, uri: str) -> str:
        parsed = urlparse(uri)
        scheme = parsed.scheme or "file"
        if scheme not in MODEL_SCHEMES:
            raise ValueError(
                f"scheme {scheme!r} is not supported; use one of {list(MODEL_SCHEMES)}"
            )
        path = (parsed.netloc + parsed.path) if scheme != "file" else parsed.path
        if ".." in PurePosixPath(path).parts:
            raise ValueError(f"{uri!r} contains '..'; give a path without parent references")
        if any(ch in uri for ch in "\x00\n\r"):
            raise ValueError("uri contains control characters")
        if scheme == "builtin" and parsed.netloc not in BUILTIN_SIZES:
            raise ValueError(f"builtin model size must be one of {list(BUILTIN_SIZES)}")
        if scheme == "pvc" and not parsed.netloc:
            raise ValueError("pvc:// uri needs a claim name: pvc://CLAIM/path/inside")
        return uri

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
