"""SGLang's server: argv only here (it needs a GPU); the operator deploys what this produces.

SGLang runs in its own interpreter (`python -m sglang.launch_server`): ``$INFERTUNE_SGLANG_PYTHON``,
else ``$INFERTUNE_SGLANG_VENV/bin/python``, else the SGLang image's ``python3``. The tuner-full
image sets the first to /opt/engines/sglang/bin/python.

Names read in sglang 0.5.23's own source (the wheel's sglang/srt/...):
* flags are its ServerArgs fields as ``--field-name`` (arg_groups/arg_utils.py
  ``_field_to_cli_name``): ``enable_metrics`` (arg_groups/fields/observability.py, default False:
  without it the server exports no Prometheus metrics at all), ``page_size`` and
  ``chunked_prefill_size`` (arg_groups/fields/schedule.py);
* arg_groups/validation_hook.py asserts ``chunked_prefill_size % page_size == 0`` when chunked
  prefill is on (size > 0): such a server dies at start, so :meth:`SglangAdapter.validate` refuses
  the combination before any trial starts one.

Flags per version come from SGLang's own parser (engines/options.py; recorded for 0.4.10.post2 and
0.5.23 in tests/data/engine_help): 0.5 split ``--cuda-graph-max-bs`` into
``--cuda-graph-max-bs-decode`` / ``-prefill``. Chunked prefill off is ``--chunked-prefill-size -1``
("-1 means disabling chunked prefill", its help); prefix caching off is ``--disable-radix-cache``
(on is the default and has no flag to pin). fp8 KV is ``--kv-cache-dtype fp8_e4m3``.
"""

from __future__ import annotations

from typing import Any

from infertune.tuner.candidate import Candidate
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
from infertune.tuner.engines.interpreter import configured_python, has_module
from infertune.tuner.engines.options import EngineOptions, learn
from infertune.tuner.hardware import Hardware

_DTYPE = {"bf16": "bfloat16", "fp16": "float16"}
# fp8 is SGLang's one online quantization of a bf16/fp16 checkpoint; int8/int4 are served from the
# spec's pre-quantized checkpoint for them (model.variants, with its method), else pruned.
_QUANT = {"fp8": "fp8"}
_KV_DTYPE = {"auto": "auto", "fp8": "fp8_e4m3"}
NEW_GRAPH, OLD_GRAPH = "--cuda-graph-max-bs-decode", "--cuda-graph-max-bs"
# The lmsysorg/sglang image's version, assumed when no SGLang is at hand.
DEFAULT_OPTIONS = EngineOptions("sglang", "0.5.23", {NEW_GRAPH: None}, complete=False)
PYTHON_ENV = "INFERTUNE_SGLANG_PYTHON"
VENV_ENV = "INFERTUNE_SGLANG_VENV"
MODULE = "sglang.launch_server"


def _graph_flags(on: bool, config: Candidate, options: EngineOptions) -> list[str]:
    if not on:
        return ["--disable-cuda-graph"]
    name = NEW_GRAPH if options.has(NEW_GRAPH) or not options.has(OLD_GRAPH) else OLD_GRAPH
    return [name, str(config.max_num_seqs)]


def _chunk_flags(on: bool, config: Candidate) -> list[str]:
    return ["--chunked-prefill-size", str(config.max_num_batched_tokens) if on else "-1"]


def _refused(options: EngineOptions | None) -> dict[str, dict[Any, str]]:
    why: dict[str, dict[Any, str]] = {"quantization": {}, "kv_cache_dtype": {}}
    if options is not None and not options.allows("--kv-cache-dtype", _KV_DTYPE["fp8"]):
        why["kv_cache_dtype"]["fp8"] = f"SGLang {options.version} has no fp8_e4m3 KV cache"
    return why


class SglangAdapter(OwnInterpreterAdapter):
    name = "sglang"
    health_path = "/health"

    def capabilities(self, hardware: Hardware) -> Capabilities:
        variants, why_not = variant_quantizations(self.name, self.quant_methods)
        refused = _refused(self.options)
        refused["quantization"].update(why_not)
        return Capabilities(
            quantizations=frozenset({"bf16", "fp16", "fp8"}) | variants,
            kv_block_sizes=frozenset({1, 16, 32, 64}),
            cuda_graph=frozenset({True, False}) if hardware.is_gpu else frozenset({False}),
            runnable=hardware.is_gpu,
            why_not_runnable=None if hardware.is_gpu else "SGLang needs a CUDA GPU",
            refused=refused,
        )

    versioned_flags = (NEW_GRAPH, OLD_GRAPH)
    default_options = DEFAULT_OPTIONS

    def learn_options(self) -> EngineOptions | None:
        return learn(self.interpreter(), "sglang") if self.missing() is None else None

    def interpreter(self) -> str:
        return self.python or configured_python(PYTHON_ENV, VENV_ENV)

    def missing(self) -> str | None:
        python = self.interpreter()
        if has_module(python, "sglang"):
            return None
        return (
            f"SGLang is not installed for {python!r}: set {PYTHON_ENV} to an interpreter that has "
            f"it (or {VENV_ENV} to its venv)"
        )

    def program(self) -> list[str]:
        return [self.interpreter(), "-m", MODULE]

    def validate(self, config: Candidate) -> None:
        chunk, page = config.max_num_batched_tokens, config.kv_block_size
        if config["chunked_prefill"] and chunk % page:
            raise AdapterError(
                f"SGLang needs the chunked-prefill size (maxNumBatchedTokens {chunk}) to be a "
                f"multiple of the page size (kvBlockSize {page})"
            )

    def server_flags(
        self, model_path: str, host: str, port: int, *, served_model_name: str | None = None
    ) -> list[str]:
        argv = ["--model-path", model_path]
        if served_model_name:
            argv += ["--served-model-name", served_model_name]
        # --enable-metrics: the live check reads sglang:* histograms, exported only with it.
        return [*argv, "--host", host, "--port", str(port), "--enable-metrics"]

    knob_flags = {
        "quantization": precision_flags(
            "SGLang",
            {q: ["--dtype", dtype] for q, dtype in _DTYPE.items()},
            {q: ["--quantization", method] for q, method in _QUANT.items()},
        ),
        "max_num_seqs": flag("--max-running-requests"),
        "max_num_batched_tokens": flag("--max-prefill-tokens"),
        "kv_block_size": flag("--page-size"),
        "cuda_graph": Versioned(_graph_flags),
        "tensor_parallel_size": flag("--tp-size"),
        "kv_cache_dtype": lambda dtype, _config: ["--kv-cache-dtype", _KV_DTYPE[dtype]],
        "gpu_memory_fraction": flag("--mem-fraction-static"),
        "prefix_caching": switch(None, "--disable-radix-cache"),
        "chunked_prefill": _chunk_flags,
        "max_model_len": lambda n, _config: ["--context-length", str(n)] if n else [],
    }
