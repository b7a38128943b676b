"""A llama.cpp GGUF (Llama architecture) -> a Hugging Face checkpoint directory.

The reverse of ``tuner/engines/gguf_convert.py``, with PyPI ``gguf``'s reader and dequantizers
(the ones llama.cpp's own Python tools use). The output is what transformers, vLLM and this
project's engine load: ``config.json``, ``model.safetensors`` (fp32), ``tokenizer.json``,
``tokenizer_config.json``, ``special_tokens_map.json``, ``generation_config.json`` and
``chat_template.jinja``.

What has to be undone or rebuilt:

* **Q/K row order.** llama.cpp's converter interleaves the rows of ``q_proj``/``k_proj`` per head
  (HF rotates halves of a head, llama.cpp adjacent pairs); :func:`unpermute` puts them back.
  ``k_proj`` is permuted with the KV head count.
* **Weights** are stored dequantized in fp32: Q4_1 (``d * q + m``, fp16 ``d``/``m``) and Q8_0
  values are exact in fp32 and not in bf16/fp16, so fp32 keeps the GGUF's model bit for bit.
  A file without ``output.weight`` ties the LM head to the embeddings (``tie_word_embeddings``).
* **Tokenizer.** ``tokenizer.ggml.model = gpt2`` is a byte-level BPE (tokens already spelled in
  GPT-2's byte alphabet, merges as ``"a b"``); ``tokenizer.ggml.pre`` names how llama.cpp splits
  text before BPE, rebuilt here as the ``tokenizers`` pre-tokenizer with the same regexes
  (llama.cpp's llama-vocab.cpp). Tokens typed CONTROL (3) are special added tokens, USER_DEFINED
  (4) plain added tokens, so both are matched whole as llama.cpp does.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import gguf
    import torch

#: llama.cpp token types (gguf.TokenType).
CONTROL, USER_DEFINED = 3, 4
#: tokenizer.ggml.pre -> whether digits are split one by one before the GPT-2 regex
#: (llama-vocab.cpp: starcoder, refact, smollm, ... use {"\p{N}", GPT-2 regex}; gpt2, mpt, olmo
#: use the GPT-2 regex alone). Other pre-tokenizers are refused rather than guessed.
PRE_TOKENIZERS: dict[str, bool] = {
    "gpt2": False,
    "mpt": False,
    "olmo": False,
    "starcoder": True,
    "refact": True,
    "smollm": True,
    "codeshell": True,
}
_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}


class GGUFImportError(ValueError):
    """A GGUF this importer does not convert; the message names the key or tensor."""


def unpermute(weight: np.ndarray[Any, Any], n_head: int) -> np.ndarray[Any, Any]:
    """llama.cpp's interleaved RoPE pairs -> HF's rotate-half row order, per head (the inverse
    of llama.cpp's ``permute``, as transformers' GGUF loader does it)."""
    rows = weight.shape[0]
    return (
        weight.reshape(n_head, rows // n_head // 2, 2, *weight.shape[1:])
        .swapaxes(1, 2)
        .reshape(weight.shape)
    )


def hf_name(gguf_name: str) -> str:
    """The Hugging Face tensor name of a GGUF tensor."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    parts = gguf_name.split(".", 2)
    if len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in _LAYER_NAMES:
        return f"model.layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}"
    raise GGUFImportError(f"GGUF tensor {gguf_name!r} has no Llama counterpart")


def _float32_value(value: float) -> float:
    # GGUF stores floats as float32: 1e-5 reads back as 9.999999747e-06. The shortest decimal
    # that round-trips to the same float32 is what the original config.json said.
    return float(str(np.float32(value)))


class _Metadata:
    """Typed access to a reader's key/value fields."""

    def __init__(self, reader: gguf.GGUFReader) -> None:
        self.fields = reader.fields

    def get(self, key: str, default: Any = None) -> Any:
        field = self.fields.get(key)
        return default if field is None else field.contents()

    def need(self, key: str) -> Any:
        if key not in self.fields:
            raise GGUFImportError(f"GGUF metadata has no {key!r}")
        return self.fields[key].contents()


def hf_config(meta: _Metadata, *, tied: bool) -> dict[str, Any]:
    """config.json for a ``general.architecture = llama`` file."""
    arch = meta.need("general.architecture")
    if arch != "llama":
        raise GGUFImportError(f"general.architecture={arch!r}: only 'llama' is converted")
    scaling = meta.get("llama.rope.scaling.type")
    if scaling not in (None, "none"):
        raise GGUFImportError(f"llama.rope.scaling.type={scaling!r}: only unscaled RoPE")
    hidden = int(meta.need("llama.embedding_length"))
    heads = int(meta.need("llama.attention.head_count"))
    head_dim = int(meta.get("llama.rope.dimension_count", hidden // heads))
    if head_dim * heads != hidden:
        raise GGUFImportError(
            f"llama.rope.dimension_count={head_dim}: partial RoPE is not converted"
        )
    tokens = meta.need("tokenizer.ggml.tokens")
    bos, eos = meta.get("tokenizer.ggml.bos_token_id"), meta.get("tokenizer.ggml.eos_token_id")
    pad = meta.get("tokenizer.ggml.padding_token_id")
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": int(meta.need("llama.feed_forward_length")),
        "num_hidden_layers": int(meta.need("llama.block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(meta.get("llama.attention.head_count_kv", heads)),
        "head_dim": head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": int(meta.need("llama.context_length")),
        "rms_norm_eps": _float32_value(meta.need("llama.attention.layer_norm_rms_epsilon")),
        "rope_theta": _float32_value(meta.get("llama.rope.freq_base", 10000.0)),
        "rope_scaling": None,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": tied,
        "vocab_size": int(meta.get("llama.vocab_size", len(tokens))),
        "bos_token_id": None if bos is None else int(bos),
        "eos_token_id": None if eos is None else int(eos),
        "pad_token_id": None if pad is None else int(pad),
        "torch_dtype": "float32",
    }


def hf_tensors(reader: gguf.GGUFReader, config: dict[str, Any]) -> dict[str, torch.Tensor]:
    """Every tensor dequantized to fp32 under its HF name, Q/K rows back in HF order."""
    import torch
    from gguf.quants import dequantize

    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    out: dict[str, torch.Tensor] = {}
    for t in reader.tensors:
        name = hf_name(t.name)
        # GGUF lists dimensions fastest-first; the row-major shape is the reverse.
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))
        data = dequantize(t.data, t.tensor_type).reshape(shape).astype(np.float32, copy=False)
        if name.endswith("self_attn.q_proj.weight"):
            data = unpermute(data, heads)
        elif name.endswith("self_attn.k_proj.weight"):
            data = unpermute(data, kv_heads)
        # F32 tensors dequantize to a view of the read-only file map: copy those.
        out[name] = torch.from_numpy(np.require(data, requirements=["C", "W"]))
    return out


def hf_tokenizer(meta: _Metadata) -> Any:
    """The ``tokenizers.Tokenizer`` a ``gpt2``-model GGUF describes."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

    model = meta.need("tokenizer.ggml.model")
    if model != "gpt2":
        raise GGUFImportError(f"tokenizer.ggml.model={model!r}: only byte-level BPE ('gpt2')")
    pre = meta.get("tokenizer.ggml.pre", "gpt2")
    if pre not in PRE_TOKENIZERS:
        raise GGUFImportError(
            f"tokenizer.ggml.pre={pre!r} is not one of {', '.join(sorted(PRE_TOKENIZERS))}"
        )
    tokens: list[str] = list(meta.need("tokenizer.ggml.tokens"))
    types: list[int] = list(meta.get("tokenizer.ggml.token_type", [1] * len(tokens)))
    merges = [tuple(m.split(" ", 1)) for m in meta.need("tokenizer.ggml.merges")]
    bpe = models.BPE(vocab={tok: i for i, tok in enumerate(tokens)}, merges=merges)
    tok = Tokenizer(bpe)
    # ByteLevel(use_regex=True) splits with GPT-2's regex, llama.cpp's second expression.
    split = [pre_tokenizers.Digits(individual_digits=True)] if PRE_TOKENIZERS[pre] else []
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [*split, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)]
    )
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.add_special_tokens(
        [
            AddedToken(t, special=True, normalized=False)
            for t, kind in zip(tokens, types, strict=True)
            if kind == CONTROL
        ]
    )
    tok.add_tokens(
        [
            AddedToken(t, special=False, normalized=False)
            for t, kind in zip(tokens, types, strict=True)
            if kind == USER_DEFINED
        ]
    )
    if tok.get_vocab_size() != len(tokens):
        raise GGUFImportError(
            f"tokenizer has {tok.get_vocab_size()} entries after adding special tokens, "
            f"the GGUF lists {len(tokens)}"
        )
    return tok


def _token(meta: _Metadata, key: str) -> str | None:
    index = meta.get(f"tokenizer.ggml.{key}")
    return None if index is None else str(meta.need("tokenizer.ggml.tokens")[int(index)])


def tokenizer_files(meta: _Metadata) -> dict[str, dict[str, Any]]:
    """tokenizer_config.json, special_tokens_map.json and generation_config.json."""
    specials = {
        name: value
        for name, key in (
            ("bos_token", "bos_token_id"),
            ("eos_token", "eos_token_id"),
            ("unk_token", "unknown_token_id"),
            ("pad_token", "padding_token_id"),
        )
        if (value := _token(meta, key)) is not None
    }
    generation = {
        key: int(meta.get(f"tokenizer.ggml.{gguf_key}"))
        for key, gguf_key in (
            ("bos_token_id", "bos_token_id"),
            ("eos_token_id", "eos_token_id"),
            ("pad_token_id", "padding_token_id"),
        )
        if meta.get(f"tokenizer.ggml.{gguf_key}") is not None
    }
    return {
        "tokenizer_config.json": {
            "tokenizer_class": "PreTrainedTokenizerFast",
            **specials,
            "add_bos_token": bool(meta.get("tokenizer.ggml.add_bos_token", False)),
            "add_eos_token": bool(meta.get("tokenizer.ggml.add_eos_token", False)),
            "clean_up_tokenization_spaces": False,
            "model_max_length": int(meta.need("llama.context_length")),
        },
        "special_tokens_map.json": specials,
        "generation_config.json": generation,
    }


def convert(
    gguf_file: Path | str,
    out_dir: Path | str,
    *,
    extra_files: dict[str, dict[str, Any]] | None = None,
    progress: Callable[[str], None] | None = None,
) -> Path:
    """Write the HF checkpoint of ``gguf_file`` into ``out_dir`` (created if missing)."""
    import gguf
    from safetensors.torch import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    reader = gguf.GGUFReader(str(gguf_file))
    meta = _Metadata(reader)
    names = {t.name for t in reader.tensors}
    config = hf_config(meta, tied="output.weight" not in names)
    if progress:
        progress(f"dequantizing {len(names)} tensors of {gguf_file}")
    tensors = hf_tensors(reader, config)
    missing = {"model.embed_tokens.weight", "model.norm.weight"} - tensors.keys()
    if missing:
        raise GGUFImportError(f"GGUF has no tensor for {sorted(missing)}")
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "model.safetensors").chmod(0o644)  # written private; the cache is shared with servers
    hf_tokenizer(meta).save(str(out / "tokenizer.json"))
    template = meta.get("tokenizer.chat_template")
    if template:
        (out / "chat_template.jinja").write_text(str(template), encoding="utf-8")
    files = {"config.json": config} | tokenizer_files(meta) | (extra_files or {})
    for name, content in files.items():
        (out / name).write_text(json.dumps(content, indent=2) + "\n", encoding="utf-8")
    return out
