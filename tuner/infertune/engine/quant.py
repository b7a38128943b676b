"""Weight-only quantized linear layers (fp32/bf16/fp16 plain, int8 per-channel, int4 group-wise).

Each layer is built once from an fp32 ``[out, in]`` weight and then only called; the packed
layouts are torch's native kernels, so no Python runs per element:

* int8: symmetric per-output-channel scales, ``torch._weight_int8pack_mm`` (CPU and CUDA).
* int4: asymmetric group-wise (scale, zero) per ``group_size`` input channels, packed with
  ``torch._convert_weight_to_int4pack_for_cpu`` / ``_weight_int4pack_mm_for_cpu`` on CPU and
  ``torch._convert_weight_to_int4pack`` / ``_weight_int4pack_mm`` (bf16 activations) on CUDA.
* fp8 (e4m3 weights, per-channel scale, dequantised per call) only where the device has fp8.
"""

from __future__ import annotations

from typing import Protocol

import torch

from infertune.engine.kernels import PANEL, Bf16PanelLinear, PanelLinear, native_kernels

PLAIN_DTYPES: dict[str, torch.dtype] = {
    "fp32": torch.float32,
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
}
INT4_GROUP_SIZES = (32, 64, 128)


class UnsupportedConfig(ValueError):  # noqa: N818 - the name is the runner contract's
    """A knob value this hardware or this build cannot run; the message names the knob."""


class Linear(Protocol):
    """``y = x @ W.T (+ b)`` for a 2-D activation ``x`` of the layer's activation dtype."""

    out_features: int

    def __call__(self, x: torch.Tensor) -> torch.Tensor: ...

    @property
    def nbytes(self) -> int: ...


def activation_dtype(quantization: str, device: str) -> torch.dtype:
    """The dtype activations (and the KV cache) use for a quantization on a device."""
    if quantization in PLAIN_DTYPES:
        return PLAIN_DTYPES[quantization]
    # bf16 activations on every device: the CUDA int4 kernel only takes bf16, and on CPU the
    # packed int8/int4 kernels are 10-100x slower with fp32 activations (a scalar fallback;
    # measured here at batch 8: int8 6.3 ms vs 0.25 ms per 1536x256 layer).
    return torch.bfloat16


class PlainLinear:
    """A plain-precision weight kept transposed, ``[in, out]``, and multiplied with ``mm``.

    Decode GEMMs have a handful of rows. For those MKL runs about twice as fast on an
    ``[in, out]`` weight as on the ``[out, in]`` one ``F.linear`` hands it (measured here, one
    thread, the tiny model's 17 weights in turn: 0.64 vs 1.32 ms at 1 row, 2.0 vs 3.2 ms at 8).
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype) -> None:
        self.weight_t = weight.to(dtype).t().contiguous()
        self.bias = None if bias is None else bias.to(dtype)
        self.out_features = int(weight.shape[0])

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.bias is None:
            return torch.mm(x, self.weight_t)
        return torch.addmm(self.bias, x, self.weight_t)

    def add_to(self, h: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """``h + self(x)`` as one ``addmm`` (bias-free layers only)."""
        assert self.bias is None
        return torch.addmm(h, x, self.weight_t)

    @property
    def nbytes(self) -> int:
        return self.weight_t.numel() * self.weight_t.element_size()


class Int8Linear:
    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype) -> None:
        w = weight.float()
        scales = w.abs().amax(dim=1).clamp(min=1e-8) / 127.0
        self.qweight = torch.round(w / scales[:, None]).clamp(-127, 127).to(torch.int8)
        self.scales = scales.to(dtype)
        self.bias = None if bias is None else bias.to(dtype)
        self.out_features = int(weight.shape[0])

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        y = torch._weight_int8pack_mm(x, self.qweight, self.scales)
        return y if self.bias is None else y + self.bias

    @property
    def nbytes(self) -> int:
        return self.qweight.numel() + self.scales.numel() * self.scales.element_size()


def int4_quantize(weight: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Asymmetric group-wise 4-bit codes in [0, 15] and torch's ``[groups, out, 2]`` qparams.

    torch's kernels dequantise as ``(q - 8) * scale + zero``, so ``zero`` is the value of the
    mid-code 8: ``zero = min + 8 * scale``.
    """
    out_f, in_f = weight.shape
    w = weight.float().reshape(out_f, in_f // group_size, group_size)
    wmin = w.amin(dim=2, keepdim=True)
    wmax = w.amax(dim=2, keepdim=True)
    scale = ((wmax - wmin) / 15.0).clamp(min=1e-8)
    q = torch.round((w - wmin) / scale).clamp(0, 15).to(torch.int32).reshape(out_f, in_f)
    zero = wmin + 8.0 * scale
    qparams = torch.cat([scale, zero], dim=2).permute(1, 0, 2).contiguous()  # [groups, out, 2]
    return q, qparams


class Int4Linear:
    def __init__(
        self,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        dtype: torch.dtype,
        group_size: int,
        device: str,
    ) -> None:
        out_f, in_f = weight.shape
        if in_f % group_size:
            raise UnsupportedConfig(
                f"int4 group_size={group_size} must divide the input width {in_f}"
            )
        q, qparams = int4_quantize(weight, group_size)
        self.cuda = device.startswith("cuda")
        if self.cuda:
            # The CUDA packer takes two codes per uint8 byte (high nibble first).
            packed_u8 = (q[:, ::2] << 4 | q[:, 1::2]).to(torch.uint8).to(device)
            self.packed = torch._convert_weight_to_int4pack(packed_u8, 8)
        else:
            self.packed = torch._convert_weight_to_int4pack_for_cpu(q, 1)
        self.qparams = qparams.to(dtype).to(device)
        self.group_size = group_size
        self.bias = None if bias is None else bias.to(dtype).to(device)
        self.out_features = int(out_f)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.cuda:
            y = torch._weight_int4pack_mm(x, self.packed, self.group_size, self.qparams)
        else:
            y = torch._weight_int4pack_mm_for_cpu(x, self.packed, self.group_size, self.qparams)
        return y if self.bias is None else y + self.bias

    @property
    def nbytes(self) -> int:
        return (
            self.packed.numel() * self.packed.element_size()
            + self.qparams.numel() * self.qparams.element_size()
        )


class Fp8Linear:
    """e4m3 weights with a per-channel scale; dequantised per call (weight-only, no fp8 GEMM)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype) -> None:
        w = weight.float()
        fmax = torch.finfo(torch.float8_e4m3fn).max
        self.scales = (w.abs().amax(dim=1, keepdim=True).clamp(min=1e-8) / fmax).to(dtype)
        self.qweight = (w / self.scales.float()).to(torch.float8_e4m3fn)
        self.bias = None if bias is None else bias.to(dtype)
        self.dtype = dtype
        self.out_features = int(weight.shape[0])

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        w = self.qweight.to(self.dtype) * self.scales
        return torch.nn.functional.linear(x, w, self.bias)

    @property
    def nbytes(self) -> int:
        return self.qweight.numel() + self.scales.numel() * self.scales.element_size()


def make_linear(
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    *,
    quantization: str,
    device: str,
    group_size: int = 64,
) -> Linear:
    """Build the linear layer for ``quantization`` on ``device`` from an fp32 ``[out, in]`` weight."""
    dtype = activation_dtype(quantization, device)
    weight = weight.to(device)
    bias = None if bias is None else bias.to(device)
    if quantization in ("fp32", "bf16") and device == "cpu" and weight.shape[0] % PANEL == 0:
        kernel = native_kernels()
        if kernel is not None and quantization == "fp32":
            return PanelLinear(weight, bias, kernel)
        if kernel is not None and weight.shape[1] % 2 == 0:
            return Bf16PanelLinear(weight, bias, kernel)
    if quantization in PLAIN_DTYPES:
        return PlainLinear(weight, bias, dtype)
    if quantization == "int8":
        return Int8Linear(weight, bias, dtype)
    if quantization == "int4":
        if group_size not in INT4_GROUP_SIZES:
            raise UnsupportedConfig(
                f"int4 group_size={group_size} is not one of {list(INT4_GROUP_SIZES)}"
            )
        return Int4Linear(weight, bias, dtype, group_size, device)
    if quantization == "fp8":
        return Fp8Linear(weight, bias, dtype)
    raise UnsupportedConfig(
        f"quantization={quantization!r} is not one of fp32, bf16, fp16, int8, int4, fp8"
    )
