"""A decode-only step of every layer in one native call (``native/fused_decode.c``).

Where the step is decode rows only (the steady state of serving), the per-layer torch ops of
:meth:`LlamaModel.forward` (about 20 per layer: norms, RoPE, the KV write, attention, SiLU,
residual adds, each 2-80 us on CPU) and the GEMMs between them run as one C function over all
layers; the LM head stays a separate panel GEMM. Measured on SmolLM2-135M (30 layers) at one
sequence on this project's 2-core AVX512-BF16 host, see ``benchmarks/bench_engine.py``.

It runs for fp32 and bf16 models whose linear layers are all panel-packed and bias-free (the
native kernels are loaded), with hidden size and head size multiples of 16. Anything else (a
prefill chunk in the step, Qwen2's QKV biases, int8/int4, CUDA) keeps the torch path.
"""

from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING, cast

import torch

from infertune.engine.kernels import Bf16PanelLinear, NativeKernels, PanelLinear

if TYPE_CHECKING:
    from infertune.engine.model import BatchMeta, LlamaModel

_c_long, _ptr, _int, _float = ctypes.c_long, ctypes.c_void_p, ctypes.c_int, ctypes.c_float


class FusedDecode:
    """The fused step for one model; :meth:`make` says whether the model can take it."""

    def __init__(self, model: LlamaModel, kernel: NativeKernels) -> None:
        cfg = model.cfg
        self.model = model
        self.kernel = kernel
        self.bf = int(model.dtype == torch.bfloat16)
        self.cos = model.cos.contiguous()
        self.sin = model.sin.contiguous()
        tensors: list[torch.Tensor] = []
        for layer in model.layers:
            qkv, o, gate_up, down = (
                cast(PanelLinear | Bf16PanelLinear, lin).panels
                for lin in (layer.qkv, layer.o, layer.gate_up, layer.down)
            )
            tensors += [layer.input_norm.weight, qkv, o, layer.post_norm.weight, gate_up, down]
        self._keep = [t.contiguous() for t in tensors]
        self._weights = (ctypes.c_void_p * len(self._keep))(*[t.data_ptr() for t in self._keep])
        self._final_norm = model.final_norm.weight.contiguous()
        lib = kernel.lib
        step = lib.infertune_decode_step
        step.restype = None
        step.argtypes = [_int, _int, _c_long, _c_long, _c_long, _c_long, _c_long, _c_long]
        step.argtypes += [_c_long, _float, _float, _ptr, _ptr, _ptr, _ptr, _ptr, _ptr, _ptr]
        step.argtypes += [_ptr, _c_long, _c_long, _ptr, _c_long, _ptr, _ptr, _c_long, _ptr, _int]
        self._step = step
        size = lib.infertune_decode_scratch_bytes
        size.restype = _c_long
        size.argtypes = [_c_long] * 7
        self._scratch_bytes = size
        self._dims = (
            cfg.num_hidden_layers,
            cfg.hidden_size,
            cfg.num_attention_heads,
            cfg.num_key_value_heads,
            cfg.head_dim,
            cfg.intermediate_size,
        )

    @staticmethod
    def make(model: LlamaModel, kernel: NativeKernels | None) -> FusedDecode | None:
        cfg = model.cfg
        if kernel is None or model.device != "cpu":
            return None
        kind = {torch.float32: PanelLinear, torch.bfloat16: Bf16PanelLinear}.get(model.dtype)
        if kind is None:
            return None
        linears = [
            lin for layer in model.layers for lin in (layer.qkv, layer.o, layer.gate_up, layer.down)
        ]
        if not all(isinstance(lin, kind) and lin.bias is None for lin in linears):  # type: ignore[attr-defined]
            return None
        if cfg.hidden_size % 16 or cfg.head_dim % 16 or cfg.intermediate_size % 8:
            return None
        return FusedDecode(model, kernel)

    def hidden(
        self, token_ids: torch.Tensor, meta: BatchMeta, kv_cache: torch.Tensor
    ) -> torch.Tensor:
        """The final-normed hidden state ``[B, hidden]`` of a decode-only step, KV written."""
        layers, hidden, heads, kv_heads, head_dim, inter = self._dims
        batch = int(token_ids.shape[0])
        tables = meta.decode_block_tables
        lens = meta.decode_context_lens
        _, _, _, num_blocks, block_size, _ = kv_cache.shape
        slots = meta.slot_blocks * block_size + meta.slot_offsets
        positions = meta.positions
        longest = int(tables.shape[1]) * block_size
        # The C side trusts every shape: check what the runner's invariants do not already.
        if (
            kv_cache.dtype != self.model.dtype
            or not kv_cache.is_contiguous()
            or tables.dtype != torch.int64
            or not tables.is_contiguous()
            or tables.shape[0] != batch
            or lens.shape != (batch,)
            or lens.dtype != torch.int64
            or positions.dtype != torch.int64
            or slots.dtype != torch.int64
            or int(lens.max()) > longest
        ):
            raise ValueError(
                f"fused decode inputs do not fit: cache {kv_cache.dtype} {list(kv_cache.shape)}, "
                f"tables {list(tables.shape)}, lens {lens.tolist()}"
            )
        lens, positions, slots = lens.contiguous(), positions.contiguous(), slots.contiguous()
        h = self.model.embed[token_ids].contiguous()
        out = torch.empty_like(h)
        scratch = torch.empty(
            self._scratch_bytes(batch, hidden, heads, kv_heads, head_dim, inter, longest),
            dtype=torch.uint8,
        )
        parallel = int(batch >= 4 and torch.get_num_threads() > 1)
        self._step(
            self.bf, self.kernel.bf16_isa, layers, batch, hidden, heads, kv_heads, head_dim,
            inter, self.model.cfg.rms_norm_eps, self.model.scale, self._weights,
            self._final_norm.data_ptr(), h.data_ptr(), out.data_ptr(), positions.data_ptr(),
            self.cos.data_ptr(), self.sin.data_ptr(), kv_cache.data_ptr(), num_blocks,
            block_size, tables.data_ptr(), tables.stride(0), lens.data_ptr(), slots.data_ptr(),
            longest, scratch.data_ptr(), parallel,
        )  # fmt: skip
        return out
