"""Model configuration read from a Hugging Face ``config.json``, plus analytic cost helpers.

Torch-free on purpose: the tuner's profiler uses :func:`flops_per_token`, :func:`weight_bytes`
and :func:`kv_bytes_per_token` to build the roofline model without loading a model.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: Bytes per weight element for each supported quantization (int4 also stores one
#: scale and one zero per group; see :func:`weight_bytes`).
QUANT_BITS: dict[str, int] = {"fp32": 32, "bf16": 16, "fp16": 16, "fp8": 8, "int8": 8, "int4": 4}
DTYPE_BYTES: dict[str, int] = {"fp32": 4, "float32": 4, "bf16": 2, "bfloat16": 2, "fp16": 2}
DEFAULT_INT4_GROUP = 64
SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM")


class ConfigError(ValueError):
    """A ``config.json`` that the engine cannot serve; the message names the field."""


@dataclass(frozen=True)
class LlamaConfig:
    """The subset of a Llama-family ``config.json`` that the engine needs."""

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    max_position_embeddings: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # Qwen2 has q/k/v biases
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    architecture: str = "LlamaForCausalLM"

    @property
    def q_size(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_key_value_heads * self.head_dim

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> LlamaConfig:
        archs = raw.get("architectures") or ["LlamaForCausalLM"]
        arch = str(archs[0])
        if arch not in SUPPORTED_ARCHITECTURES:
            raise ConfigError(
                f"config.json architectures={archs!r} is not supported; "
                f"supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
            )
        for key in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads"):
            if key not in raw:
                raise ConfigError(f"config.json is missing the required field {key!r}")
        if raw.get("rope_scaling") not in (None, {}):
            raise ConfigError(
                f"config.json rope_scaling={raw['rope_scaling']!r} is not supported; "
                "only rope_scaling=null"
            )
        heads = int(raw["num_attention_heads"])
        kv_heads = int(raw.get("num_key_value_heads") or heads)
        if heads % kv_heads:
            raise ConfigError(
                f"config.json num_attention_heads={heads} must be a multiple of "
                f"num_key_value_heads={kv_heads}"
            )
        hidden = int(raw["hidden_size"])
        head_dim = int(raw.get("head_dim") or hidden // heads)
        eos = raw.get("eos_token_id")
        eos_ids: tuple[int, ...] = (
            () if eos is None else tuple(int(e) for e in (eos if isinstance(eos, list) else [eos]))
        )
        bos = raw.get("bos_token_id")
        rope_theta = raw.get("rope_theta")
        if rope_theta is None:  # transformers >= 5 nests it under rope_parameters
            rope_theta = (raw.get("rope_parameters") or {}).get("rope_theta", 10000.0)
        return cls(
            hidden_size=hidden,
            intermediate_size=int(raw["intermediate_size"]),
            num_hidden_layers=int(raw["num_hidden_layers"]),
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            head_dim=head_dim,
            vocab_size=int(raw["vocab_size"]),
            max_position_embeddings=int(raw.get("max_position_embeddings", 2048)),
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            rope_theta=float(rope_theta),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            attention_bias=bool(raw.get("attention_bias", arch == "Qwen2ForCausalLM")),
            bos_token_id=None if bos is None else int(bos),
            eos_token_ids=eos_ids,
            architecture=arch,
        )

    @classmethod
    def from_dir(cls, model_dir: Path | str) -> LlamaConfig:
        path = Path(model_dir) / "config.json"
        if not path.is_file():
            raise ConfigError(f"no config.json in model directory {str(model_dir)!r}")
        raw = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(raw, dict):
            raise ConfigError(f"{path} must hold a JSON object")
        return cls.from_dict(raw)


def _check_quant(quantization: str) -> None:
    if quantization not in QUANT_BITS:
        raise ConfigError(
            f"quantization={quantization!r} is not one of {', '.join(sorted(QUANT_BITS))}"
        )


def linear_params(cfg: LlamaConfig) -> int:
    """Parameters in the matmul weights (attention, MLP and the LM head), excluding norms."""
    h = cfg.hidden_size
    per_layer = h * (cfg.q_size + 2 * cfg.kv_size) + cfg.q_size * h + 3 * h * cfg.intermediate_size
    return cfg.num_hidden_layers * per_layer + cfg.vocab_size * h


def flops_per_token(cfg: LlamaConfig, context_len: int = 0) -> int:
    """Forward FLOPs for one token: 2 per matmul weight plus attention over ``context_len``."""
    attn = 4 * cfg.num_hidden_layers * cfg.num_attention_heads * cfg.head_dim * context_len
    return 2 * linear_params(cfg) + attn


def weight_bytes(
    cfg: LlamaConfig, quantization: str = "fp32", group_size: int = DEFAULT_INT4_GROUP
) -> int:
    """Bytes of weights read per decode step (the memory-bound roofline numerator).

    The LM head is quantized like the other linears; the embedding table is only gathered
    (one row per token), so it is not counted; norms are negligible but counted at fp32.
    """
    _check_quant(quantization)
    n = linear_params(cfg)
    body = n * QUANT_BITS[quantization] // 8
    if quantization == "int8":  # one bf16 scale per output channel
        body += 2 * (cfg.num_hidden_layers * (cfg.q_size + 2 * cfg.kv_size + 2 * cfg.hidden_size))
        body += 2 * (cfg.num_hidden_layers * 2 * cfg.intermediate_size + cfg.vocab_size)
    elif quantization == "int4":  # a bf16 (scale, zero) pair per group
        body += 2 * 2 * (n // group_size)
    norms = 4 * cfg.hidden_size * (2 * cfg.num_hidden_layers + 1)
    return body + norms


def kv_bytes_per_token(cfg: LlamaConfig, dtype: str = "fp32") -> int:
    """KV-cache bytes one token occupies across all layers (keys and values)."""
    if dtype not in DTYPE_BYTES:
        raise ConfigError(f"kv dtype={dtype!r} is not one of {', '.join(sorted(DTYPE_BYTES))}")
    return 2 * cfg.num_hidden_layers * cfg.kv_size * DTYPE_BYTES[dtype]
