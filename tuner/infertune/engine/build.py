"""Building the model runner from a :class:`~infertune.engine.serve_config.ServeConfig`: the
device, the torch threads and the KV-cache size. It runs in the engine-core process (it imports
torch, lazily, so that importing this module stays cheap); the server process never calls it.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

from infertune.engine.serve_config import (
    DEFAULT_GPU_UTILIZATION,
    DEFAULT_KV_CACHE_BYTES,
    ServeConfig,
    gpu_utilization_on_cpu,
)

if TYPE_CHECKING:
    from infertune.engine.runner import ModelRunner

__all__ = ["build_runner", "default_threads", "kv_cache_bytes", "resolve_device", "usable_cores"]

log = logging.getLogger("infertune.engine")


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def default_threads() -> int:
    """torch threads when ``--threads`` is not given: the cores this process may use, minus one.

    The spare core runs the event loop (HTTP, detokenisation) and usually the clients. With
    every core in OpenMP, the engine's spinning threads and the server fight over the same
    cores: measured on 2 cores under load, 2 threads ran the decode loop ~20x slower than 1.
    A decode step is some 200 small ops, each a barrier for every thread; a prefill step is
    the same ops on hundreds of rows, so it gets every core (``--prefill-threads``).
    """
    return max(1, usable_cores() - 1)


def resolve_device(name: str) -> str:
    import torch

    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return name


def kv_cache_bytes(config: ServeConfig, model_dir: Path, device: str) -> int:
    """Bytes for the KV cache from --kv-cache-memory or --gpu-memory-utilization."""
    if config.kv_cache_memory is not None:
        return int(config.kv_cache_memory)
    utilization = config.gpu_memory_utilization
    if utilization is None:
        if not device.startswith("cuda"):
            return DEFAULT_KV_CACHE_BYTES
        utilization = DEFAULT_GPU_UTILIZATION
    if not device.startswith("cuda"):
        raise SystemExit(gpu_utilization_on_cpu(device))
    import torch

    from infertune.engine.config import LlamaConfig, kv_bytes_per_token, weight_bytes

    cfg = LlamaConfig.from_dir(model_dir)
    free, total = torch.cuda.mem_get_info(torch.device(device))
    weights = weight_bytes(cfg, config.quantization)
    # Activations and allocator slack for one max_num_batched_tokens step (generous).
    reserve = 256 * 2**20 + 64 * config.max_num_batched_tokens * 2**10
    budget = int(utilization * total) - (total - free) - weights - reserve
    if budget <= 0:
        raise SystemExit(
            f"--gpu-memory-utilization {utilization} leaves no room for a KV "
            f"cache ({(total - free) / 2**30:.1f} GiB in use, weights {weights / 2**30:.2f} GiB)"
        )
    # More blocks than every running sequence at full context can use is wasted memory (and a
    # long free list); fp32 bytes per token make this an upper bound for every precision.
    useful = config.max_num_seqs * config.context_length(cfg) * kv_bytes_per_token(cfg, "fp32")
    return int(min(budget, useful))


def build_runner(config: ServeConfig, model_dir: Path) -> ModelRunner:
    """The :class:`ModelRunner` for ``config``; runs in the engine-core process."""
    import torch

    from infertune.engine.runner import ModelRunner

    started = time.perf_counter()
    decode_threads = config.threads or default_threads()
    torch.set_num_threads(decode_threads)
    device = resolve_device(config.device)
    if config.quantization == "auto":  # measured at the decode thread count it will run with
        from infertune.engine.precision import fastest

        config = dataclasses.replace(config, quantization=fastest(device))
        log.info("quantization auto: %s is the faster here", config.quantization)
    if config.quantization in ("fp32", "bf16") and device == "cpu":
        from infertune.engine.kernels import describe

        log.info("%s linear layers: %s", config.quantization, describe())
    runner = ModelRunner(
        model_dir,
        quantization=config.quantization,
        kv_block_size=config.kv_block_size,
        kv_cache_bytes=kv_cache_bytes(config, model_dir, device),
        device=device,
        cuda_graph=config.cuda_graph,
        max_num_seqs=config.max_num_seqs,
        seed=config.seed,
        int4_group_size=config.int4_group_size,
        threads=(decode_threads, config.prefill_threads or usable_cores()),
    )
    log.info(
        "engine core: model and %d-block KV cache built in %.2f s",
        runner.num_kv_blocks,
        time.perf_counter() - started,
    )
    return runner
