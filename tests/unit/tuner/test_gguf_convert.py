"""The HF -> GGUF converter for the llamacpp adapter, read back with gguf's own reader.

(`tests/slow/test_external_engines.py` checks the file end to end: llama-server's greedy tokens on
it equal the built-in engine's.)
"""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
import pytest
from safetensors.numpy import load_file

from infertune.engine.make_model import ensure_model
from infertune.tuner.engines.gguf_convert import ConversionError, convert, permute


@pytest.fixture(scope="module")
def tiny() -> Path:
    return ensure_model("tiny")


def _field(reader: gguf.GGUFReader, key: str) -> object:
    return reader.fields[key].contents()


def test_metadata_tokens_and_weights_round_trip(tiny: Path, tmp_path: Path) -> None:
    out = convert(tiny, tmp_path / "tiny.gguf", "f32")
    r = gguf.GGUFReader(out)
    cfg = json.loads((tiny / "config.json").read_text())
    assert _field(r, "general.architecture") == "llama"
    assert _field(r, "llama.block_count") == cfg["num_hidden_layers"]
    assert _field(r, "llama.attention.head_count_kv") == cfg["num_key_value_heads"]
    assert _field(r, "llama.rope.freq_base") == pytest.approx(cfg["rope_theta"])
    assert _field(r, "llama.attention.layer_norm_rms_epsilon") == pytest.approx(1e-5)
    # The tokenizer: same strings at the same ids, bytes typed as bytes, specials as control.
    vocab = json.loads((tiny / "tokenizer.json").read_text())["model"]["vocab"]
    tokens = _field(r, "tokenizer.ggml.tokens")
    types = _field(r, "tokenizer.ggml.token_type")
    assert isinstance(tokens, list) and isinstance(types, list)
    assert all(tokens[i] == t for t, i in vocab.items())
    assert types[vocab["<0x41>"]] == gguf.TokenType.BYTE
    assert types[1] == types[2] == gguf.TokenType.CONTROL
    assert types[0] == gguf.TokenType.UNKNOWN
    assert _field(r, "tokenizer.ggml.model") == "llama"
    assert _field(r, "tokenizer.ggml.bos_token_id") == 1
    # Weights: q/k are permuted for llama.cpp's RoPE, everything else is copied as is.
    hf = load_file(str(tiny / "model.safetensors"))
    t = {x.name: np.asarray(x.data).reshape(list(reversed(x.shape.tolist()))) for x in r.tensors}
    assert len(t) == 2 + 1 + 9 * cfg["num_hidden_layers"]
    np.testing.assert_array_equal(
        t["blk.1.attn_v.weight"], hf["model.layers.1.self_attn.v_proj.weight"]
    )
    np.testing.assert_array_equal(t["output.weight"], hf["lm_head.weight"])
    q = hf["model.layers.0.self_attn.q_proj.weight"]
    assert not np.array_equal(t["blk.0.attn_q.weight"], q)
    np.testing.assert_array_equal(t["blk.0.attn_q.weight"], permute(q, cfg["num_attention_heads"]))


def test_permute_interleaves_rotate_half_pairs() -> None:
    # One head of dim 4, rows [a0, a1, b0, b1] (rotate_half pairs a_i with b_i) -> [a0, b0, a1, b1].
    w = np.arange(4, dtype=np.float32)[:, None]
    assert permute(w, 1)[:, 0].tolist() == [0.0, 2.0, 1.0, 3.0]


@pytest.mark.parametrize(
    ("outtype", "qtype", "tol"), [("q8_0", "Q8_0", 0.01), ("q4_0", "Q4_0", 0.2)]
)
def test_quantized_files_dequantize_close(
    tiny: Path, tmp_path: Path, outtype: str, qtype: str, tol: float
) -> None:
    r = gguf.GGUFReader(convert(tiny, tmp_path / f"{outtype}.gguf", outtype))
    by_name = {x.name: x for x in r.tensors}
    assert by_name["blk.0.attn_norm.weight"].tensor_type == gguf.GGMLQuantizationType.F32
    up = by_name["blk.2.ffn_up.weight"]
    assert up.tensor_type.name == qtype
    hf = load_file(str(tiny / "model.safetensors"))["model.layers.2.mlp.up_proj.weight"]
    deq = gguf.quants.dequantize(up.data, up.tensor_type).reshape(hf.shape)
    rel = np.abs(deq - hf).mean() / np.abs(hf).mean()
    assert rel < tol


def test_rejects_what_it_cannot_write(tiny: Path, tmp_path: Path) -> None:
    with pytest.raises(ConversionError, match="outtype"):
        convert(tiny, tmp_path / "x.gguf", "q3_k")
    odd = tmp_path / "odd"
    odd.mkdir()
    cfg = json.loads((tiny / "config.json").read_text()) | {"model_type": "gpt_neox"}
    (odd / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConversionError, match="model_type 'gpt_neox'"):
        convert(odd, tmp_path / "y.gguf", "f32")
    assert not (tmp_path / "y.gguf").exists()


def test_gguf_command_writes_the_file_a_llamacpp_pod_serves(tmp_path: Path) -> None:
    # What the llama.cpp Deployment's init container runs: the builtin URI resolved, int4 as Q4_0.
    from infertune.cli import main

    out = tmp_path / "gguf" / "model.gguf"
    rc = main(["gguf", "--model", "builtin://tiny", "--quantization", "int4", "--out", str(out)])
    assert rc == 0
    r = gguf.GGUFReader(out)
    types = {t.name: t.tensor_type.name for t in r.tensors}
    assert types["blk.0.attn_q.weight"] == "Q4_0"
    assert list(out.parent.iterdir()) == [out]  # no work files left beside it
    with pytest.raises(SystemExit):
        main(["gguf", "--model", "builtin://tiny", "--quantization", "int3", "--out", str(out)])
