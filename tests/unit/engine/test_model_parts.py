"""Config parsing, cost helpers, quantized kernels, the checkpoint writer, CUDA Graph refusal."""

from __future__ import annotations

import json

import pytest
import torch
from model_reference import tiny_model

from infertune.engine.config import (
    ConfigError,
    LlamaConfig,
    flops_per_token,
    kv_bytes_per_token,
    weight_bytes,
)
from infertune.engine.make_model import SIZES, hf_config, random_weights, train_tokenizer
from infertune.engine.quant import UnsupportedConfig, int4_quantize, make_linear
from infertune.engine.runner import ModelRunner


def test_config_reads_tiny_and_cost_helpers_count_by_hand() -> None:
    cfg = LlamaConfig.from_dir(tiny_model())
    assert (cfg.hidden_size, cfg.num_key_value_heads, cfg.head_dim) == (256, 2, 32)
    assert cfg.eos_token_ids == (2,)
    per_layer = 256 * (256 + 64 + 64) + 256 * 256 + 3 * 256 * 768
    linear = 4 * per_layer + 4096 * 256
    assert flops_per_token(cfg) == 2 * linear
    assert flops_per_token(cfg, context_len=100) == 2 * linear + 4 * 4 * 8 * 32 * 100
    assert kv_bytes_per_token(cfg, "fp32") == 2 * 4 * 64 * 4
    assert kv_bytes_per_token(cfg, "bf16") == 2 * 4 * 64 * 2
    assert weight_bytes(cfg, "bf16") < weight_bytes(cfg, "int8") * 2
    assert weight_bytes(cfg, "int4") < weight_bytes(cfg, "int8") < weight_bytes(cfg, "fp32")


@pytest.mark.parametrize("quantization", ["fp32", "bf16", "int8", "int4"])
def test_analytic_weight_bytes_match_the_loaded_model(quantization: str) -> None:
    runner = ModelRunner(tiny_model(), quantization=quantization, num_kv_blocks=4)
    predicted = weight_bytes(runner.config, quantization)
    assert abs(runner.weight_bytes() - predicted) / predicted < 0.01


def test_config_errors_name_the_field() -> None:
    raw = hf_config(SIZES["tiny"])
    with pytest.raises(ConfigError, match="rope_scaling"):
        LlamaConfig.from_dict(raw | {"rope_scaling": {"type": "linear", "factor": 2.0}})
    with pytest.raises(ConfigError, match="architectures"):
        LlamaConfig.from_dict(raw | {"architectures": ["GPT2LMHeadModel"]})
    with pytest.raises(ConfigError, match="num_key_value_heads"):
        LlamaConfig.from_dict(raw | {"num_key_value_heads": 3})
    with pytest.raises(ConfigError, match="quantization='int3'"):
        weight_bytes(LlamaConfig.from_dict(raw), "int3")


def test_int8_and_int4_kernels_compute_their_dequantised_matmul() -> None:
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(192, 256, generator=gen)
    x = torch.randn(5, 256, generator=gen).to(torch.bfloat16)  # the kernels' activation dtype
    xf = x.float()
    int8 = make_linear(w, None, quantization="int8", device="cpu")
    scales = (w.abs().amax(dim=1) / 127).to(torch.bfloat16).float()
    w8 = torch.round(w / (w.abs().amax(dim=1) / 127)[:, None]).clamp(-127, 127) * scales[:, None]
    # bf16 output: compare at bf16's resolution against the fp32 dequantised product.
    torch.testing.assert_close(int8(x).float(), xf @ w8.T, rtol=2e-2, atol=5e-2)
    for group in (32, 64, 128):
        q, qparams = int4_quantize(w, group)
        scale = qparams[..., 0].T.repeat_interleave(group, dim=1)
        zero = qparams[..., 1].T.repeat_interleave(group, dim=1)
        scale, zero = scale.bfloat16().float(), zero.bfloat16().float()
        w4 = (q.float() - 8) * scale + zero
        assert (w4 - w).abs().max() <= scale.max() * 0.52  # round-to-nearest (+ bf16 qparams)
        int4 = make_linear(w, None, quantization="int4", device="cpu", group_size=group)
        torch.testing.assert_close(int4(x).float(), xf @ w4.T, rtol=2e-2, atol=5e-2)
    with pytest.raises(UnsupportedConfig, match="group_size=48"):
        make_linear(w, None, quantization="int4", device="cpu", group_size=48)


def test_checkpoint_is_deterministic_and_loads_in_transformers() -> None:
    transformers = pytest.importorskip("transformers")
    a, b = random_weights(SIZES["tiny"], seed=3), random_weights(SIZES["tiny"], seed=3)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["lm_head.weight"], random_weights(SIZES["tiny"], 4)["lm_head.weight"])
    assert train_tokenizer(4096).to_str() == train_tokenizer(4096).to_str()
    tok = transformers.AutoTokenizer.from_pretrained(tiny_model())
    text = "Return the sorted list of files, or raise OSError ✓."
    ids = tok(text).input_ids
    assert ids[0] == tok.bos_token_id == 1 and len(ids) < len(text) // 2
    assert tok.decode(ids, skip_special_tokens=True) == text  # byte fallback covers "✓"
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_model())
    assert type(model).__name__ == "LlamaForCausalLM"
    # The Llama-2 tokenizer shape that llama.cpp's converter (LlamaHfVocab) requires.
    raw = json.loads((tiny_model() / "tokenizer.json").read_text())
    assert raw["model"]["type"] == "BPE" and raw["model"]["byte_fallback"] is True
    assert raw["decoder"]["type"] == "Sequence"
    assert raw["model"]["vocab"]["<0x00>"] == 3 and len(tok) == 4096


def test_cuda_graph_is_refused_on_cpu() -> None:
    with pytest.raises(UnsupportedConfig, match="cuda_graph=True needs a CUDA device"):
        ModelRunner(tiny_model(), cuda_graph=True, num_kv_blocks=4)


def test_cuda_graph_buckets_cover_every_batch_size() -> None:
    from infertune.engine.cuda_graphs import buckets

    assert buckets(32) == [1, 2, 4, 8, 16, 24, 32]
    assert buckets(5) == [1, 2, 4, 5]
    for limit in (1, 3, 17, 64):
        sizes = buckets(limit)
        assert sizes[-1] == limit and all(any(s >= n for s in sizes) for n in range(1, limit + 1))
