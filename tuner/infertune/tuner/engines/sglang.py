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
"""

from __future__ import annotations

from infertune.tuner.candidate import Candidate
from infertune.tuner.engines.base import (
    AdapterError,
    Capabilities,
    EngineAdapter,
    flag,
    precision_flags,
)
from infertune.tuner.engines.interpreter import configured_python, has_module
from infertune.tuner.hardware import Hardware

_DTYPE = {"bf16": "bfloat16", "fp16": "float16"}
_QUANT = {"fp8": "fp8", "int8": "w8a8_int8", "int4": "awq"}
PYTHON_ENV = "INFERTUNE_SGLANG_PYTHON"
VENV_ENV = "INFERTUNE_SGLANG_VENV"
MODULE = "sglang.launch_server"


def _graph_flags(on: bool, config: Candidate) -> list[str]:
    return ["--cuda-graph-max-bs", str(config.max_num_seqs)] if on else ["--disable-cuda-graph"]


class SglangAdapter(EngineAdapter):
    name = "sglang"
    health_path = "/health"

    def capabilities(self, hardware: Hardware) -> Capabilities:
        return Capabilities(
            quantizations=frozenset({"bf16", "fp16", "fp8", "int8", "int4"}),
            kv_block_sizes=frozenset({1, 16, 32, 64}),
            cuda_graph=frozenset({True, False}) if hardware.is_gpu else frozenset({False}),
            runnable=hardware.is_gpu,
            why_not_runnable=None if hardware.is_gpu else "SGLang needs a CUDA GPU",
        )

    def __init__(self, python: str | None = None) -> None:
        self.python = python

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
        if chunk > 0 and chunk % page:
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
        "max_num_batched_tokens": flag("--chunked-prefill-size"),
        "kv_block_size": flag("--page-size"),
        "cuda_graph": _graph_flags,
    }
