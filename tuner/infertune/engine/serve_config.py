"""``ServeConfig``: every ``infertune serve`` setting in one typed, picklable value.

``cli.py`` parses the flags into one; the server process reads it, and hands it (with the
checkpoint directory it resolved) down the socket to the engine-core process, which builds its
runner and engine from it (:mod:`infertune.engine.build`). It is plain data and imports nothing
heavy, so both processes can load it at start-up for free.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from infertune.engine.config import LlamaConfig

__all__ = [
    "DEFAULT_GPU_UTILIZATION",
    "DEFAULT_KV_CACHE_BYTES",
    "MODEL_SIZES",
    "QUANTIZATIONS",
    "ServeConfig",
    "gpu_utilization_on_cpu",
]

# "auto": the faster of fp32 and bf16 on this host, measured once and cached (precision.py).
QUANTIZATIONS = ("auto", "fp32", "bf16", "fp16", "int8", "int4", "fp8")
MODEL_SIZES = ("tiny", "small", "medium")
DEFAULT_KV_CACHE_BYTES = 256 * 2**20
DEFAULT_GPU_UTILIZATION = 0.9


@dataclass(frozen=True)
class ServeConfig:
    """The settings of one ``infertune serve``; field names are the flags' (``--max-num-seqs``
    is ``max_num_seqs``), defaults are the flags' defaults."""

    model: str  # a checkpoint directory or a generated size, as given
    served_model_name: str | None = None
    quantization: str = "auto"  # build_runner resolves it (precision.fastest)
    int4_group_size: int = 64
    max_num_seqs: int = 32
    max_num_batched_tokens: int = 512
    kv_block_size: int = 16
    kv_cache_memory: int | None = None  # bytes; None: see build.kv_cache_bytes
    gpu_memory_utilization: float | None = None
    cuda_graph: bool = False
    device: str = "auto"
    max_model_len: int | None = None  # None: the model's
    max_waiting: int = 512
    threads: int | None = None  # None: build.default_threads()
    prefill_threads: int | None = None  # None: every usable core
    seed: int = 0
    host: str = "127.0.0.1"
    port: int = 8000
    log_level: str = "WARNING"

    def context_length(self, model: LlamaConfig) -> int:
        """``--max-model-len``, capped at (and by default) the model's own context."""
        limit = model.max_position_embeddings
        return min(self.max_model_len or limit, limit)

    def engine_kwargs(self, model: LlamaConfig) -> dict[str, Any]:
        """The :class:`~infertune.engine.engine.Engine` settings for this config and ``model``
        (the server's request validation uses the same ones)."""
        return {
            "max_num_seqs": self.max_num_seqs,
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "max_model_len": self.context_length(model),
            "eos_token_ids": model.eos_token_ids,
            "max_waiting": self.max_waiting,
        }


def gpu_utilization_on_cpu(device: str) -> str:
    return (
        "--gpu-memory-utilization applies to CUDA devices only; on "
        f"device={device!r} size the cache with --kv-cache-memory (e.g. 512MiB)"
    )
