"""What machine the tuner runs on: GPUs through NVML, or the CPU when NVML is absent.

Torch-free. The fingerprint keys the ceilings cache and is stored with every result, so a
configuration tuned on one GPU product is never mistaken for one measured on another.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class GpuInfo:
    index: int
    product: str
    memory_bytes: int
    sm_clock_mhz: int | None
    memory_clock_mhz: int | None
    compute_capability: str | None


@dataclass(frozen=True)
class Hardware:
    kind: str  # "gpu" or "cpu"
    product: str  # the GPU product name, or the CPU model name
    count: int  # GPUs, or usable CPU cores
    memory_bytes: int  # per GPU, or the host's RAM
    driver: str | None = None
    cuda_driver: str | None = None
    gpus: tuple[GpuInfo, ...] = ()
    nvml_error: str | None = None  # why NVML was not used (CPU fallback)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def is_gpu(self) -> bool:
        return self.kind == "gpu"

    @property
    def gpu_product(self) -> str | None:
        return self.product if self.is_gpu else None

    @property
    def device(self) -> str:
        """The torch device the built-in engine and the probes use."""
        return "cuda" if self.is_gpu else "cpu"

    def fingerprint(self) -> str:
        """Short hash of what changes the ceilings: product, count, memory, driver, CPU flags."""
        key = {
            "kind": self.kind,
            "product": self.product,
            "count": self.count,
            "memory_gib": round(self.memory_bytes / 2**30),
            "driver": self.driver,
            "flags": self.extra.get("cpu_flags_hash"),
        }
        return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]

    def describe(self) -> str:
        gib = self.memory_bytes / 2**30
        if self.is_gpu:
            return f"{self.count}x {self.product} ({gib:.0f} GiB, driver {self.driver})"
        return f"CPU {self.product} ({self.count} cores, {gib:.0f} GiB RAM)"

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["fingerprint"] = self.fingerprint()
        return out


@dataclass(frozen=True)
class GpuSpec:
    """A GPU product's datasheet figures, for planning before (or without) measuring it.

    Memory is what NVML reports as total (MiB), not the marketing size; bandwidth and dense
    (no sparsity) tensor-core FLOP/s are NVIDIA's published figures for the product.
    """

    name: str
    product: str  # the product name NVML reports
    pattern: str  # a regular expression that matches NVML product names of this GPU
    memory_bytes: int
    memory_bandwidth_gbps: float
    bf16_tflops: float
    fp32_tflops: float

    def hardware(self, count: int = 1) -> Hardware:
        """A Hardware as NVML would describe `count` of these GPUs (tests, what-if planning)."""
        return Hardware(
            kind="gpu", product=self.product, count=count, memory_bytes=self.memory_bytes
        )


_MIB = 2**20
GPU_SPECS: tuple[GpuSpec, ...] = (
    GpuSpec("H100-80GB", "NVIDIA H100 80GB HBM3", r"H100.*(HBM3|SXM)", 81559 * _MIB, 3350, 989, 67),
    GpuSpec("H100-PCIe", "NVIDIA H100 PCIe", r"H100.*PCIe", 81559 * _MIB, 2000, 756, 51),
    GpuSpec("H200-141GB", "NVIDIA H200", r"H200", 143771 * _MIB, 4800, 989, 67),
    GpuSpec("A100-80GB", "NVIDIA A100-SXM4-80GB", r"A100.*80GB", 81920 * _MIB, 2039, 312, 19.5),
    GpuSpec("L4-24GB", "NVIDIA L4", r"\bL4\b", 23034 * _MIB, 300, 121, 30.3),
)


def gpu_spec(name: str) -> GpuSpec | None:
    """The datasheet entry for a catalogue name ("L4-24GB") or an NVML product name."""
    for spec in GPU_SPECS:
        if name.lower() == spec.name.lower() or re.search(spec.pattern, name):
            return spec
    return None


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _nvml() -> tuple[Hardware | None, str | None]:
    """GPU hardware through NVML, or (None, why not)."""
    try:
        import pynvml
    except ImportError as exc:  # nvidia-ml-py is a dependency, but be robust to slim images
        return None, f"nvidia-ml-py is not installed ({exc})"
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:  # NVMLError_LibraryNotFound on machines without a driver
        return None, f"{type(exc).__name__}: {exc}"
    try:
        count = pynvml.nvmlDeviceGetCount()
        if count == 0:
            return None, "NVML found no GPU"
        gpus: list[GpuInfo] = []
        for i in range(count):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            try:
                cc: str | None = ".".join(map(str, pynvml.nvmlDeviceGetCudaComputeCapability(h)))
            except pynvml.NVMLError:
                cc = None
            gpus.append(
                GpuInfo(
                    index=i,
                    product=_text(pynvml.nvmlDeviceGetName(h)),
                    memory_bytes=int(pynvml.nvmlDeviceGetMemoryInfo(h).total),
                    sm_clock_mhz=_clock(pynvml, h, "NVML_CLOCK_SM"),
                    memory_clock_mhz=_clock(pynvml, h, "NVML_CLOCK_MEM"),
                    compute_capability=cc,
                )
            )
        driver = _text(pynvml.nvmlSystemGetDriverVersion())
        try:
            cuda = str(pynvml.nvmlSystemGetCudaDriverVersion())
        except pynvml.NVMLError:
            cuda = None
        first = gpus[0]
        return (
            Hardware(
                kind="gpu",
                product=first.product,
                count=count,
                memory_bytes=first.memory_bytes,
                driver=driver,
                cuda_driver=cuda,
                gpus=tuple(gpus),
            ),
            None,
        )
    finally:
        pynvml.nvmlShutdown()


def _clock(pynvml: Any, handle: Any, kind: str) -> int | None:
    try:
        return int(pynvml.nvmlDeviceGetMaxClockInfo(handle, getattr(pynvml, kind)))
    except pynvml.NVMLError:
        return None


def _cpu_model() -> tuple[str, str | None]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or platform.machine(), None
    model = next(
        (
            line.split(":", 1)[1].strip()
            for line in text.splitlines()
            if line.startswith("model name")
        ),
        platform.processor() or platform.machine(),
    )
    flags = next((line for line in text.splitlines() if line.startswith("flags")), "")
    return model, hashlib.sha256(flags.encode()).hexdigest()[:8] if flags else None


def _host_memory() -> int:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def cpu_hardware(why: str | None = None) -> Hardware:
    model, flags = _cpu_model()
    return Hardware(
        kind="cpu",
        product=model,
        count=usable_cpus(),
        memory_bytes=_host_memory(),
        nvml_error=why,
        extra={"cpu_flags_hash": flags, "machine": platform.machine()},
    )


def discover(*, use_gpu: bool = True) -> Hardware:
    """The GPUs NVML reports, else the CPU (and the reason NVML was not used)."""
    if not use_gpu:
        return cpu_hardware("GPU use disabled")
    hw, why = _nvml()
    return hw if hw is not None else cpu_hardware(why)
