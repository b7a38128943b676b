"""SGLang's server: argv only here (it needs a GPU); the operator deploys what this produces."""

from __future__ import annotations

from infertune.tuner.candidate import Candidate
from infertune.tuner.engines.base import (
    Capabilities,
    EngineAdapter,
    flag,
    precision_flags,
)
from infertune.tuner.hardware import Hardware

_DTYPE = {"bf16": "bfloat16", "fp16": "float16"}
_QUANT = {"fp8": "fp8", "int8": "w8a8_int8", "int4": "awq"}


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

    def missing(self) -> str | None:
        import importlib.util

        return None if importlib.util.find_spec("sglang") else "sglang is not installed"

    def program(self) -> list[str]:
        return ["python3", "-m", "sglang.launch_server"]

    def server_flags(
        self, model_path: str, host: str, port: int, *, served_model_name: str | None = None
    ) -> list[str]:
        argv = ["--model-path", model_path]
        if served_model_name:
            argv += ["--served-model-name", served_model_name]
        return [*argv, "--host", host, "--port", str(port)]

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
