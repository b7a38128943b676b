"""``infertune make-model``: random-weight Llama checkpoints with a real trained tokenizer.

The checkpoint is a plain Hugging Face directory (config.json, model.safetensors, tokenizer.json,
tokenizer_config.json, special_tokens_map.json, generation_config.json) that transformers'
``LlamaForCausalLM``/``AutoTokenizer`` load, and whose tokenizer has the Llama-2 shape
(byte-fallback BPE over "▁"-marked words, ``<unk>``/``<s>``/``</s>`` then 256 byte tokens) so
llama.cpp's converter and vLLM accept it too. The tokenizer is trained with ``tokenizers`` on
``data/tokenizer_corpus.txt``, which ships with the project.

Sizes (all GQA with 4 query heads per KV head; widths divisible by 128 so int4 group sizes
32/64/128 all apply):

========  ======  ======  =====  ========  ============  =====  ==========
size      hidden  layers  heads  kv heads  intermediate  vocab  parameters
========  ======  ======  =====  ========  ============  =====  ==========
tiny      256     4       8      2         768           4096   ~5.3 M
small     512     8       8      2         1536          8192   ~31 M
medium    1024    16      16     4         2816          8192   ~185 M
========  ======  ======  =====  ========  ============  =====  ==========

"tiny" keeps a decode step in the millisecond range on two CPU cores while the transformer
layers (not only Python overhead) still dominate; "small" and "medium" are for GPUs and for
showing how the knobs move with model size.

Weight init (chosen so that greedy decoding is a meaningful, precision-stable check): random
models with the usual small init give nearly flat logits whose top-2 gap is within bf16 rounding,
so greedy tokens flip between precisions on noise alone; larger uniform gains make the dynamics
chaotic and flip them too (measured: first divergence fp32 vs bf16 after 1-30 tokens). Here
``lm_head`` is a permutation of the (unit-variance) embedding table, so every token has a
strongly preferred successor with a wide logit margin, and the attention weights have larger
gains (q/k x2: sharp attention; v/o x1.2: strong context signal) so that about 1 in 6 greedy
successors is decided by the context rather than by the current token alone (measured 82/504
on the tiny model). Linear weights are N(0, gain^2 / fan_in).

Recipe 3 scales the token embeddings by ``EMBED_GAIN`` = 1.1 (``lm_head`` keeps the unit-variance
permuted table): the current token's share of the residual stream grows a little, so the
context-decided successors that remain are decided by a margin wider than bf16's rounding.
Measured on the tiny model and the 8 correctness prompts x 64 tokens: bf16 greedy equals the
fp32 reference on 7/8 prompts with gain 1.0 and 8/8 with 1.1, while 29/512 greedy tokens still
differ from the previous token's context-free successor (so attention still decides tokens and
a broken attention still changes them); gain 1.5 made that 0/512, a pure bigram chain.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

if TYPE_CHECKING:
    import torch

RECIPE_VERSION = 3
INIT_GAIN = 1.0
EMBED_GAIN = 1.1
QK_GAIN = 2.0
VO_GAIN = 1.2
GAINS = {
    "all": INIT_GAIN,
    "embed": EMBED_GAIN,
    "qk": QK_GAIN,
    "vo": VO_GAIN,
    "lm_head": "permuted embedding",
}
SPECIAL_TOKENS = ("<unk>", "<s>", "</s>")
BYTE_TOKENS = tuple(f"<0x{b:02X}>" for b in range(256))
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


@dataclass(frozen=True)
class ModelSize:
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int = 4096
    torch_dtype: str = "float32"


SIZES: dict[str, ModelSize] = {
    "tiny": ModelSize(256, 4, 8, 2, 768, 4096),
    "small": ModelSize(512, 8, 8, 2, 1536, 8192),
    "medium": ModelSize(1024, 16, 16, 4, 2816, 8192, torch_dtype="bfloat16"),
}


def _size(size: str) -> ModelSize:
    if size not in SIZES:
        raise ValueError(f"--size {size!r} is not one of {', '.join(SIZES)}")
    return SIZES[size]


def default_cache_root() -> Path:
    """``$INFERTUNE_MODEL_CACHE`` or ``~/.cache/infertune/models``."""
    env = os.environ.get("INFERTUNE_MODEL_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "infertune" / "models"


def corpus_text() -> str:
    text = resources.files("infertune.engine").joinpath("data/tokenizer_corpus.txt")
    lines = text.read_text(encoding="utf-8").splitlines()
    return "\n".join(line for line in lines if not line.startswith("# "))


def train_tokenizer(vocab_size: int) -> Tokenizer:
    """A Llama-2-shaped byte-fallback BPE tokenizer with exactly ``vocab_size`` entries."""
    reserved = len(SPECIAL_TOKENS) + len(BYTE_TOKENS)
    metaspace = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=True)
    probe = Tokenizer(models.BPE())
    probe.pre_tokenizer = metaspace
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - reserved, limit_alphabet=120, show_progress=False
    )
    probe.train_from_iterator(corpus_text().split("\n\n"), trainer=trainer)
    trained = json.loads(probe.to_str())["model"]
    learned = sorted(trained["vocab"].items(), key=lambda kv: kv[1])
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS + BYTE_TOKENS)}
    for tok, _ in learned:
        vocab.setdefault(tok, len(vocab))
    if len(vocab) != vocab_size:
        raise RuntimeError(
            f"trained tokenizer has {len(vocab)} entries, expected vocab_size={vocab_size}; "
            "the corpus is too small for this vocabulary"
        )
    merges: list[tuple[str, str]] = []
    for m in trained["merges"]:
        left, right = m.split(" ", 1) if isinstance(m, str) else m
        merges.append((str(left), str(right)))
    bpe = models.BPE(
        vocab=vocab,
        merges=merges,
        unk_token="<unk>",  # noqa: S106 - a token, not a password
        byte_fallback=True,
        fuse_unk=True,
    )
    tok = Tokenizer(bpe)
    tok.pre_tokenizer = metaspace
    tok.decoder = decoders.Sequence(
        [
            decoders.Replace("▁", " "),
            decoders.ByteFallback(),
            decoders.Fuse(),
            decoders.Strip(content=" ", left=1, right=0),
        ]
    )
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 1)]
    )
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    return tok


def random_weights(spec: ModelSize, seed: int) -> dict[str, torch.Tensor]:
    import torch  # only to write a model: a cached one is found without it (engine start-up)

    gen = torch.Generator().manual_seed(seed)
    head_dim = spec.hidden_size // spec.num_attention_heads
    h, inter = spec.hidden_size, spec.intermediate_size

    def normal(out_f: int, in_f: int, gain: float = INIT_GAIN) -> torch.Tensor:
        weight: torch.Tensor = torch.randn(out_f, in_f, generator=gen) * (gain / in_f**0.5)
        return weight

    def norm_weight() -> torch.Tensor:
        # Near 1 but not all-ones, so a norm applied to the wrong tensor changes the output.
        return 1.0 + 0.1 * torch.randn(h, generator=gen)

    tensors = {"model.embed_tokens.weight": torch.randn(spec.vocab_size, h, generator=gen)}
    for i in range(spec.num_hidden_layers):
        p = f"model.layers.{i}"
        tensors[f"{p}.input_layernorm.weight"] = norm_weight()
        tensors[f"{p}.self_attn.q_proj.weight"] = normal(
            spec.num_attention_heads * head_dim, h, QK_GAIN
        )
        tensors[f"{p}.self_attn.k_proj.weight"] = normal(
            spec.num_key_value_heads * head_dim, h, QK_GAIN
        )
        tensors[f"{p}.self_attn.v_proj.weight"] = normal(
            spec.num_key_value_heads * head_dim, h, VO_GAIN
        )
        tensors[f"{p}.self_attn.o_proj.weight"] = normal(
            h, spec.num_attention_heads * head_dim, VO_GAIN
        )
        tensors[f"{p}.post_attention_layernorm.weight"] = norm_weight()
        tensors[f"{p}.mlp.gate_proj.weight"] = normal(inter, h)
        tensors[f"{p}.mlp.up_proj.weight"] = normal(inter, h)
        tensors[f"{p}.mlp.down_proj.weight"] = normal(h, inter)
    tensors["model.norm.weight"] = norm_weight()
    perm = torch.randperm(spec.vocab_size, generator=gen)
    table = tensors["model.embed_tokens.weight"]
    tensors["lm_head.weight"] = table[perm] / h**0.5
    tensors["model.embed_tokens.weight"] = table * EMBED_GAIN
    dtype = getattr(torch, spec.torch_dtype)
    return {name: t.to(dtype).contiguous() for name, t in tensors.items()}


def hf_config(spec: ModelSize) -> dict[str, object]:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": spec.hidden_size,
        "intermediate_size": spec.intermediate_size,
        "num_hidden_layers": spec.num_hidden_layers,
        "num_attention_heads": spec.num_attention_heads,
        "num_key_value_heads": spec.num_key_value_heads,
        "head_dim": spec.hidden_size // spec.num_attention_heads,
        "hidden_act": "silu",
        "max_position_embeddings": spec.max_position_embeddings,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "rope_scaling": None,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "vocab_size": spec.vocab_size,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "pad_token_id": None,
        "torch_dtype": spec.torch_dtype,
        "initializer_range": INIT_GAIN / spec.hidden_size**0.5,
    }


def write_model(directory: Path | str, size: str = "tiny", *, seed: int = 0) -> Path:
    """Write a complete checkpoint for ``size`` into ``directory`` (created or overwritten)."""
    spec = _size(size)
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = train_tokenizer(spec.vocab_size)
    tokenizer.save(str(out / "tokenizer.json"))
    from safetensors.torch import save_file

    save_file(random_weights(spec, seed), str(out / "model.safetensors"), metadata={"format": "pt"})
    specials = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}
    files: dict[str, object] = {
        "config.json": hf_config(spec),
        "generation_config.json": {"bos_token_id": 1, "eos_token_id": 2, "do_sample": False},
        "special_tokens_map.json": specials,
        "tokenizer_config.json": {
            "tokenizer_class": "PreTrainedTokenizerFast",
            **specials,
            "add_bos_token": True,
            "add_eos_token": False,
            "clean_up_tokenization_spaces": False,
            "model_max_length": spec.max_position_embeddings,
            "chat_template": CHAT_TEMPLATE,
        },
        "infertune_recipe.json": {"version": RECIPE_VERSION, "size": size, "seed": seed}
        | {"spec": asdict(spec), "gains": GAINS},
    }
    for name, content in files.items():
        (out / name).write_text(json.dumps(content, indent=2) + "\n", encoding="utf-8")
    return out


def _recipe_matches(directory: Path, size: str, seed: int) -> bool:
    try:
        recipe = json.loads((directory / "infertune_recipe.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return bool(
        recipe
        == {"version": RECIPE_VERSION, "size": size, "seed": seed}
        | {"spec": asdict(_size(size)), "gains": GAINS}
    )


def ensure_model(size: str = "tiny", directory: Path | str | None = None, *, seed: int = 0) -> Path:
    """The checkpoint for ``(size, seed)``, generated on first use and cached afterwards.

    Defaults to ``<cache root>/<size>`` (seed 0) or ``<size>-seed<seed>``. Written into a
    temporary sibling and renamed, so concurrent callers never see a half-written model.
    """
    _size(size)
    if directory is None:
        name = size if seed == 0 else f"{size}-seed{seed}"
        directory = default_cache_root() / name
    target = Path(directory)
    if _recipe_matches(target, size, seed):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    staging.chmod(0o755)  # mkdtemp makes it private; the cache is shared with servers
    try:
        write_model(staging, size, seed=seed)
        if target.exists():
            shutil.rmtree(target)
        try:
            staging.rename(target)
        except OSError:  # another process won the race; theirs is identical
            if not _recipe_matches(target, size, seed):
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target
