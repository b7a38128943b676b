"""The analytic model reads any decoder's shape from config.json and safetensors headers alone."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import pytest

from infertune.tuner.model_shape import (
    ModelShape,
    ShapeError,
    from_config,
    read_headers,
    read_safetensors_header,
)

CONFIGS = Path(__file__).parents[2] / "data" / "model_configs"

# name -> (published total parameters, published active parameters, KV bytes/token in bf16 =
# layers x kv_heads x head_dim x 2 x 2 bytes)
PUBLISHED = {
    "llama-3.1-8b": (8.03e9, 8.03e9, 32 * 8 * 128 * 2 * 2),
    "qwen3-8b": (8.19e9, 8.19e9, 36 * 8 * 128 * 2 * 2),
    "gemma-2-9b": (9.24e9, 9.24e9, 42 * 8 * 256 * 2 * 2),
    "phi-3-mini-4k": (3.82e9, 3.82e9, 32 * 32 * 96 * 2 * 2),
    "mixtral-8x7b": (46.7e9, 12.9e9, 32 * 8 * 128 * 2 * 2),
}


def shape(name: str) -> ModelShape:
    return ModelShape.from_dir(CONFIGS / name)


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_parameters_and_kv_match_the_published_sizes(name: str) -> None:
    total, active, kv = PUBLISHED[name]
    s = shape(name)
    assert s.total_params == pytest.approx(total, rel=0.02)
    assert s.active_params == pytest.approx(active, rel=0.02)
    assert s.kv_bytes_per_token("bf16") == kv
    assert s.source == "config.json"  # no weights, no headers: config.json alone


def test_fields_other_engines_refuse_are_read_not_required() -> None:
    llama = shape("llama-3.1-8b")
    assert llama.rope_type == "llama3" and llama.max_position_embeddings == 131072
    assert llama.num_kv_heads == 8 and llama.num_heads == 32  # GQA
    gemma = shape("gemma-2-9b")
    assert gemma.tied and gemma.sliding_window == 4096 and gemma.sliding_layers == 21
    assert gemma.kv_bytes(8192, "bf16") < gemma.kv_bytes_per_token("bf16") * 8192
    assert gemma.kv_bytes(4096, "bf16") == gemma.kv_bytes_per_token("bf16") * 4096
    phi = shape("phi-3-mini-4k")
    assert phi.sliding_window == 2047 and phi.sliding_layers == 32
    assert shape("qwen3-8b").sliding_window is None  # use_sliding_window: false
    mixtral = shape("mixtral-8x7b")
    assert (mixtral.num_experts, mixtral.experts_per_token) == (8, 2)
    assert any("mixture of experts" in n for n in mixtral.notes)


def test_moe_decode_reads_only_the_routed_experts() -> None:
    m = shape("mixtral-8x7b")
    one, many = m.read_bytes("bf16", 1), m.read_bytes("bf16", 64)
    assert one == pytest.approx(2 * (m.active_params - m.embedding_params), rel=0.01)
    assert many == pytest.approx(2 * (m.total_params - m.embedding_params), rel=0.01)
    assert m.weight_bytes("int4") < m.weight_bytes("int8") < m.weight_bytes("bf16")


def test_qwen3_moe_and_deepseek_v3_counts() -> None:
    # Qwen/Qwen3-30B-A3B's config.json fields: 30.5B total, 3.3B active (model card).
    qwen = from_config({
        "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": 2048,
        "num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 4,
        "head_dim": 128, "vocab_size": 151936, "intermediate_size": 6144, "num_experts": 128,
        "num_experts_per_tok": 8, "moe_intermediate_size": 768, "decoder_sparse_step": 1,
        "mlp_only_layers": [], "tie_word_embeddings": False,
    })  # fmt: skip
    assert qwen.total_params == pytest.approx(30.5e9, rel=0.02)
    assert qwen.active_params == pytest.approx(3.3e9, rel=0.03)
    # deepseek-ai/DeepSeek-V3's config.json: 671B total, 37B active (the paper; the hub's 685B
    # adds the 14B multi-token-prediction module, which serving does not load).
    ds = from_config({
        "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
        "hidden_size": 7168, "num_hidden_layers": 61, "num_attention_heads": 128,
        "num_key_value_heads": 128, "vocab_size": 129280, "intermediate_size": 18432,
        "moe_intermediate_size": 2048, "n_routed_experts": 256, "n_shared_experts": 1,
        "num_experts_per_tok": 8, "first_k_dense_replace": 3, "moe_layer_freq": 1,
        "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64, "v_head_dim": 128, "tie_word_embeddings": False,
        "rope_scaling": {"type": "yarn", "factor": 40},
    })  # fmt: skip
    assert ds.total_params == pytest.approx(671e9, rel=0.02)
    assert ds.active_params == pytest.approx(37e9, rel=0.03)
    assert ds.kv_bytes_per_token("bf16") == 61 * (512 + 64) * 2  # MLA's latent, not K and V
    assert ds.rope_type == "yarn"


def test_a_config_without_a_needed_field_names_it() -> None:
    with pytest.raises(ShapeError, match="num_hidden_layers"):
        from_config({"hidden_size": 64, "num_attention_heads": 4, "vocab_size": 10})


def _write_safetensors(path: Path, tensors: dict[str, tuple[str, list[int]]], data: bool) -> None:
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, (dtype, dims) in tensors.items():
        n = 2 if dtype in ("BF16", "F16") else 4
        for d in dims:
            n *= d
        header[name] = {"dtype": dtype, "shape": dims, "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + (b"\0" * offset if data else b""))


def _moe_checkpoint(tmp_path: Path) -> Path:
    h, inter, vocab, experts = 64, 128, 100, 4
    cfg = {
        "architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "hidden_size": h,
        "intermediate_size": inter, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "vocab_size": vocab, "num_local_experts": experts,
        "num_experts_per_tok": 2, "torch_dtype": "bfloat16",
    }  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    shards: list[dict[str, tuple[str, list[int]]]] = [
        {"model.embed_tokens.weight": ("BF16", [vocab, h])},
        {"lm_head.weight": ("BF16", [vocab, h]), "model.norm.weight": ("BF16", [h])},
    ]
    for i in range(2):
        p = f"model.layers.{i}."
        shards[i].update({
            p + "self_attn.q_proj.weight": ("BF16", [h, h]),
            p + "self_attn.k_proj.weight": ("BF16", [32, h]),
            p + "self_attn.v_proj.weight": ("BF16", [32, h]),
            p + "self_attn.o_proj.weight": ("BF16", [h, h]),
            p + "input_layernorm.weight": ("BF16", [h]),
            p + "post_attention_layernorm.weight": ("BF16", [h]),
            p + "block_sparse_moe.gate.weight": ("BF16", [experts, h]),
        })  # fmt: skip
        for e in range(experts):
            for w, dims in (("w1", [inter, h]), ("w2", [h, inter]), ("w3", [inter, h])):
                shards[i][f"{p}block_sparse_moe.experts.{e}.{w}.weight"] = ("BF16", dims)
    for i, tensors in enumerate(shards):
        # Headers only, no data: the analytic model never reads past the header.
        _write_safetensors(tmp_path / f"model-0000{i + 1}-of-00002.safetensors", tensors, False)
    return tmp_path


def test_headers_make_the_counts_exact_without_reading_data(tmp_path: Path) -> None:
    model = _moe_checkpoint(tmp_path)
    tensors = read_headers(model)
    total = sum(t.elements for t in tensors.values())
    s = ModelShape.from_dir(model)
    assert s.source == "config.json + safetensors headers"
    assert (
        s.total_params
        == total
        == from_config(json.loads((model / "config.json").read_text())).total_params
    )
    assert s.checkpoint_bytes == 2 * total and s.checkpoint_dtype == "bfloat16"
    experts = sum(t.elements for n, t in tensors.items() if ".experts." in n)
    assert s.active_params == total - experts // 2


def test_a_prequantized_checkpoint_keeps_the_config_counts(tmp_path: Path) -> None:
    model = _moe_checkpoint(tmp_path)
    _write_safetensors(model / "extra.safetensors", {"x.qweight": ("I32", [8, 8])}, True)
    s = ModelShape.from_dir(model)
    assert s.source == "config.json" and any("pre-quantized" in n for n in s.notes)


def test_a_truncated_header_is_a_shape_error(tmp_path: Path) -> None:
    (tmp_path / "bad.safetensors").write_bytes(b"\x01\x02")
    with pytest.raises(ShapeError, match=r"bad\.safetensors"):
        read_safetensors_header(tmp_path / "bad.safetensors")


def test_the_builtin_tiny_model_matches_its_loaded_parameter_count() -> None:
    from infertune.engine.make_model import ensure_model

    model = ensure_model("tiny")
    s = ModelShape.from_dir(model)
    tensors = read_safetensors_header(next(model.glob("*.safetensors")))
    assert s.total_params == sum(t.elements for t in tensors.values())
    assert s.source == "config.json + safetensors headers"
    assert s.total_params == pytest.approx(
        from_config(json.loads((model / "config.json").read_text())).total_params, rel=0.01
    )
