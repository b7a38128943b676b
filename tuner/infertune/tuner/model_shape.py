"""The shape of any decoder model from `config.json` and safetensors headers alone, torch-free.

No weight is loaded and no engine of ours is needed: a safetensors file begins with an 8-byte
little-endian header length and a JSON header naming every tensor's dtype and shape, so the exact
parameter count of a checkpoint costs a few kilobytes of reads. `config.json` gives the rest:
layers, heads, KV heads (GQA), head size, sliding windows, mixture-of-experts routing, and the
rope / long-context fields (read, never required). From the shape come the parameter and KV-cache
bytes the roofline floors (roofline.py) and the memory-fit check (memory_fit.py) need.
"""

from __future__ import annotations

import json
import re
import struct
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from infertune.engine.config import DEFAULT_INT4_GROUP, DTYPE_BYTES, QUANT_BITS

# Bytes per element of each safetensors dtype (F4 and other sub-byte types count as packed bytes).
SAFETENSORS_BYTES = {
    "F64": 8, "I64": 8, "U64": 8, "F32": 4, "I32": 4, "U32": 4, "F16": 2, "BF16": 2, "I16": 2,
    "U16": 2, "I8": 1, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1,
}  # fmt: skip
_FLOAT_DTYPES = {"F64", "F32", "F16", "BF16"}
HEADER_LIMIT = 100 << 20  # the format's own bound on the JSON header
# Model types whose MLP is a plain up/down pair (no gate): two matrices, not three.
NON_GATED_MLP = {"gpt2", "gpt_neox", "gptj", "opt", "falcon", "bloom", "phi", "gpt_bigcode", "mpt"}
# Model types with four norms per layer (pre/post attention and pre/post MLP).
FOUR_NORMS = {"gemma2", "gemma3", "gemma3_text"}
# tie_word_embeddings when config.json omits it: transformers' per-model defaults.
TIED_BY_DEFAULT = {"gemma", "gemma2", "gemma3", "gemma3_text", "qwen2_moe"}
_EXPERT = re.compile(r"\.experts\.")
_EMBEDDING = (
    "embed_tokens.weight",
    "wte.weight",
    "word_embeddings.weight",
    "tok_embeddings.weight",
)


class ShapeError(ValueError):
    """A config.json or safetensors header the analytic model cannot read; names the field/file."""


@dataclass(frozen=True)
class TensorInfo:
    dtype: str
    shape: tuple[int, ...]

    @property
    def elements(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def nbytes(self) -> int:
        return self.elements * SAFETENSORS_BYTES.get(self.dtype, 1)


def read_safetensors_header(path: Path) -> dict[str, TensorInfo]:
    """Every tensor's dtype and shape, from the header only (the data is never read)."""
    with path.open("rb") as f:
        head = f.read(8)
        if len(head) != 8:
            raise ShapeError(f"{path.name}: shorter than a safetensors header")
        (length,) = struct.unpack("<Q", head)
        if length > HEADER_LIMIT:
            raise ShapeError(f"{path.name}: header length {length} exceeds {HEADER_LIMIT}")
        raw = f.read(length)
    try:
        header = json.loads(raw)
    except ValueError as exc:
        raise ShapeError(f"{path.name}: header is not JSON ({exc})") from exc
    if not isinstance(header, dict):
        raise ShapeError(f"{path.name}: header is not a JSON object")
    return {
        name: TensorInfo(str(t["dtype"]), tuple(int(d) for d in t["shape"]))
        for name, t in header.items()
        if name != "__metadata__"
    }


def read_headers(model_dir: Path) -> dict[str, TensorInfo]:
    """The union of the headers of every `*.safetensors` file in `model_dir` (sharded or not)."""
    tensors: dict[str, TensorInfo] = {}
    for path in sorted(Path(model_dir).glob("*.safetensors")):
        tensors.update(read_safetensors_header(path))
    return tensors


@dataclass(frozen=True)
class ModelShape:
    """What the cost of serving a decoder depends on. Parameters are element counts."""

    architecture: str
    model_type: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int  # the query/key head size (attention FLOPs per context token)
    vocab_size: int
    embedding_params: int  # the input table: gathered one row per token, never multiplied
    lm_head_params: int  # a separate output projection; 0 when tied to the embedding
    layer_params: int  # every decoder layer (all experts) and the final norm
    active_layer_params: int  # the same, counting only the experts one token is routed to
    kv_elements_per_token: int  # per token over all layers: K and V (or MLA's latent)
    num_experts: int = 0
    experts_per_token: int = 0
    expert_params: int = 0  # the routed experts' parameters, inside layer_params
    sliding_window: int | None = None
    sliding_layers: int = 0  # layers whose KV cache holds at most `sliding_window` tokens
    max_position_embeddings: int | None = None
    rope_theta: float | None = None
    rope_type: str | None = None
    checkpoint_dtype: str | None = None
    checkpoint_bytes: int | None = None  # the weights as stored (from the headers)
    source: str = "config.json"
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def tied(self) -> bool:
        return self.lm_head_params == 0

    @property
    def total_params(self) -> int:
        return self.embedding_params + self.lm_head_params + self.layer_params

    @property
    def active_params(self) -> int:
        return self.embedding_params + self.lm_head_params + self.active_layer_params

    @property
    def matmul_params(self) -> int:
        """Weights one token is multiplied by: its active layers and the output projection."""
        return self.active_layer_params + self.hidden_size * self.vocab_size

    def kv_bytes_per_token(self, dtype: str) -> int:
        """layers x kv_heads x head_dim x 2 (K and V) x dtype bytes (full context, every layer)."""
        return self.kv_elements_per_token * _dtype_bytes(dtype)

    def kv_bytes(self, tokens: int, dtype: str) -> int:
        """KV cache of one sequence of `tokens`: sliding-window layers hold only the window."""
        per_layer = self.kv_elements_per_token // max(self.num_layers, 1)
        windowed = min(tokens, self.sliding_window) if self.sliding_window else tokens
        full = self.num_layers - self.sliding_layers
        return per_layer * (full * tokens + self.sliding_layers * windowed) * _dtype_bytes(dtype)

    def weight_bytes(self, quantization: str) -> int:
        """Device memory of the weights at a precision: the matmul weights (layers, all experts,
        the output projection) at its width, the embedding table at 16 bits (32 for fp32)."""
        table = self.embedding_params * (4 if quantization == "fp32" else 2)
        return _quantized(self.layer_params + self.lm_head_params, quantization, self) + table

    def read_bytes(self, quantization: str, tokens: int = 1) -> int:
        """Weight bytes one step over `tokens` tokens reads: every dense weight, the output
        projection, and the experts the step's tokens are expected to be routed to (uniform
        routing: E x (1 - (1 - k/E)^tokens) distinct experts per layer)."""
        experts = self.expert_params * self.expert_share(tokens)
        dense = self.layer_params - self.expert_params + self.hidden_size * self.vocab_size
        return _quantized(int(dense + experts), quantization, self)

    def expert_share(self, tokens: int) -> float:
        """The share of the routed experts a step over `tokens` tokens touches."""
        if not self.num_experts:
            return 1.0
        return 1.0 - (1.0 - self.experts_per_token / self.num_experts) ** max(tokens, 1)

    def flops_per_token(self, context: int = 0) -> int:
        """2 FLOPs per multiplied weight, plus QK^T and AV over `context` cached tokens."""
        windowed = min(context, self.sliding_window) if self.sliding_window else context
        full = self.num_layers - self.sliding_layers
        attended = full * context + self.sliding_layers * windowed
        return 2 * self.matmul_params + 4 * self.num_heads * self.head_dim * attended

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["notes"] = list(self.notes)
        out["total_params"] = self.total_params
        out["active_params"] = self.active_params
        return out

    def describe(self) -> str:
        moe = (
            f", {self.num_experts} experts ({self.experts_per_token} active): "
            f"{self.active_params / 1e9:.2f}B active"
            if self.num_experts
            else ""
        )
        return (
            f"{self.architecture}: {self.total_params / 1e9:.2f}B parameters{moe}, "
            f"{self.num_layers} layers, {self.num_heads} heads / {self.num_kv_heads} KV heads "
            f"x {self.head_dim}, KV {self.kv_bytes_per_token('bf16') / 2**10:.0f} KiB/token "
            f"in bf16 (from {self.source})"
        )

    @classmethod
    def from_dir(cls, model_dir: Path | str) -> ModelShape:
        """The shape from `model_dir/config.json`, made exact by the safetensors headers there."""
        path = Path(model_dir) / "config.json"
        if not path.is_file():
            raise ShapeError(f"no config.json in model directory {str(model_dir)!r}")
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except ValueError as exc:
            raise ShapeError(f"{path}: not JSON ({exc})") from exc
        if not isinstance(raw, dict):
            raise ShapeError(f"{path} must hold a JSON object")
        return from_config(raw, read_headers(Path(model_dir)))


def _dtype_bytes(dtype: str) -> int:
    if dtype not in DTYPE_BYTES:
        raise ShapeError(f"dtype {dtype!r} is not one of {', '.join(sorted(DTYPE_BYTES))}")
    return DTYPE_BYTES[dtype]


def _quantized(params: int, quantization: str, shape: ModelShape) -> int:
    """Bytes of `params` matmul weights at a precision, with its scales: int8 keeps a 16-bit
    scale per output channel, int4 a 16-bit (scale, zero) pair per group of DEFAULT_INT4_GROUP."""
    if quantization not in QUANT_BITS:
        raise ShapeError(f"quantization {quantization!r} is not one of {sorted(QUANT_BITS)}")
    body = params * QUANT_BITS[quantization] // 8
    if quantization == "int8":
        body += 2 * params // max(shape.hidden_size, 1)
    elif quantization == "int4":
        body += 4 * params // DEFAULT_INT4_GROUP
    return body


def _first(raw: dict[str, Any], *keys: str) -> Any:
    return next((raw[k] for k in keys if raw.get(k) is not None), None)


def _required(raw: dict[str, Any], *keys: str) -> int:
    value = _first(raw, *keys)
    if value is None:
        raise ShapeError(f"config.json is missing {' / '.join(repr(k) for k in keys)}")
    return int(value)


def from_config(raw: dict[str, Any], tensors: dict[str, TensorInfo] | None = None) -> ModelShape:
    """The shape of a decoder from its config.json; `tensors` (headers) make the counts exact."""
    text = raw.get("text_config")
    cfg = {**raw, **text} if isinstance(text, dict) else raw  # multimodal: the language model
    archs = cfg.get("architectures") or raw.get("architectures") or ["unknown"]
    model_type = str(cfg.get("model_type") or "unknown")
    hidden = _required(cfg, "hidden_size", "n_embd", "d_model")
    layers = _required(cfg, "num_hidden_layers", "n_layer", "num_layers")
    heads = _required(cfg, "num_attention_heads", "n_head")
    vocab = _required(cfg, "vocab_size")
    kv_heads = int(_first(cfg, "num_key_value_heads", "num_kv_heads") or heads)
    if cfg.get("multi_query"):
        kv_heads = 1
    head_dim = int(cfg.get("head_dim") or hidden // heads)
    notes: list[str] = []
    attn, kv_per_layer, qk_dim = _attention(cfg, model_type, hidden, heads, kv_heads, head_dim)
    mlp_total, mlp_active, experts, moe = _mlp(cfg, model_type, hidden, layers, notes)
    norms = (4 if model_type in FOUR_NORMS else 2) * hidden
    layer_params = layers * (attn + norms) + mlp_total + hidden
    active_layer_params = layers * (attn + norms) + mlp_active + hidden
    tied_default = raw.get("tie_word_embeddings", model_type in TIED_BY_DEFAULT)
    tied = bool(cfg.get("tie_word_embeddings", tied_default))
    embedding, lm_head = vocab * hidden, 0 if tied else vocab * hidden
    window, sliding = _sliding(cfg, model_type, layers, notes)
    rope = cfg.get("rope_scaling") or cfg.get("rope_parameters") or {}
    rope = rope if isinstance(rope, dict) else {}
    rope_theta = _first(cfg, "rope_theta") or rope.get("rope_theta")
    rope_type = _first(rope, "rope_type", "type")
    shape = ModelShape(
        architecture=str(archs[0]),
        model_type=model_type,
        hidden_size=hidden,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=qk_dim,
        vocab_size=vocab,
        embedding_params=embedding,
        lm_head_params=lm_head,
        layer_params=layer_params,
        active_layer_params=active_layer_params,
        kv_elements_per_token=layers * kv_per_layer,
        num_experts=moe[0],
        experts_per_token=moe[1],
        expert_params=experts,
        sliding_window=window,
        sliding_layers=sliding,
        max_position_embeddings=_first(
            cfg, "max_position_embeddings", "n_positions", "max_seq_len"
        ),
        rope_theta=None if rope_theta is None else float(rope_theta),
        rope_type=None if rope_type in (None, "default") else str(rope_type),
        checkpoint_dtype=_first(cfg, "torch_dtype", "dtype"),
        notes=tuple(notes),
    )
    if tensors:
        shape = _exact(shape, raw, tensors)
    return shape


def _attention(
    cfg: dict[str, Any], model_type: str, hidden: int, heads: int, kv_heads: int, head_dim: int
) -> tuple[int, int, int]:
    """(parameters per layer, KV elements per token per layer, query/key head size)."""
    if cfg.get("kv_lora_rank"):  # DeepSeek-V2/V3 multi-head latent attention
        rank, rope = int(cfg["kv_lora_rank"]), int(cfg.get("qk_rope_head_dim") or 64)
        nope, v_dim = int(cfg.get("qk_nope_head_dim") or 128), int(cfg.get("v_head_dim") or 128)
        q_rank = cfg.get("q_lora_rank")
        q = hidden * heads * (nope + rope)
        if q_rank:
            q = hidden * int(q_rank) + int(q_rank) + int(q_rank) * heads * (nope + rope)
        kv = hidden * (rank + rope) + rank + rank * heads * (nope + v_dim)
        # The cache holds the latent and the shared rope key, once per token and layer.
        return q + kv + heads * v_dim * hidden, rank + rope, nope + rope
    q, kv = heads * head_dim, kv_heads * head_dim
    params = hidden * (q + 2 * kv) + q * hidden
    if cfg.get("attention_bias", model_type in ("qwen2", "qwen2_moe")) or cfg.get("bias"):
        params += q + 2 * kv
    if model_type.startswith(("qwen3", "gemma3", "olmo2")):  # per-head q/k norms
        params += 2 * head_dim
    return params, 2 * kv, head_dim


def _moe_layers(cfg: dict[str, Any], layers: int) -> list[int]:
    """The indices of the layers whose MLP is a mixture of experts."""
    if "first_k_dense_replace" in cfg or "moe_layer_freq" in cfg:  # DeepSeek
        first, freq = (
            int(cfg.get("first_k_dense_replace") or 0),
            int(cfg.get("moe_layer_freq") or 1),
        )
        return [i for i in range(layers) if i >= first and i % freq == 0]
    dense = set(cfg.get("mlp_only_layers") or [])  # Qwen-MoE
    step = int(cfg.get("decoder_sparse_step") or 1)
    return [i for i in range(layers) if i not in dense and (i + 1) % step == 0]


def _mlp(
    cfg: dict[str, Any], model_type: str, hidden: int, layers: int, notes: list[str]
) -> tuple[int, int, int, tuple[int, int]]:
    """(MLP parameters of all layers, of one token's route, of the routed experts, (E, k))."""
    mats = 2 if model_type in NON_GATED_MLP else 3
    inter = int(_first(cfg, "intermediate_size", "ffn_hidden_size", "n_inner") or 4 * hidden)
    dense = mats * hidden * inter
    experts = int(_first(cfg, "num_local_experts", "n_routed_experts", "num_experts") or 0)
    if experts <= 1:
        return layers * dense, layers * dense, 0, (0, 0)
    k = int(cfg.get("num_experts_per_tok") or cfg.get("num_experts_per_token") or 2)
    expert_inter = int(cfg.get("moe_intermediate_size") or inter)
    expert = mats * hidden * expert_inter
    shared = int(cfg.get("n_shared_experts") or 0) * expert  # DeepSeek's always-on experts
    if cfg.get("shared_expert_intermediate_size"):  # Qwen2-MoE: one shared expert and its gate
        shared = mats * hidden * int(cfg["shared_expert_intermediate_size"]) + hidden
    moe = _moe_layers(cfg, layers)
    router = hidden * experts
    n_dense = layers - len(moe)
    total = n_dense * dense + len(moe) * (experts * expert + shared + router)
    active = n_dense * dense + len(moe) * (k * expert + shared + router)
    notes.append(
        f"mixture of experts: {experts} routed, {k} per token, in {len(moe)}/{layers} layers"
    )
    return total, active, len(moe) * experts * expert, (experts, k)


def _sliding(
    cfg: dict[str, Any], model_type: str, layers: int, notes: list[str]
) -> tuple[int | None, int]:
    """(window, layers that use it). Qwen's window is off unless use_sliding_window is true."""
    window = cfg.get("sliding_window") or cfg.get("sliding_window_size")
    if not window or cfg.get("use_sliding_window") is False:
        return None, 0
    window = int(window)
    types = cfg.get("layer_types")
    if isinstance(types, list):
        sliding = sum(1 for t in types if "sliding" in str(t))
    elif model_type == "gemma2":  # even layers slide, odd layers attend globally
        sliding = (layers + 1) // 2
    elif cfg.get("sliding_window_pattern"):  # Gemma 3: every Nth layer is global
        n = int(cfg["sliding_window_pattern"])
        sliding = sum(1 for i in range(layers) if (i + 1) % n)
    else:
        sliding = layers
    if window >= int(cfg.get("max_position_embeddings") or 0) > 0:
        return None, 0  # a window no shorter than the context is no window
    notes.append(f"sliding window of {window} tokens in {sliding}/{layers} layers")
    return window, sliding


def _exact(shape: ModelShape, raw: dict[str, Any], tensors: dict[str, TensorInfo]) -> ModelShape:
    """The counts the headers give, where they are parameter counts (not packed quantized data)."""
    stored = sum(t.nbytes for t in tensors.values())
    dtypes = sorted({t.dtype for t in tensors.values()})
    packed = raw.get("quantization_config") or any(d not in _FLOAT_DTYPES for d in dtypes)
    if packed:
        note = f"pre-quantized checkpoint ({', '.join(dtypes)}): parameters from config.json"
        return _replace(shape, checkpoint_bytes=stored, source="config.json", note=note)
    embedding = sum(t.elements for n, t in tensors.items() if n.endswith(_EMBEDDING))
    lm_head = sum(t.elements for n, t in tensors.items() if n.startswith(("lm_head.", "output.")))
    experts = sum(t.elements for n, t in tensors.items() if _EXPERT.search(n))
    total = sum(t.elements for t in tensors.values())
    if embedding == 0:
        return _replace(shape, checkpoint_bytes=stored, note="no embedding table in the headers")
    layers = total - embedding - lm_head
    share = shape.experts_per_token / shape.num_experts if shape.num_experts else 1.0
    active = layers - experts + round(experts * share) if experts else layers
    counted = shape.total_params
    note = f"parameters from safetensors headers ({total / 1e9:.3f}B; config.json gave {counted / 1e9:.3f}B)"
    return ModelShape(
        **{
            **asdict(shape),
            "embedding_params": embedding,
            "lm_head_params": lm_head,
            "layer_params": layers,
            "active_layer_params": active,
            "expert_params": experts if experts else shape.expert_params,
            "checkpoint_dtype": shape.checkpoint_dtype or _dominant(tensors),
            "checkpoint_bytes": stored,
            "source": "config.json + safetensors headers",
            "notes": (*shape.notes, note),
        }
    )


def _dominant(tensors: dict[str, TensorInfo]) -> str:
    by: dict[str, int] = {}
    for t in tensors.values():
        by[t.dtype] = by.get(t.dtype, 0) + t.elements
    return max(by, key=lambda d: by[d]).lower()


def _replace(shape: ModelShape, *, note: str, **changes: Any) -> ModelShape:
    return ModelShape(**{**asdict(shape), **changes, "notes": (*shape.notes, note)})
