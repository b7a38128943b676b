"""Measure the device's two ceilings — memory bandwidth and matmul FLOP/s per dtype — once per machine.

Timing discipline: warm up, discard the first iteration, synchronise before reading the clock, and
keep the best of several repeats (the ceiling is what the device can do, not the average under
other load). Results are cached under ~/.cache/infertune/ceilings/<fingerprint>.json.
"""

from __future__ import annotations

import functools
import json
import os
import time
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from pathlib import Path

import torch

from infertune.tuner.hardware import Hardware
from infertune.tuner.roofline import Ceilings

_TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def cache_dir() -> Path:
    root = os.environ.get("INFERTUNE_CACHE") or str(Path.home() / ".cache/infertune")
    return Path(root) / "ceilings"


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _best_seconds(
    fn: Callable[[], object], device: str, repeats: int, min_total: float = 0.5
) -> float:
    """Best time of at least `repeats` calls, repeating until `min_total` seconds have passed:
    on a shared machine, enough attempts that one of them runs undisturbed."""
    fn()  # warm-up / first-call allocation and kernel selection
    _sync(device)
    best = float("inf")
    began = time.perf_counter()
    done = 0
    while done < repeats or (time.perf_counter() - began < min_total and done < 50 * repeats):
        done += 1
        start = time.perf_counter()
        fn()
        _sync(device)
        best = min(best, time.perf_counter() - start)
    return best


def measure_bandwidth(device: str, nbytes: int) -> float:
    """GB/s of a large copy, counting bytes read and bytes written."""
    n = nbytes // 4
    src = torch.ones(n, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    seconds = _best_seconds(lambda: dst.copy_(src), device, repeats=8)
    return 2 * n * 4 / seconds / 1e9


def measure_matmul(device: str, dtype: str, n_max: int, min_seconds: float = 0.05) -> float:
    """FLOP/s of the largest n x n x n matmul in `dtype` up to `n_max` worth timing.

    The size grows from 256 until one matmul takes `min_seconds`: a dtype the CPU only emulates
    (fp16 is ~100x slower than fp32 there) is measured in seconds, not minutes.
    """
    n = 256
    while True:
        a = torch.randn(n, n, device=device).to(_TORCH_DTYPES[dtype])
        b = torch.randn(n, n, device=device).to(_TORCH_DTYPES[dtype])
        out = torch.empty(n, n, device=device, dtype=_TORCH_DTYPES[dtype])
        seconds = _best_seconds(functools.partial(torch.mm, a, b, out=out), device, repeats=3)
        if seconds >= min_seconds or n * 2 > n_max:
            return 2 * n**3 / seconds
        n *= 2


def measure_launch_overhead(device: str, ops: int = 2000) -> float:
    """Microseconds per tiny operator: what a launch-bound step pays per kernel."""
    x = torch.zeros(1, device=device)
    y = torch.zeros(1, device=device)

    def run() -> None:
        for _ in range(ops):
            torch.add(x, 1.0, out=y)

    return _best_seconds(run, device, repeats=3) / ops * 1e6


def measure(hardware: Hardware, dtypes: Iterable[str], *, quick: bool = False) -> Ceilings:
    device = hardware.device
    gpu = hardware.is_gpu
    # Sizes well beyond the last-level cache (CPU) / L2 (GPU), small enough to take seconds.
    nbytes = (1 << 30) if gpu else (64 << 20 if quick else 256 << 20)
    n = 8192 if gpu else (384 if quick else 1024)
    flops: dict[str, float] = {}
    for dtype in sorted(set(dtypes) & set(_TORCH_DTYPES)) or ["fp32"]:
        flops[dtype] = measure_matmul(device, dtype, n)
    return Ceilings(
        device=device,
        hardware=hardware.describe(),
        fingerprint=hardware.fingerprint(),
        memory_bandwidth_gbps=measure_bandwidth(device, nbytes),
        peak_flops=flops,
        launch_overhead_us=measure_launch_overhead(device, 300 if quick else 2000),
        measured_at=datetime.now(UTC).isoformat(timespec="seconds"),
    )


def load_or_measure(
    hardware: Hardware, dtypes: Iterable[str], *, directory: Path | None = None, quick: bool = False
) -> Ceilings:
    """Cached ceilings for this hardware fingerprint, measuring any dtype not yet measured."""
    wanted = set(dtypes) & set(_TORCH_DTYPES) or {"fp32"}
    path = (directory or cache_dir()) / f"{hardware.fingerprint()}.json"
    if path.exists():
        try:
            cached = Ceilings.from_dict(json.loads(path.read_text()))
            if wanted <= set(cached.peak_flops):
                return cached
        except (ValueError, KeyError, TypeError):
            pass  # a corrupt or older cache file is simply re-measured
    fresh = measure(hardware, wanted, quick=quick)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(fresh.to_dict(), indent=2))
    tmp.replace(path)
    return fresh
