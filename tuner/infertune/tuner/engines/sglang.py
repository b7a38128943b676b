"""SGLang's server: argv only here (it needs a GPU); the operator deploys what this produces."""

from __future__ import annotations

from infertune.tuner.candidate import Candidate
from infertune.tuner.engines.base import AdapterError, Capabilities, EngineAdapter
from infertune.tuner.hardware import Hardware

_DTYPE = {"bf16": "bfloat16", "fp16": "float16"}
_QUANT = {"fp8": "fp8", "int8": "w8a8_int8", "int4": "awq"}


class SglangAdapter(EngineAdapter):
    name = "sglang"
    health_path = "/health"
    metrics = {
        "ttft": "sglang:time_to_first_token_seconds",
        "itl": "sglang:inter_token_latency_seconds",
        "e2e": "sglang:e2e_request_latency_seconds",
        "running": "sglang:num_running_reqs",
        "waiting": "sglang:num_queue_reqs",
    }

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

    def flags(
        self,
        config: Candidate,
        model_path: str,
        host: str,
        port: int,
        *,
        served_model_name: str | None = None,
    ) -> list[str]:
        argv = ["--model-path", model_path]
        if served_model_name:
            argv += ["--served-model-name", served_model_name]
        argv += ["--host", host, "--port", str(port)]
        if config.quantization in _DTYPE:
            argv += ["--dtype", _DTYPE[config.quantization]]
        elif config.quantization in _QUANT:
            argv += ["--quantization", _QUANT[config.quantization]]
        else:
            raise AdapterError(
                f"quantization {config.quantization!r} has no SGLang flag; allowed values: "
                f"{sorted([*_DTYPE, *_QUANT])}"
            )
        argv += [
            "--max-running-requests",
            str(config.max_num_seqs),
            "--chunked-prefill-size",
            str(config.max_num_batched_tokens),
            "--page-size",
            str(config.kv_block_size),
        ]
        if not config.cuda_graph:
            argv.append("--disable-cuda-graph")
        else:
            argv += ["--cuda-graph-max-bs", str(config.max_num_seqs)]
        return argv
