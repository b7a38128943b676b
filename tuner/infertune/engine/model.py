"""The Llama-family forward pass over a flattened batch of tokens from many sequences.

One engine step runs every linear layer once for all tokens of all sequences (one GEMM per
layer), so decode throughput scales with batch size. Attention is the only per-sequence part:

* decode rows (one new token each) are batched: their KV blocks are gathered from the paged
  cache with one ``index_select`` per layer straight into ``[kv_heads * B, L, head_dim]`` and
  attended with two ``bmm`` calls and a length mask (measured ~3x faster than SDPA with a mask
  at batch 32 on CPU, and 3x faster again than advanced indexing + a transpose copy);
* prefill chunks run one SDPA each with a causal mask over cached + new positions.

For fp32 on x86 CPUs with AVX2 the linear layers and the decode attention run on the native
kernels of :mod:`infertune.engine.kernels` (panel-packed weights; attention reading K/V in place
through the block tables, no gather); the torch ops below are the path everywhere else.

The KV cache is ``[layers, 2, kv_heads, blocks, block_size, head_dim]``: head-major across
blocks, so a gathered block list is already the contiguous ``[L, head_dim]`` matrix each
(head, sequence) pair multiplies with, and no copy is needed between the gather and the GEMMs.

Per layer the step is kept to few, fused ops (the tiny models are dominated by op overhead on
CPU): fused ``rms_norm`` in fp32, RoPE as ``addcmul(x * cos, roll(x), signed_sin)``, K and V
written with one ``index_copy_`` into flat slots computed once per step, and the residual adds
folded into the output GEMMs (``addmm``) for unquantized weights.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import torch
import torch.nn.functional as F

from infertune.engine.config import LlamaConfig
from infertune.engine.fused import FusedDecode
from infertune.engine.kernels import NativeKernels, PanelLinear, native_kernels
from infertune.engine.quant import Linear, PlainLinear, activation_dtype, make_linear


@dataclass
class PrefillChunk:
    row_start: int  # first row of this chunk in the flattened batch
    num_tokens: int
    start_pos: int  # absolute position of the chunk's first token
    block_table: torch.Tensor  # [blocks covering start_pos + num_tokens] int64


@dataclass
class BatchMeta:
    """Where each flattened token goes; decode rows come first (rows ``[0, num_decode)``)."""

    positions: torch.Tensor  # [T] int64
    slot_blocks: torch.Tensor  # [T] physical block of each token's KV slot
    slot_offsets: torch.Tensor  # [T] offset inside that block
    num_decode: int
    decode_block_tables: torch.Tensor  # [num_decode, max_blocks] int64, padded with block 0
    decode_context_lens: torch.Tensor  # [num_decode] int64, tokens cached incl. the new one
    prefills: list[PrefillChunk]
    sample_rows: torch.Tensor  # [S] rows whose next-token logits are wanted


@dataclass
class LayerWeights:
    input_norm: RMSNorm
    qkv: Linear  # q, k and v fused into one GEMM
    o: Linear
    post_norm: RMSNorm
    gate_up: Linear  # gate and up fused into one GEMM
    down: Linear


class RMSNorm:
    def __init__(self, weight: torch.Tensor, eps: float) -> None:
        self.weight, self.eps = weight, eps
        width = weight.shape[-1]
        # fp32: x / sqrt(mean(x^2) + eps) * w = x / hypot(|x|, sqrt(width * eps)) * (w sqrt(width))
        # in four ops, half the time of F.rms_norm's composite at decode sizes (20 vs 40 us at
        # 8 rows here) and within 2e-6 of it.
        self.scaled_weight = weight * width**0.5
        self.floor = torch.tensor((width * eps) ** 0.5, dtype=weight.dtype, device=weight.device)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32:
            norm = torch.linalg.vector_norm(x, dim=-1, keepdim=True)
            return torch.div(x, torch.hypot(norm, self.floor)).mul_(self.scaled_weight)
        # Computed in fp32 and cast back before the weight, as transformers does, so bf16/fp16
        # round exactly where the reference rounds.
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


def apply_rope(
    x: torch.Tensor,
    cos: torch.Tensor,
    signed_sin: torch.Tensor,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``x * cos + rotate_half(x) * sin`` in three ops (into ``out``, which may be ``x``).

    ``rotate_half(x) = cat(-x2, x1)`` equals ``roll(x, half) * [-1, 1]``, and the sign is
    folded into ``signed_sin = cat(-sin1, sin2)`` once at load time (exact: a sign flip).
    Both operands of the ``addcmul`` are temporaries, so writing over ``x`` is safe.
    Below fp32 the product with sin is rounded on its own before the sum, as transformers
    rounds it (``addcmul`` would round once), so bf16 K/V match transformers' bf16 ones.
    """
    rotated = x.roll(x.shape[-1] // 2, -1)
    if x.dtype == torch.float32:
        return torch.addcmul(x * cos, rotated, signed_sin, out=out)
    return torch.add(x * cos, rotated.mul_(signed_sin), out=out)


def add_linear(h: torch.Tensor, lin: Linear, x: torch.Tensor, fused: bool) -> torch.Tensor:
    """``h + lin(x)``; one fused GEMM when ``fused`` (``lin`` is a bias-free fp32 layer)."""
    if fused:
        return cast(PlainLinear | PanelLinear, lin).add_to(h, x)
    return h + lin(x)


class LlamaModel:
    """Weights on ``device`` in the layout and precision of ``quantization``."""

    def __init__(
        self,
        cfg: LlamaConfig,
        tensors: dict[str, torch.Tensor],
        *,
        quantization: str = "fp32",
        device: str = "cpu",
        group_size: int = 64,
    ) -> None:
        self.cfg = cfg
        self.device = device
        self.dtype = activation_dtype(quantization, device)

        def lin(names: list[str], prefix: str) -> Linear:
            weight = torch.cat([tensors[f"{prefix}.{n}.weight"] for n in names], dim=0)
            biases = [tensors.get(f"{prefix}.{n}.bias") for n in names]
            bias = None if any(b is None for b in biases) else torch.cat(biases)  # type: ignore[arg-type]
            return make_linear(
                weight, bias, quantization=quantization, device=device, group_size=group_size
            )

        def norm(name: str) -> RMSNorm:
            return RMSNorm(tensors[name].to(device=device, dtype=self.dtype), cfg.rms_norm_eps)

        self.embed = tensors["model.embed_tokens.weight"].to(device=device, dtype=self.dtype)
        self.layers: list[LayerWeights] = []
        for i in range(cfg.num_hidden_layers):
            p = f"model.layers.{i}"
            self.layers.append(
                LayerWeights(
                    input_norm=norm(f"{p}.input_layernorm.weight"),
                    qkv=lin(["q_proj", "k_proj", "v_proj"], f"{p}.self_attn"),
                    o=lin(["o_proj"], f"{p}.self_attn"),
                    post_norm=norm(f"{p}.post_attention_layernorm.weight"),
                    gate_up=lin(["gate_proj", "up_proj"], f"{p}.mlp"),
                    down=lin(["down_proj"], f"{p}.mlp"),
                )
            )
        self.final_norm = norm("model.norm.weight")
        head_name = "model.embed_tokens" if cfg.tie_word_embeddings else "lm_head"
        if f"{head_name}.weight" not in tensors:
            head_name = "model.embed_tokens"  # some checkpoints tie without saying so
        self.lm_head = make_linear(
            tensors[f"{head_name}.weight"],
            None,
            quantization=quantization,
            device=device,
            group_size=group_size,
        )
        inv_freq = 1.0 / (
            cfg.rope_theta
            ** (torch.arange(0, cfg.head_dim, 2, dtype=torch.int64).float() / cfg.head_dim)
        )
        freqs = torch.outer(torch.arange(cfg.max_position_embeddings).float(), inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.cos = emb.cos().to(device=device, dtype=self.dtype)
        self.sin = emb.sin().to(device=device, dtype=self.dtype)
        half = cfg.head_dim // 2
        self.signed_sin = torch.cat((-self.sin[:, :half], self.sin[:, half:]), dim=-1)
        # Residual adds fold into the o/down GEMMs (addmm) for plain fp32 weights only: in
        # bf16/fp16 transformers rounds the GEMM output before the add, and so must we.
        self.fused_residual = self.dtype == torch.float32 and all(
            isinstance(lin, PlainLinear | PanelLinear) and lin.bias is None
            for layer in self.layers
            for lin in (layer.o, layer.down)
        )
        self.scale = cfg.head_dim**-0.5
        # CPUs without native bf16 matmul (AVX2) run a bf16 bmm as a loop of per-batch GEMMs:
        # it was a third of an int4 batch-8 decode step at 144 cached tokens here. The int8/int4
        # modes (bf16 activations only because their packed kernels want them) upcast the
        # gathered K/V and attend in fp32 instead: c=8 through HTTP 541 -> 791 tok/s (int4).
        # Plain bf16/fp16 keep low-precision attention, rounding where transformers rounds.
        self.decode_attention_fp32 = quantization in ("int8", "int4") and device == "cpu"
        # fp32 on CPU: decode attention reads K/V in place through the block tables (kernels.py)
        # instead of gathering a copy first.
        self.native: NativeKernels | None = None
        if self.dtype == torch.float32 and device == "cpu" and cfg.head_dim % 8 == 0:
            self.native = native_kernels()
        # fp32/bf16 on CPU with the native kernels: a decode-only step is one native call over
        # every layer (fused.py); mixed and prefill steps keep the ops below.
        self.fused = FusedDecode.make(self, native_kernels()) if device == "cpu" else None

    @property
    def weight_bytes(self) -> int:
        norm = self.final_norm.weight
        total = self.lm_head.nbytes + norm.numel() * norm.element_size()
        for layer in self.layers:
            total += layer.qkv.nbytes + layer.o.nbytes + layer.gate_up.nbytes + layer.down.nbytes
            for w in (layer.input_norm.weight, layer.post_norm.weight):
                total += w.numel() * w.element_size()
        return total

    def allocate_kv_cache(self, num_blocks: int, block_size: int) -> torch.Tensor:
        cfg = self.cfg
        shape = (
            cfg.num_hidden_layers,
            2,
            cfg.num_key_value_heads,
            num_blocks,
            block_size,
            cfg.head_dim,
        )
        return torch.zeros(shape, dtype=self.dtype, device=self.device)

    def forward(
        self, token_ids: torch.Tensor, meta: BatchMeta, kv_cache: torch.Tensor
    ) -> torch.Tensor:
        """Logits (fp32, ``[len(sample_rows), vocab]``) after writing every token's KV."""
        cfg = self.cfg
        nq, nkv, hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        num_tokens = token_ids.shape[0]
        if (
            self.fused is not None
            and meta.num_decode == num_tokens
            and not meta.prefills
            and meta.sample_rows.shape[0] == num_tokens
        ):
            return self.lm_head(self.fused.hidden(token_ids, meta, kv_cache)).float()
        num_blocks, block_size = kv_cache.shape[3], kv_cache.shape[4]
        h = self.embed[token_ids]
        cos = self.cos[meta.positions].unsqueeze(1)  # [T, 1, hd]
        sin = self.signed_sin[meta.positions].unsqueeze(1)
        slots = meta.slot_blocks * block_size + meta.slot_offsets  # flat KV slot per token
        decode = self._decode_setup(meta, num_blocks, block_size)
        fused = self.fused_residual
        for li, layer in enumerate(self.layers):
            x = layer.input_norm(h)
            qkv = layer.qkv(x)  # a fresh tensor: RoPE may write into it
            # RoPE on q and k together, in place: one pass over [T, q_heads + kv_heads, head_dim].
            qk = qkv[:, : cfg.q_size + cfg.kv_size].view(num_tokens, nq + nkv, hd)
            apply_rope(qk, cos, sin, out=qk)
            q = qk[:, :nq]
            kv = qkv[:, cfg.q_size :].view(num_tokens, 2, nkv, hd)  # rotated K, then V
            k, v = kv.unbind(1)
            layer_cache = kv_cache[li]  # [2, kv_heads, blocks, block_size, head_dim]
            # K and V of every token into its slot with one index_copy_ of [2, kv, T, hd].
            layer_cache.view(2, nkv, num_blocks * block_size, hd).index_copy_(
                2, slots, kv.permute(1, 2, 0, 3)
            )
            if meta.num_decode and not meta.prefills:
                attn = self._decode_attention(q, layer_cache, decode)
            else:
                attn = torch.empty_like(q)
                if meta.num_decode:
                    nd = meta.num_decode
                    attn[:nd] = self._decode_attention(q[:nd], layer_cache, decode)
                for chunk in meta.prefills:
                    rows = slice(chunk.row_start, chunk.row_start + chunk.num_tokens)
                    attn[rows] = self._prefill_attention(
                        q[rows], k[rows], v[rows], chunk, layer_cache
                    )
            attn = attn.reshape(num_tokens, cfg.q_size)
            h = add_linear(h, layer.o, attn, fused)
            x = layer.post_norm(h)
            gate, up = layer.gate_up(x).chunk(2, dim=-1)
            act = F.silu(gate) * up
            h = add_linear(h, layer.down, act, fused)
        # Decode-only steps sample every row, in order: no gather needed.
        sampled = h if meta.sample_rows.shape[0] == num_tokens else h[meta.sample_rows]
        last = self.final_norm(sampled)
        return self.lm_head(last).float()

    def _decode_setup(
        self, meta: BatchMeta, num_blocks: int, block_size: int
    ) -> _DecodeSetup | _NativeDecode | None:
        """Per-step decode data shared by every layer: flat block ids and the length mask."""
        nd = meta.num_decode
        if not nd:
            return None
        if self.native is not None:  # the kernel walks the block tables itself
            return _NativeDecode(meta.decode_block_tables, meta.decode_context_lens)
        nkv = self.cfg.num_key_value_heads
        tables = meta.decode_block_tables
        span = tables.shape[1] * block_size
        cols = torch.arange(span, device=tables.device)
        pad = cols[None, :] >= meta.decode_context_lens[:, None]  # [B, L]
        bias = torch.zeros(pad.shape, dtype=torch.float32, device=pad.device)
        bias.masked_fill_(pad, float("-inf"))
        # Batch order of the attention GEMMs is (sequence, kv_head): q's own row order, so
        # neither q nor the output needs a transposing copy.
        bias = bias.unsqueeze(1).expand(nd, nkv, span).reshape(nd * nkv, 1, span)
        # Row ids into a layer's cache viewed as [2 * kv_heads * blocks, block_size * head_dim],
        # ordered (k/v, sequence, kv_head, block): a gather along dim 0 copies whole contiguous
        # rows (measured 2x faster than index_select along the block dim of the 4-D view).
        planes = torch.arange(2 * nkv, device=tables.device).view(2, 1, nkv, 1) * num_blocks
        rows = (planes + tables.view(1, nd, 1, -1)).reshape(-1)
        return _DecodeSetup(nd, rows, span, bias)

    def _decode_attention(
        self,
        q: torch.Tensor,
        layer_cache: torch.Tensor,
        setup: _DecodeSetup | _NativeDecode | None,
    ) -> torch.Tensor:
        if isinstance(setup, _NativeDecode):
            assert self.native is not None
            return self.native.decode_attention(
                q, layer_cache, setup.block_tables, setup.context_lens, self.scale
            )
        assert setup is not None
        cfg = self.cfg
        nb, span = setup.num_decode, setup.span
        nkv, hd = cfg.num_key_value_heads, cfg.head_dim
        group = cfg.num_attention_heads // nkv
        _, _, num_blocks, block_size, _ = layer_cache.shape
        # One gather for keys and values of every (sequence, kv head):
        # rows of [bs * hd] -> [2, B * kv, M * bs, hd] = [2, B * kv, L, hd] without a copy.
        flat = layer_cache.view(2 * nkv * num_blocks, block_size * hd)
        kv = torch.index_select(flat, 0, setup.cache_rows).view(2, nb * nkv, span, hd)
        qg = q.reshape(nb * nkv, group, hd)  # query heads are grouped by their kv head
        if self.decode_attention_fp32:  # int8/int4 on CPU: the fp32 path, cast back at the end
            kv, qg = kv.float(), qg.float()
        keys, values = kv.unbind(0)
        if qg.dtype == torch.float32:  # scale, mask and scores in one GEMM
            scores = torch.baddbmm(setup.bias, qg, keys.transpose(1, 2), alpha=self.scale)
        else:  # low precision GEMM, then fp32 softmax as transformers does
            scores = torch.bmm(qg, keys.transpose(1, 2)).float() * self.scale + setup.bias
        probs = torch.softmax(scores, dim=-1).to(qg.dtype)
        out = torch.bmm(probs, values).to(q.dtype)  # [B * kv, group, hd]
        return out.view(nb, cfg.num_attention_heads, hd)

    def _prefill_attention(
        self,
        q: torch.Tensor,
        k_new: torch.Tensor,
        v_new: torch.Tensor,
        chunk: PrefillChunk,
        layer_cache: torch.Tensor,
    ) -> torch.Tensor:
        n, s = chunk.num_tokens, chunk.start_pos
        qh = q.transpose(0, 1).unsqueeze(0)  # [1, heads, n, hd]
        if s == 0:  # nothing cached before this chunk: attend over the fresh keys directly
            kh = k_new.transpose(0, 1).unsqueeze(0)
            vh = v_new.transpose(0, 1).unsqueeze(0)
            out = F.scaled_dot_product_attention(qh, kh, vh, is_causal=True, enable_gqa=True)
        else:
            total = s + n
            _, nkv, _, _, hd = layer_cache.shape
            # [2, kv, blocks, bs, hd] -> this chunk's blocks, flattened to [2, kv, positions, hd].
            kv = torch.index_select(layer_cache, 2, chunk.block_table)
            kv = kv.view(2, nkv, -1, hd)[:, :, :total]
            rows = torch.arange(n, device=q.device)[:, None] + s
            cols = torch.arange(total, device=q.device)[None, :]
            out = F.scaled_dot_product_attention(
                qh, kv[0].unsqueeze(0), kv[1].unsqueeze(0), attn_mask=cols <= rows, enable_gqa=True
            )
        return out.squeeze(0).transpose(0, 1)


@dataclass
class _NativeDecode:
    block_tables: torch.Tensor  # [B, max_blocks] int64
    context_lens: torch.Tensor  # [B] int64


@dataclass
class _DecodeSetup:
    num_decode: int
    cache_rows: torch.Tensor  # [2 * kv_heads * B * max_blocks] rows of the flat layer cache
    span: int  # max_blocks * block_size positions per row
    bias: torch.Tensor  # [kv_heads * B, 1, span] additive mask (0 or -inf)
