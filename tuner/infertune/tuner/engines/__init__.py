"""Engine adapters: one small interface (command line, env, health URL, metrics, capabilities)."""

from __future__ import annotations

from collections.abc import Mapping

from infertune.tuner.engines.base import (
    AdapterError,
    Capabilities,
    EngineAdapter,
    Launch,
    default_served_name,
)
from infertune.tuner.engines.builtin import BuiltinAdapter
from infertune.tuner.engines.llamacpp import LlamaCppAdapter
from infertune.tuner.engines.options import EngineOptions
from infertune.tuner.engines.sglang import SglangAdapter
from infertune.tuner.engines.vllm import VllmAdapter

__all__ = [
    "ADAPTERS",
    "AdapterError",
    "BuiltinAdapter",
    "Capabilities",
    "EngineAdapter",
    "EngineOptions",
    "Launch",
    "LlamaCppAdapter",
    "SglangAdapter",
    "VllmAdapter",
    "default_served_name",
    "get_adapter",
]

ADAPTERS: dict[str, type[EngineAdapter]] = {
    "builtin": BuiltinAdapter,
    "vllm": VllmAdapter,
    "llamacpp": LlamaCppAdapter,
    "sglang": SglangAdapter,
}


def get_adapter(
    name: str,
    *,
    options: EngineOptions | None = None,
    quant_methods: Mapping[str, str | None] | None = None,
) -> EngineAdapter:
    """The adapter for engine `name` (builtin, vllm, llamacpp, sglang); `options`: the engine
    version's options to map flags for (the operator passes the tuner's record), else learned
    from the installed engine when first needed; `quant_methods`: precision -> the method of the
    spec's pre-quantized checkpoint for it (models.variant_methods; vLLM/SGLang serve them)."""
    try:
        cls = ADAPTERS[name]
    except KeyError:
        raise AdapterError(
            f"engine {name!r} has no adapter; allowed values: {sorted(ADAPTERS)}"
        ) from None
    return cls(options=options, quant_methods=quant_methods)
