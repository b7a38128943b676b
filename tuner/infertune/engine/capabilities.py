"""What the built-in engine can run on this machine; the tuner filters its search space by it.

The knob tables are plain data (torch-free); the hardware facts come from small probe functions
that import torch lazily, so a caller that only wants the static tables never loads torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache

ALL_QUANTIZATIONS = ("fp32", "bf16", "fp16", "int8", "int4", "fp8")
KV_BLOCK_SIZES = (8, 16, 32, 64, 128)
INT4_GROUP_SIZES = (32, 64, 128)


@dataclass(frozen=True)
class Capabilities:
    """Supported knob values, with a reason for every unsupported one."""

    device: str
    device_name: str
    quantizations: tuple[str, ...]
    cuda_graph: bool
    kv_block_sizes: tuple[int, ...] = KV_BLOCK_SIZES
    int4_group_sizes: tuple[int, ...] = INT4_GROUP_SIZES
    unsupported: dict[str, str] = field(default_factory=dict)  # "knob=value" -> why

    def supports(self, knob: str, value: object) -> bool:
        if knob == "quantization":
            return value in self.quantizations
        if knob == "cuda_graph":
            return value is False or (value is True and self.cuda_graph)
        if knob == "kv_block_size":
            return value in self.kv_block_sizes
        return True

    def to_dict(self) -> dict[str, object]:
        return {
            "device": self.device,
            "device_name": self.device_name,
            "quantization": list(self.quantizations),
            "cuda_graph": [False, True] if self.cuda_graph else [False],
            "kv_block_size": list(self.kv_block_sizes),
            "int4_group_size": list(self.int4_group_sizes),
            "unsupported": dict(self.unsupported),
        }


def _probe_cuda() -> tuple[bool, str, tuple[int, int]]:
    import torch

    if not torch.cuda.is_available():
        return False, "", (0, 0)
    major, minor = torch.cuda.get_device_capability(0)
    return True, torch.cuda.get_device_name(0), (major, minor)


def _probe_kernel(quantization: str, device: str) -> str | None:
    """Run the quantized kernel once on a small matrix; the error text if it fails."""
    import torch

    from infertune.engine.quant import activation_dtype, make_linear

    try:
        weight = torch.randn(128, 128)
        layer = make_linear(weight, None, quantization=quantization, device=device, group_size=64)
        x = torch.randn(2, 128, device=device, dtype=activation_dtype(quantization, device))
        y = layer(x)
        if not bool(torch.isfinite(y).all()):
            return "the kernel returned non-finite values"
    except (RuntimeError, NotImplementedError, ValueError, TypeError, AttributeError) as exc:
        return f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
    return None


@cache
def capabilities(device: str | None = None) -> Capabilities:
    """Probe once per process: CUDA if present (or ``device``), else the CPU."""
    has_cuda, name, (major, minor) = _probe_cuda()
    if device is None:
        device = "cuda" if has_cuda else "cpu"
    unsupported: dict[str, str] = {}
    if device.startswith("cuda") and not has_cuda:
        raise ValueError(f"device={device!r} requested but torch sees no CUDA device")
    if not device.startswith("cuda"):
        unsupported["cuda_graph=True"] = "CUDA Graphs need a CUDA device; this machine has none"
        name = "cpu"
    if device.startswith("cuda") and (major, minor) < (8, 9):
        unsupported["quantization=fp8"] = (
            f"fp8 needs compute capability >= 8.9; {name} has {major}.{minor}"
        )
    elif not device.startswith("cuda"):
        unsupported["quantization=fp8"] = "fp8 weights need a GPU with fp8 support (sm_89+)"
    quants: list[str] = []
    for quant in ALL_QUANTIZATIONS:
        if f"quantization={quant}" in unsupported:
            continue
        error = _probe_kernel(quant, device)
        if error is None:
            quants.append(quant)
        else:
            unsupported[f"quantization={quant}"] = error
    return Capabilities(
        device=device,
        device_name=name,
        quantizations=tuple(quants),
        cuda_graph=device.startswith("cuda"),
        unsupported=unsupported,
    )
