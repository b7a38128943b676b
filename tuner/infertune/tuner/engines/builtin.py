"""The built-in PyTorch engine (`infertune serve`): every knob, every precision, CPU or GPU."""

from __future__ import annotations

from infertune.tuner.api.base import ENGINE_QUANTIZATIONS
from infertune.tuner.engines.base import Capabilities, EngineAdapter, flag, switch
from infertune.tuner.hardware import Hardware


class BuiltinAdapter(EngineAdapter):
    name = "builtin"
    health_path = "/health"

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

    def server_flags(
        self, model_path: str, host: str, port: int, *, served_model_name: str | None = None
    ) -> list[str]:
        argv = ["serve", "--model", model_path]
        if served_model_name:
            argv += ["--served-model-name", served_model_name]
        return [*argv, "--host", host, "--port", str(port)]

    knob_flags = {
        "quantization": flag("--quantization"),
        "max_num_seqs": flag("--max-num-seqs"),
        "max_num_batched_tokens": flag("--max-num-batched-tokens"),
        "kv_block_size": flag("--kv-block-size"),
        "cuda_graph": switch("--cuda-graph", "--no-cuda-graph"),
    }
