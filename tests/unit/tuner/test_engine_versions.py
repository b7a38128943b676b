"""Every engine's argv, for every knob value, is accepted by the recorded options of two versions.

tests/data/engine_help/<engine>-<version>.json come from each version's real argument parser
(scripts/record_engine_help.py): vLLM 0.10.2 (--cuda-graph-sizes) and 0.32.0
(--cudagraph-capture-sizes), SGLang 0.4.10.post2 (--cuda-graph-max-bs) and 0.5.23
(--cuda-graph-max-bs-decode). An argparse built from those options parses each argv.
"""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path

import pytest

from infertune.tuner.candidate import Candidate
from infertune.tuner.engines import AdapterError, EngineOptions, get_adapter
from infertune.tuner.hardware import Hardware

DATA = Path(__file__).parents[2] / "data/engine_help"
VERSIONS = ["vllm-0.10.2", "vllm-0.32.0", "sglang-0.4.10.post2", "sglang-0.5.23"]
GPU = Hardware(kind="gpu", product="NVIDIA H100 80GB HBM3", count=2, memory_bytes=80 << 30)


def recorded(name: str) -> dict:
    return json.loads((DATA / f"{name}.json").read_text())


def parser_of(raw: dict) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(add_help=False, exit_on_error=False)
    for name, spec in raw["options"].items():
        if not spec["takes_value"]:
            parser.add_argument(name, action="store_true")
            continue
        nargs = spec["nargs"] if spec["nargs"] in ("+", "*", "?") else None
        parser.add_argument(name, nargs=nargs, choices=spec["choices"])
    return parser


def every_config(engine: str) -> list[Candidate]:
    values = {
        "quantization": ["bf16", "fp16", "fp8"],
        "cuda_graph": [True, False],
        "tensor_parallel_size": [1, 2],
        "kv_cache_dtype": ["auto", "fp8"],
        "gpu_memory_fraction": [0.85, 0.9],
        "prefix_caching": [True, False],
        "chunked_prefill": [True, False],
        "max_model_len": [0, 4096],
    }
    out = []
    for combo in itertools.product(*values.values()):
        c = Candidate(engine, "bf16", 16, 4096, 16, True).replace(
            **dict(zip(values, combo, strict=True))
        )
        out.append(c)
    return out


@pytest.mark.parametrize("name", VERSIONS)
def test_every_argv_parses_with_the_versions_own_options(name: str) -> None:
    raw = recorded(name)
    options = EngineOptions.from_probe(raw)
    adapter = get_adapter(raw["engine"], options=options)
    parser = parser_of(raw)
    configs = every_config(raw["engine"])
    for config in configs:
        try:
            argv = adapter.flags(config, "/models/m", "0.0.0.0", 8000, served_model_name="m")
        except AdapterError:
            continue  # refused before any trial (validate), never rendered
        _, unknown = parser.parse_known_args(argv)
        assert not unknown, (name, config.label(), unknown)
    assert len(configs) == 384


@pytest.mark.parametrize(
    ("name", "graph_flag"),
    [
        ("vllm-0.10.2", "--cuda-graph-sizes"),
        ("vllm-0.32.0", "--cudagraph-capture-sizes"),
        ("sglang-0.4.10.post2", "--cuda-graph-max-bs"),
        ("sglang-0.5.23", "--cuda-graph-max-bs-decode"),
    ],
)
def test_cuda_graph_flag_follows_the_version(name: str, graph_flag: str) -> None:
    raw = recorded(name)
    adapter = get_adapter(raw["engine"], options=EngineOptions.from_probe(raw))
    argv = adapter.flags(Candidate(raw["engine"], "bf16", 16, 4096, 16, True), "/m", "h", 1)
    assert graph_flag in argv
    # The operator renders the same argv from the summary's record of the version.
    wire = adapter.options_wire()
    assert wire is not None and wire["version"] == raw["version"]
    again = get_adapter(raw["engine"], options=EngineOptions.from_wire(raw["engine"], wire))
    config = Candidate(raw["engine"], "bf16", 16, 4096, 16, True)
    assert again.flags(config, "/m", "h", 1) == adapter.flags(config, "/m", "h", 1)


@pytest.mark.parametrize("name", VERSIONS)
def test_version_dependent_defaults_are_pinned(name: str) -> None:
    raw = recorded(name)
    adapter = get_adapter(raw["engine"], options=EngineOptions.from_probe(raw))
    argv = adapter.flags(Candidate(raw["engine"], "bf16", 16, 4096, 16, False), "/m", "h", 1)
    memory = "--gpu-memory-utilization" if raw["engine"] == "vllm" else "--mem-fraction-static"
    for pinned in (memory, "--kv-cache-dtype"):
        assert pinned in argv
    if raw["engine"] == "vllm":
        assert "--enable-prefix-caching" in argv and "--enable-chunked-prefill" in argv


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_int8_int4_are_pruned_with_what_to_provide(engine: str) -> None:
    caps = get_adapter(engine).capabilities(GPU)
    for q in ("int8", "int4"):
        assert q not in caps.quantizations
        assert "pre-quantized" in caps.refused["quantization"][q]
    with pytest.raises(AdapterError, match="int4"):
        get_adapter(engine).flags(Candidate(engine, "int4", 16, 4096, 16, False), "/m", "h", 1)


def test_vllm_without_chunked_prefill_needs_a_batch_of_the_whole_context() -> None:
    config = Candidate("vllm", "bf16", 16, 2048, 16, False, chunked_prefill=False)
    with pytest.raises(AdapterError, match="maxModelLen"):
        get_adapter("vllm").flags(config.replace(max_model_len=4096), "/m", "h", 1)
