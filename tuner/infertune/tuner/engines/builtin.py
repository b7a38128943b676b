"""The built-in PyTorch engine (`infertune serve`): every knob, every precision, CPU or GPU."""

from __future__ import annotations

from infertune.tuner.api.base import ENGINE_QUANTIZATIONS
from infertune.tuner.candidate import Candidate
from infertune.tuner.engines.base import Capabilities, EngineAdapter
from infertune.tuner.hardware import Hardware


class BuiltinAdapter(EngineAdapter):
    name = "builtin"
    health_path = "/health"
    metrics = {
        # The built-in engine exports vLLM's series names so one live check reads both.
        "ttft": "vllm:time_to_first_token_seconds",
        "itl": "vllm:inter_token_latency_seconds",
        "e2e": "vllm:e2e_request_latency_seconds",
        "running": "vllm:num_requests_running",
        "waiting": "vllm:num_requests_waiting",
    }

    def capabilities(self, hardware: Hardware) -> Capabilities:
        quants = set(ENGINE_QUANTIZATIONS["builtin"])
        notes: list[str] = []
        if not hardware.is_gpu:
            notes.append("cuda_graph needs a GPU: only cuda_graph=false on CPU")
        return Capabilities(
            quantizations=frozenset(quants),
            kv_block_sizes=None,
            cuda_graph=frozenset({True, False}) if hardware.is_gpu else frozenset({False}),
            notes=tuple(notes),
        )

    def program(self) -> list[str]:
        return ["infertune"]

    def flags(
        self,
        config: Candidate,
        model_path: str,
        host: str,
        port: int,
        *,
        served_model_name: str | None = None,
    ) -> list[str]:
        argv = ["serve", "--model", model_path]
        if served_model_name:
            argv += ["--served-model-name", served_model_name]
        argv += [
            "--host",
            host,
            "--port",
            str(port),
            "--quantization",
            config.quantization,
            "--max-num-seqs",
            str(config.max_num_seqs),
            "--max-num-batched-tokens",
            str(config.max_num_batched_tokens),
            "--kv-block-size",
            str(config.kv_block_size),
            "--cuda-graph" if config.cuda_graph else "--no-cuda-graph",
        ]
        return argv
