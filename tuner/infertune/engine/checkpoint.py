"""Reading a local Hugging Face checkpoint directory (no hub access)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file

from infertune.engine.config import ConfigError


def safetensors_files(model_dir: Path) -> list[Path]:
    """The weight files of ``model_dir``: the sharded index's files, or every ``*.safetensors``."""
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        return [model_dir / name for name in sorted(set(weight_map.values()))]
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise ConfigError(f"no *.safetensors weights in model directory {str(model_dir)!r}")
    return files


def load_tensors(model_dir: Path | str) -> dict[str, torch.Tensor]:
    """Every tensor of the checkpoint as fp32 on CPU (quantization starts from full precision)."""
    tensors: dict[str, torch.Tensor] = {}
    for path in safetensors_files(Path(model_dir)):
        for name, tensor in load_file(str(path), device="cpu").items():
            tensors[name] = tensor.float()
    return tensors
