from __future__ import annotations

import pytest

from infertune.tuner.hardware import GpuInfo, Hardware


@pytest.fixture
def cpu() -> Hardware:
    return Hardware(kind="cpu", product="Test CPU", count=2, memory_bytes=8 << 30)


@pytest.fixture
def gpu() -> Hardware:
    info = GpuInfo(0, "NVIDIA H100 80GB HBM3", 80 << 30, 1980, 2619, "9.0")
    return Hardware(
        kind="gpu", product=info.product, count=1, memory_bytes=info.memory_bytes,
        driver="550.54", gpus=(info,),
    )  # fmt: skip
