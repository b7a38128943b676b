"""One name for a GPU, whoever reports it.

NVML (what the tuner reads) says ``NVIDIA H100 80GB HBM3``; NVIDIA's GPU feature discovery labels
the node ``nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3`` (NVML's name with each run of spaces
made one dash, plus ``-SHARED`` under time-slicing) and ``nvidia.com/gpu.memory`` in MiB, and
``spec.hardware.gpuProducts`` is written in the label's form. :class:`GpuIdentity` is that label
form plus the memory where known (an H100 80GB PCIe and SXM share a generation but not a name, and
some products ship in two memory sizes under one name), compared case-insensitively.

Torch-free and free of the rest of the tuner: the operator imports it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

PRODUCT_LABEL = "nvidia.com/gpu.product"
MEMORY_LABEL = "nvidia.com/gpu.memory"  # MiB
_SHARED = "-SHARED"  # GFD's suffix for a time-sliced GPU: the same hardware


def product_label(name: str) -> str:
    """A GPU product name in GFD's label form: ``NVIDIA H100 80GB HBM3`` -> ``NVIDIA-H100-80GB-HBM3``."""
    text = "-".join(name.split())
    if text.upper().endswith(_SHARED):
        text = text[: -len(_SHARED)]
    return text


@dataclass(frozen=True)
class GpuIdentity:
    """A GPU product (label form) and its memory in MiB (None when unknown)."""

    product: str
    memory_mib: int | None = None

    @property
    def key(self) -> str:
        return self.product.casefold()

    @property
    def memory_gib(self) -> int | None:
        # Rounded: the same GPU reports a few MiB more or less with ECC or another driver.
        return None if self.memory_mib is None else round(self.memory_mib / 1024)

    def same_as(self, other: GpuIdentity) -> bool:
        """Same product, and the same memory size when both sides know it."""
        if self.key != other.key:
            return False
        return (
            self.memory_gib is None
            or other.memory_gib is None
            or self.memory_gib == other.memory_gib
        )

    def __str__(self) -> str:
        gib = self.memory_gib
        return self.product if gib is None else f"{self.product} ({gib} GiB)"


def gpu_identity(
    product: str | None, memory_mib: int | float | str | None = None
) -> GpuIdentity | None:
    """The identity of a product named either way (NVML or label form), or None for no product."""
    if product is None or not product.strip():
        return None
    try:
        mib = None if memory_mib in (None, "") else int(float(memory_mib))  # type: ignore[arg-type]
    except ValueError:
        mib = None
    return GpuIdentity(product_label(product), mib if mib and mib > 0 else None)


def from_nvml(name: str, memory_bytes: int | None) -> GpuIdentity | None:
    return gpu_identity(name, None if memory_bytes is None else memory_bytes // 2**20)


def from_node_labels(labels: Mapping[str, str] | None) -> GpuIdentity | None:
    """What GFD's labels on a node say it has (None on a node without them)."""
    labels = labels or {}
    return gpu_identity(labels.get(PRODUCT_LABEL), labels.get(MEMORY_LABEL))


def same_product(a: str, b: str) -> bool:
    """Whether two product names, in either spelling, name the same product."""
    return product_label(a).casefold() == product_label(b).casefold()


__all__ = [
    "MEMORY_LABEL",
    "PRODUCT_LABEL",
    "GpuIdentity",
    "from_node_labels",
    "from_nvml",
    "gpu_identity",
    "product_label",
    "same_product",
]
