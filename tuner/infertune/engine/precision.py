"""``--quantization auto``: the plain precision that decodes fastest on this host, measured.

Which of fp32 and bf16 decodes faster depends on the CPU and on the kernels this build has:
with native AVX512-BF16 GEMMs bf16 reads half the bytes and wins (SmolLM2-135M here: 12 vs 25
ms per token); on an AVX2-only CPU bf16 is widened to fp32 on the fly and the race is close;
torch's own bf16 ``mm`` was 2.7x slower than fp32 on this project's host before the native
kernels. So the engine does not assume: it times the engine's own linear layers for both on
decode-shaped products (1 and 8 rows, weights larger than the last-level cache, as a model's
are), once per host and kernel build, and keeps the answer under
``~/.cache/infertune/precision/<fingerprint>.json`` (``$INFERTUNE_CACHE`` moves it).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import time
from pathlib import Path

import torch

from infertune.engine import kernels
from infertune.engine.quant import make_linear

log = logging.getLogger(__name__)

CANDIDATES = ("fp32", "bf16")
# Three [4096, 2048] layers: 100 MB in fp32, 50 MB in bf16, beyond a 32 MB L3 either way.
SHAPE = (4096, 2048)
LAYERS = 3
ROWS = (1, 8)
REPEATS = 3
VERSION = 1


def fastest(device: str) -> str:
    """The faster of fp32 and bf16 on ``device``: cached, else measured now (~1 s)."""
    path = _cache_dir() / f"{fingerprint(device)}.json"
    try:
        record = json.loads(path.read_text())
        if record.get("version") == VERSION and record.get("fastest") in CANDIDATES:
            return str(record["fastest"])
    except (OSError, ValueError):
        pass
    timings = measure(device)
    best = min(timings, key=lambda q: timings[q])
    record = {
        "version": VERSION,
        "device": device,
        "fastest": best,
        "ms_per_pass": {q: round(t * 1e3, 3) for q, t in timings.items()},
        "workload": f"{LAYERS} layers of {SHAPE[0]}x{SHAPE[1]} at rows {list(ROWS)}",
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(record, indent=2) + "\n")
        os.replace(tmp, path)
    except OSError as exc:  # a read-only home: measured again next start, nothing fails
        log.warning("precision choice not cached (%s): %s", path, exc)
    log.info("quantization auto: %s (%s)", best, record["ms_per_pass"])
    return best


def measure(device: str) -> dict[str, float]:
    """Seconds per pass over the layers (summed over ``ROWS``), best of ``REPEATS``, each
    precision through the engine's own linear layers (native kernels where they run)."""
    # Constant values: the time of a product does not depend on them, and randn of 25M
    # numbers would take longer than the measurement itself.
    weights = [torch.full(SHAPE, 0.01 * (i + 1)) for i in range(LAYERS)]
    out: dict[str, float] = {}
    for quantization in CANDIDATES:
        layers = [make_linear(w, None, quantization=quantization, device=device) for w in weights]
        dtype = torch.float32 if quantization == "fp32" else torch.bfloat16
        total = 0.0
        for rows in ROWS:
            x = torch.full((rows, SHAPE[1]), 0.5, device=device, dtype=dtype)
            best = float("inf")
            for _ in range(REPEATS + 1):  # the first pass warms caches and allocators
                _sync(device)
                start = time.perf_counter()
                for layer in layers:
                    layer(x)
                _sync(device)
                best = min(best, time.perf_counter() - start)
            total += best
        out[quantization] = total
        del layers
    return out


def fingerprint(device: str) -> str:
    """Host, device, thread count and kernel build: any of them new measures again."""
    parts = [platform.machine(), _cpu_model(), torch.__version__, kernels.library_name(), device]
    parts.append(f"threads={torch.get_num_threads()}")
    parts += sorted(kernels.cpu_flags() & {"avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16"})
    if device.startswith("cuda") and torch.cuda.is_available():
        parts.append(torch.cuda.get_device_name(torch.device(device)))
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize(torch.device(device))


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def _cache_dir() -> Path:
    root = os.environ.get("INFERTUNE_CACHE") or Path.home() / ".cache/infertune"
    return Path(root) / "precision"
