"""GGUF -> Hugging Face checkpoint (engine/gguf_import.py, engine/pretrained.py).

The Q/K un-permutation is checked against the project's own HF -> GGUF permute (the llamacpp
adapter's, which llama-server verifies end to end) and a whole small GGUF against transformers'
GGUF loader; the real SmolLM2 conversion is checked for its architecture and tokenizer.
(tests/slow/test_smollm2.py: the built-in engine's greedy tokens on it equal transformers'.)
"""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from tokenizers import Tokenizer

from infertune.engine.config import LlamaConfig
from infertune.engine.gguf_import import GGUFImportError, convert, hf_name, unpermute
from infertune.engine.pretrained import PretrainedMissingError, ensure_pretrained, gguf_path
from infertune.tuner.engines.gguf_convert import permute

HEADS, KV_HEADS, HIDDEN, LAYERS, FFN = 4, 2, 128, 2, 192
CONTROL = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")


@pytest.mark.parametrize("heads", [9, 3, 1])
def test_unpermute_inverts_llamacpp_permute(heads: int) -> None:
    w = np.random.default_rng(0).standard_normal((heads * 64, 576)).astype(np.float32)
    permuted = permute(w, heads)
    assert not np.array_equal(permuted, w)  # the permutation moves rows
    assert np.array_equal(unpermute(permuted, heads), w)
    # A 1-D tensor (a bias) follows the same row order.
    b = np.arange(heads * 64, dtype=np.float32)
    assert np.array_equal(unpermute(permute(b, heads), heads), b)


def test_tensor_names() -> None:
    assert hf_name("blk.12.attn_k.weight") == "model.layers.12.self_attn.k_proj.weight"
    assert hf_name("token_embd.weight") == "model.embed_tokens.weight"
    with pytest.raises(GGUFImportError, match="rope_freqs"):
        hf_name("rope_freqs.weight")


def _byte_vocab() -> tuple[list[str], list[int], list[str]]:
    """A byte-level BPE vocabulary: 3 control tokens, GPT-2's 256 byte symbols, a few merges."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    symbols = list(bytes_to_unicode().values())
    merges = ["Ġ t", "h e", "Ġt he", "1 2"]
    tokens = [*CONTROL, *symbols, "Ġt", "he", "Ġthe", "12"]
    types = [3] * len(CONTROL) + [1] * (len(tokens) - len(CONTROL))
    return tokens, types, merges


def _write_gguf(path: Path, hf: dict[str, np.ndarray], *, pre: str = "smollm") -> None:
    tokens, types, merges = _byte_vocab()
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_vocab_size(len(tokens))
    w.add_context_length(512)
    w.add_embedding_length(HIDDEN)
    w.add_block_count(LAYERS)
    w.add_feed_forward_length(FFN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_rope_dimension_count(HIDDEN // HEADS)
    w.add_rope_freq_base(100000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_chat_template("{% for m in messages %}<|im_start|>{{ m['content'] }}{% endfor %}")
    names = {
        "model.embed_tokens.weight": "token_embd.weight",
        "model.norm.weight": "output_norm.weight",
    }
    for i in range(LAYERS):
        for part, g in (
            ("self_attn.q_proj", "attn_q"),
            ("self_attn.k_proj", "attn_k"),
            ("self_attn.v_proj", "attn_v"),
            ("self_attn.o_proj", "attn_output"),
            ("mlp.gate_proj", "ffn_gate"),
            ("mlp.up_proj", "ffn_up"),
            ("mlp.down_proj", "ffn_down"),
            ("input_layernorm", "attn_norm"),
            ("post_attention_layernorm", "ffn_norm"),
        ):
            names[f"model.layers.{i}.{part}.weight"] = f"blk.{i}.{g}.weight"
    q8 = gguf.GGMLQuantizationType.Q8_0
    for name, data in hf.items():
        if "q_proj" in name:
            data = permute(data, HEADS)
        elif "k_proj" in name:
            data = permute(data, KV_HEADS)
        if data.ndim == 2 and "mlp" in name:  # quantized, as a real GGUF's are
            w.add_tensor(names[name], gguf.quants.quantize(data, q8), raw_dtype=q8)
        else:
            w.add_tensor(names[name], data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _random_llama() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1)
    vocab = len(_byte_vocab()[0])
    head_dim = HIDDEN // HEADS
    shapes = {"model.embed_tokens.weight": (vocab, HIDDEN), "model.norm.weight": (HIDDEN,)}
    for i in range(LAYERS):
        p = f"model.layers.{i}"
        shapes |= {
            f"{p}.self_attn.q_proj.weight": (HEADS * head_dim, HIDDEN),
            f"{p}.self_attn.k_proj.weight": (KV_HEADS * head_dim, HIDDEN),
            f"{p}.self_attn.v_proj.weight": (KV_HEADS * head_dim, HIDDEN),
            f"{p}.self_attn.o_proj.weight": (HIDDEN, HEADS * head_dim),
            f"{p}.mlp.gate_proj.weight": (FFN, HIDDEN),
            f"{p}.mlp.up_proj.weight": (FFN, HIDDEN),
            f"{p}.mlp.down_proj.weight": (HIDDEN, FFN),
            f"{p}.input_layernorm.weight": (HIDDEN,),
            f"{p}.post_attention_layernorm.weight": (HIDDEN,),
        }
    return {k: rng.standard_normal(s).astype(np.float32) * 0.1 for k, s in shapes.items()}


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict[str, np.ndarray]]:
    root = tmp_path_factory.mktemp("gguf")
    hf = _random_llama()
    _write_gguf(root / "small.gguf", hf)
    return root / "small.gguf", convert(root / "small.gguf", root / "hf"), hf


def test_small_gguf_converts_to_the_original_checkpoint(
    small: tuple[Path, Path, dict[str, np.ndarray]],
) -> None:
    _, out, hf = small
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["tie_word_embeddings"] is True  # no output.weight in the file
    assert (cfg["num_attention_heads"], cfg["num_key_value_heads"]) == (HEADS, KV_HEADS)
    assert (cfg["rms_norm_eps"], cfg["rope_theta"]) == (1e-5, 100000.0)  # not 9.9999997e-06
    llama = LlamaConfig.from_dir(out)  # the engine serves it
    assert llama.tie_word_embeddings and llama.eos_token_ids == (2,)
    tensors = load_file(str(out / "model.safetensors"))
    assert tensors.keys() == hf.keys()
    for name, want in hf.items():
        got = tensors[name].numpy()
        if "mlp" in name:  # Q8_0: within one quantization step (block max / 127) of it
            step = np.abs(want).reshape(-1, 32).max(axis=1).repeat(32).reshape(want.shape) / 127
            assert np.all(np.abs(got - want) <= step), name
            assert not np.array_equal(got, want)  # it was quantized
        else:  # F32 tensors (q/k included) come back exactly: the Q/K rows are un-permuted
            assert np.array_equal(got, want), name
    assert (out / "chat_template.jinja").read_text().startswith("{% for m in messages %}")
    assert (out / "model.safetensors").stat().st_mode & 0o044 == 0o044  # readable by servers


def test_small_gguf_matches_transformers_loader(
    small: tuple[Path, Path, dict[str, np.ndarray]],
) -> None:
    pytest.importorskip("accelerate")  # transformers' GGUF loader needs it
    from transformers import AutoModelForCausalLM

    path, out, _ = small
    ref = AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=torch.float32
    ).state_dict()
    ours = load_file(str(out / "model.safetensors"))
    for name, tensor in ours.items():
        assert torch.equal(tensor, ref[name]), name


def test_small_gguf_tokenizer(small: tuple[Path, Path, dict[str, np.ndarray]]) -> None:
    tok = Tokenizer.from_file(str(small[1] / "tokenizer.json"))
    assert tok.get_vocab_size() == len(_byte_vocab()[0])
    enc = tok.encode("<|im_start|>the 12", add_special_tokens=False)
    # The control token stays whole; "smollm" splits digits one by one, so the "1 2" merge
    # never applies (llama.cpp's \p{N} pre-split).
    assert enc.tokens == ["<|im_start|>", "t", "he", "Ġ", "1", "2"]
    assert tok.decode(enc.ids, skip_special_tokens=True) == "the 12"
    spec = json.loads((small[1] / "tokenizer_config.json").read_text())
    assert (spec["bos_token"], spec["eos_token"]) == ("<|im_start|>", "<|im_end|>")


def test_unknown_pre_tokenizer_is_refused(tmp_path: Path) -> None:
    _write_gguf(tmp_path / "m.gguf", _random_llama(), pre="qwen2")
    with pytest.raises(GGUFImportError, match=r"tokenizer\.ggml\.pre='qwen2'"):
        convert(tmp_path / "m.gguf", tmp_path / "hf")


def test_smollm2_checkpoint() -> None:
    try:
        gguf_path("smollm2-135m-instruct")
    except PretrainedMissingError as exc:
        pytest.skip(str(exc))
    out = ensure_pretrained("smollm2-135m-instruct")  # converted once (~11 s), then cached
    cfg = LlamaConfig.from_dir(out)
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.intermediate_size) == (576, 30, 1536)
    assert (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.vocab_size) == (9, 3, 49152)
    assert cfg.tie_word_embeddings and cfg.eos_token_ids == (2,)
    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    assert tok.token_to_id("<|im_start|>") == 1 and tok.token_to_id("<|im_end|>") == 2
    text = "Hello, world! It costs 1234 dollars."
    assert tok.decode(tok.encode(text).ids) == text
    assert "<|im_start|>" in (out / "chat_template.jinja").read_text()
