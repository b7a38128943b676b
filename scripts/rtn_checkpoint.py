"""What make_rtn_awq.py and make_rtn_w8a8.py share: a Hugging Face checkpoint rewritten with every
``*_proj`` weight replaced by its quantized tensors and everything else (embeddings, the tied LM
head, norms) in bf16, the quantization config added to config.json, the other files copied."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file


def write_checkpoint(
    model: Path,
    out: Path,
    quantize: Callable[[torch.Tensor], dict[str, torch.Tensor]],
    quantization_config: dict[str, Any],
) -> None:
    """`quantize` maps one 2-D ``*_proj`` weight to its tensors by suffix: ``qweight`` becomes
    ``<layer>.qweight`` next to the layer's other tensors."""
    out.mkdir(parents=True, exist_ok=True)
    tensors: dict[str, torch.Tensor] = {}
    for name, w in load_file(model / "model.safetensors").items():
        if name.endswith("_proj.weight") and w.ndim == 2:
            base = name.removesuffix(".weight")
            for part, t in quantize(w).items():
                tensors[f"{base}.{part}"] = t
        else:
            tensors[name] = w.to(torch.bfloat16).contiguous()
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
    cfg = json.loads((model / "config.json").read_text())
    cfg["torch_dtype"] = "bfloat16"
    cfg["quantization_config"] = quantization_config
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    for f in model.iterdir():
        if f.is_file() and f.name not in ("config.json", "model.safetensors"):
            shutil.copy(f, out / f.name)
    print(f"wrote {out}")
